package agent

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"
)

// VerbClock reads or sets the guest's wall clock (CLOCK_REALTIME):
//
//	clock             -> clock <ns>   the guest's time, Unix nanoseconds
//	clock <ns>        -> clock <ns>   sets it to the host's time <ns>; answers the time it replaced
//
// The host sets it after every boot, restore and resume (executors/qemu,
// executors/chdriver; both through executors.SyncGuestClock):
// a restored guest's clock stands where it was when its snapshot was
// taken, and its kernel only catches up through the emulated RTC's drift,
// which TCG lets lag by minutes. The answer to a set is what the guest
// read just before it, so the host learns the offset it corrected.
const VerbClock = "clock"

// ClockSet is the answer to a set: the guest's time just before the set
// and the host's time it was given.
type ClockSet struct {
	Was time.Time // the guest's clock before the set
	To  time.Time // the host's time it was set to
}

// Offset is how far the guest's clock was from the host's (negative:
// behind).
func (c ClockSet) Offset() time.Duration { return c.Was.Sub(c.To) }

func (s *Server) handleClock(args []string) (string, error) {
	if s.Now == nil {
		return "", errUnknownVerb
	}
	was := s.Now()
	switch len(args) {
	case 0:
	case 1:
		if s.SetClock == nil {
			return "", errors.New("this guest cannot set its clock")
		}
		ns, err := strconv.ParseInt(args[0], 10, 64)
		if err != nil || ns <= 0 {
			return "", fmt.Errorf("bad time %q (Unix nanoseconds)", args[0])
		}
		if err := s.SetClock(time.Unix(0, ns)); err != nil {
			return "", err
		}
	default:
		return "", errors.New("usage: clock [<unix ns>]")
	}
	return VerbClock + " " + strconv.FormatInt(was.UnixNano(), 10), nil
}

// Clock returns the guest's wall clock.
func (c *Client) Clock(ctx context.Context) (time.Time, error) {
	return c.clock(ctx)
}

// SetClock sets the guest's wall clock to now (the host's time, read by
// the caller just before) and returns what it replaced.
func (c *Client) SetClock(ctx context.Context, now time.Time) (ClockSet, error) {
	was, err := c.clock(ctx, strconv.FormatInt(now.UnixNano(), 10))
	if err != nil {
		return ClockSet{}, err
	}
	return ClockSet{Was: was, To: now}, nil
}

func (c *Client) clock(ctx context.Context, args ...string) (time.Time, error) {
	resp, err := c.Do(ctx, VerbClock, args...)
	if err != nil {
		return time.Time{}, err
	}
	rest, err := expect(resp, VerbClock)
	if err != nil {
		return time.Time{}, err
	}
	ns, err := strconv.ParseInt(rest, 10, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("agent: bad clock response %q", resp)
	}
	return time.Unix(0, ns), nil
}
