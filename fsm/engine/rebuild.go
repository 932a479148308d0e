package engine

// Rebuild is how a node starts (latest snapshot, then the tail) and how
// sbxctl replay answers "what did the state look like at sequence N".
//
// Contract: Rebuild(l, {Until: n}) returns exactly the state obtained by
// applying events 1..n to fsm.New() in order, whether it started from a
// snapshot or not; a snapshot that fails to decode is skipped for a full
// replay when the log still holds every event, and is an error otherwise.
// SaveSnapshot stores fsm.Encode(state) as the state after seq.

import (
	"errors"
	"fmt"
	"time"

	"github.com/sbxlog/sbxlog/eventlog"
	"github.com/sbxlog/sbxlog/eventlog/event"
	"github.com/sbxlog/sbxlog/fsm"
)

// RebuildLog is the part of *eventlog.Log Rebuild uses.
type RebuildLog interface {
	FirstSeq() uint64
	LastSeq() uint64
	Iterate(from, until uint64, fn func(*event.Event) error) error
	LatestSnapshot() (uint64, []byte, error)
	SaveSnapshot(seq uint64, data []byte) error
}

var _ RebuildLog = (*eventlog.Log)(nil)

// Errors.
var (
	// ErrBeyondEnd: Until is past the log's last sequence.
	ErrBeyondEnd = errors.New("engine: rebuild: sequence beyond the end of the log")
	// ErrUnreachable: the state at Until needs events the log no longer
	// holds (truncated) and no usable snapshot covers them.
	ErrUnreachable = errors.New("engine: rebuild: state not reachable from the retained log")
)

// RebuildOptions control Rebuild.
type RebuildOptions struct {
	// Until is the last sequence to apply; 0 means the log's end.
	Until uint64
	// NoSnapshot forces a full replay from the first event.
	NoSnapshot bool
	// TrustSnapshot decodes the snapshot without fsm's full invariant check
	// (fsm.DecodeOptions.SkipCheck): the daemon's restart path, where the
	// log's checksum covers the snapshot's bytes and start-up time counts.
	TrustSnapshot bool
	// Now is the clock used to time the replay (default time.Now); only the
	// Result's Elapsed depends on it.
	Now func() time.Time
}

// Rebuilt is a rebuilt state and how it was obtained.
type Rebuilt struct {
	State *fsm.State
	// Seq is the last sequence folded into State (0: none).
	Seq uint64
	// SnapshotSeq is the snapshot Rebuild started from (0: a full replay).
	SnapshotSeq uint64
	// SnapshotErr says why a stored snapshot was not used, if one was
	// skipped.
	SnapshotErr error
	// Events is how many events were applied after the snapshot.
	Events  int
	Elapsed time.Duration
}

// EventsPerSec is the replay rate (0 when nothing was applied).
func (r *Rebuilt) EventsPerSec() float64 {
	if r.Events == 0 || r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Events) / r.Elapsed.Seconds()
}

// Rebuild returns the state after applying the log's events up to
// opt.Until, starting from the latest snapshot at or before it when there is
// one.
func Rebuild(l RebuildLog, opt RebuildOptions) (*Rebuilt, error) {
	now := opt.Now
	if now == nil {
		now = time.Now
	}
	start := now()
	last, first := l.LastSeq(), l.FirstSeq()
	until := opt.Until
	if until == 0 {
		until = last
	}
	if until > last {
		return nil, fmt.Errorf("%w: --until %d, the log ends at %d", ErrBeyondEnd, until, last)
	}
	res := &Rebuilt{State: fsm.New()}
	if !opt.NoSnapshot {
		seq, data, err := l.LatestSnapshot()
		switch {
		case errors.Is(err, eventlog.ErrNoSnapshot):
		case err != nil:
			return nil, fmt.Errorf("engine: rebuild: load snapshot: %w", err)
		case seq > until:
			res.SnapshotErr = fmt.Errorf("snapshot at %d is after %d", seq, until)
		default:
			s, derr := fsm.DecodeWith(data, fsm.DecodeOptions{SkipCheck: opt.TrustSnapshot})
			if derr != nil {
				res.SnapshotErr = fmt.Errorf("snapshot at %d: %w", seq, derr)
				break
			}
			res.State, res.Seq, res.SnapshotSeq = s, seq, seq
		}
	}
	if res.SnapshotSeq == 0 && first > 1 && until > 0 {
		return nil, fmt.Errorf("%w: events before %d were truncated and no usable snapshot covers %d (%v)", ErrUnreachable, first, until, res.SnapshotErr)
	}
	if res.Seq < until {
		err := l.Iterate(res.Seq+1, until, func(ev *event.Event) error {
			if ev.Seq != res.Seq+1 {
				return fmt.Errorf("engine: rebuild: expected seq %d, log gave %d", res.Seq+1, ev.Seq)
			}
			if err := fsm.Apply(res.State, ev); err != nil {
				return err
			}
			res.Seq = ev.Seq
			res.Events++
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("engine: rebuild: at seq %d: %w", res.Seq+1, err)
		}
	}
	if res.Seq != until {
		return nil, fmt.Errorf("engine: rebuild: log ended at %d, expected %d", res.Seq, until)
	}
	res.Elapsed = now().Sub(start)
	return res, nil
}

// SaveSnapshot stores s as the state after seq. The caller guarantees that s is
// exactly that state (everything up to seq applied, nothing after).
func SaveSnapshot(l RebuildLog, s *fsm.State, seq uint64) error {
	if err := l.SaveSnapshot(seq, fsm.Encode(s)); err != nil {
		return fmt.Errorf("engine: rebuild: save snapshot at %d: %w", seq, err)
	}
	return nil
}
