package executors

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/rs/zerolog"

	"github.com/sbxlog/sbxlog/executors/guest/agent"
)

// SyncGuestClock sets the guest's wall clock to now (the host's time, read
// by the caller just before) through its agent's clock verb
// (agent.VerbClock) and returns how far the guest's clock was off
// (negative: behind). Every driver calls it after every boot, restore and
// resume, once the agent answers: a restored guest's clock resumes from the
// moment of its snapshot (a golden's clone from the golden's build, a wake
// from its hibernate), and a guest whose network is cut cannot ask NTP. The
// agent's channel is the one every restore already waits for, so this
// costs one round trip and no device.
//
// An agent that refuses the verb (one that predates it: an
// *agent.RemoteError) is logged as a warning and is no failure: the guest
// keeps the snapshot's clock, offset 0. Any other error (the agent gone
// mid-exchange, ctx ending) is returned. A correction of a second or more is
// logged at info, a smaller one at debug; who prefixes the messages (the
// driver's name), log carries the caller's fields (the run dir).
func SyncGuestClock(ctx context.Context, a *agent.Client, now time.Time, log zerolog.Logger, who string) (time.Duration, error) {
	set, err := a.SetClock(ctx, now)
	var re *agent.RemoteError
	if errors.As(err, &re) {
		log.Warn().Err(err).Msg(who + ": the guest agent cannot set its clock; it keeps the snapshot's")
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("setting the guest's clock: %w", err)
	}
	off := set.Offset()
	// A correction a person would notice is worth a line at info.
	ev := log.Debug()
	if off.Abs() >= time.Second {
		ev = log.Info()
	}
	ev.Stringer("guest_clock_was_off", off.Round(time.Millisecond)).Msg(who + ": guest clock set")
	return off, nil
}
