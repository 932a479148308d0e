package eventlog

import (
	"context"
	"fmt"
	"math/bits"
	"sync"

	"github.com/sbxlog/sbxlog/eventlog/event"
)

// Subscription is a tail of the log from a starting sequence. Next delivers
// every durable event in order with no gap, including events appended while
// the subscriber catches up. A subscription is for one goroutine.
type Subscription struct {
	l    *Log
	next uint64
	buf  []event.Event
	pos  int

	done      chan struct{}
	closeOnce sync.Once
}

// subscriptionBatch is how many events one refill takes from the ring or
// Pebble: enough to amortise the lock or iterator, small enough to bound the
// copy a lagging subscriber holds.
const subscriptionBatch = 256

// Subscribe starts a subscription at from (0 means FirstSeq). from may be
// past LastSeq: the subscription then waits for those events. It fails with
// ErrCompacted if from < FirstSeq.
func (l *Log) Subscribe(from uint64) (*Subscription, error) {
	select {
	case <-l.closeCh:
		return nil, ErrClosed
	default:
	}
	from, err := l.start(from)
	if err != nil {
		return nil, err
	}
	return &Subscription{l: l, next: from, done: make(chan struct{})}, nil
}

// Next returns the next event, waiting for it to become durable. The event's
// Payload is shared and must not be modified. It returns ctx's error,
// ErrClosed after Close of the subscription or the log, or ErrCompacted if
// TruncatePrefix removed the next event before it was read.
func (s *Subscription) Next(ctx context.Context) (event.Event, error) {
	for {
		if s.pos < len(s.buf) {
			ev := s.buf[s.pos]
			s.buf[s.pos] = event.Event{}
			s.pos++
			return ev, nil
		}
		select {
		case <-s.done:
			return event.Event{}, ErrClosed
		case <-s.l.closeCh:
			return event.Event{}, ErrClosed
		default:
		}
		if first := s.l.first.Load(); s.next < first {
			return event.Event{}, fmt.Errorf("%w: subscription at seq %d, first retained is %d", ErrCompacted, s.next, first)
		}
		// Load the wake-up channel before the watermark: an advance after
		// this load closes the channel we hold, so no wake-up is lost.
		wake := *s.l.notify.Load()
		if durable := s.l.durable.Load(); s.next <= durable {
			if err := s.fill(durable); err != nil {
				return event.Event{}, err
			}
			continue
		}
		select {
		case <-wake:
		case <-ctx.Done():
			return event.Event{}, ctx.Err()
		case <-s.done:
			return event.Event{}, ErrClosed
		case <-s.l.closeCh:
			return event.Event{}, ErrClosed
		}
	}
}

// fill loads the next events up to durable: from the ring while the
// subscriber is within it, else from Pebble.
func (s *Subscription) fill(durable uint64) error {
	until := min(durable, s.next+subscriptionBatch-1)
	s.buf, s.pos = s.l.ring.read(s.buf[:0], s.next, until), 0
	if len(s.buf) == 0 {
		if !s.l.gate.enter() {
			return ErrClosed
		}
		evs, err := s.l.readRange(s.next, until)
		s.l.gate.exit()
		if err != nil {
			return err
		}
		s.buf = evs
	}
	s.next += uint64(len(s.buf))
	return nil
}

// Close ends the subscription; a Next in progress returns ErrClosed.
func (s *Subscription) Close() { s.closeOnce.Do(func() { close(s.done) }) }

// ring holds the most recent appended events for subscribers. Appends push
// under Log.mu in sequence order, before the events are durable; readers only
// ask for sequences at or below the durable watermark.
type ring struct {
	mu     sync.RWMutex
	buf    []event.Event
	mask   uint64
	lo, hi uint64 // holds sequences lo..hi-1
}

func newRing(size int) *ring {
	n := uint64(1) << bits.Len64(uint64(size-1)) // round up to a power of two
	return &ring{buf: make([]event.Event, n), mask: n - 1}
}

func (r *ring) reset(next uint64) {
	r.mu.Lock()
	r.lo, r.hi = next, next
	r.mu.Unlock()
}

func (r *ring) push(evs []event.Event) {
	r.mu.Lock()
	for i := range evs {
		r.buf[evs[i].Seq&r.mask] = evs[i]
	}
	r.hi = evs[len(evs)-1].Seq + 1
	if n := uint64(len(r.buf)); r.hi-r.lo > n {
		r.lo = r.hi - n
	}
	r.mu.Unlock()
}

// read appends events from..until to dst if the ring still holds from;
// otherwise it appends nothing.
func (r *ring) read(dst []event.Event, from, until uint64) []event.Event {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if from < r.lo || from >= r.hi {
		return dst
	}
	for seq := from; seq <= until && seq < r.hi; seq++ {
		dst = append(dst, r.buf[seq&r.mask])
	}
	return dst
}
