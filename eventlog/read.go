package eventlog

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/cockroachdb/pebble/v2"

	"github.com/sbxlog/sbxlog/eventlog/event"
)

// FirstSeq returns the oldest retained sequence: 1 unless TruncatePrefix
// removed a prefix. FirstSeq > LastSeq means no event is retained.
func (l *Log) FirstSeq() uint64 { return l.first.Load() }

// LastSeq returns the newest durable sequence, 0 when the log is empty.
func (l *Log) LastSeq() uint64 { return l.durable.Load() }

// WaitDurable returns once every event up to seq is durable, at once when
// it already is. It returns the log's failure (ErrFailed) when a WAL sync
// failed first (what was applied after it will never be durable),
// ErrClosed when the log closes first, or ctx's error. An answer that
// reports a state (an idempotent no-op: "already released") waits here
// for the sequence that state reflects, so it never acknowledges what a
// crash could still take back.
func (l *Log) WaitDurable(ctx context.Context, seq uint64) error {
	for {
		// The wake-up channel before the watermark, as Subscription.Next.
		wake := *l.notify.Load()
		if l.durable.Load() >= seq {
			return nil
		}
		if l.poisoned.Load() {
			return l.failure()
		}
		select {
		case <-wake:
		case <-ctx.Done():
			return ctx.Err()
		case <-l.closeCh:
			return ErrClosed
		}
	}
}

// Read returns up to limit durable events starting at from (0 means
// FirstSeq); limit <= 0 means up to LastSeq. The events are copies the caller
// owns. It fails with ErrCompacted if from < FirstSeq.
func (l *Log) Read(from uint64, limit int) ([]event.Event, error) {
	if !l.gate.enter() {
		return nil, ErrClosed
	}
	defer l.gate.exit()
	from, err := l.start(from)
	if err != nil {
		return nil, err
	}
	var until uint64
	if limit > 0 {
		until = from + uint64(limit) - 1
	}
	return l.readRange(from, until)
}

// Iterate calls fn for each durable event in from..until (0: up to LastSeq at
// the call), in order, stopping at fn's first error, which it returns. The
// event and its Payload are only valid during the call: fn copies what it
// keeps. Iterate streams from Pebble, so it suits a full replay.
func (l *Log) Iterate(from, until uint64, fn func(*event.Event) error) error {
	if !l.gate.enter() {
		return ErrClosed
	}
	defer l.gate.exit()
	from, err := l.start(from)
	if err != nil {
		return err
	}
	return l.iterate(from, until, fn)
}

func (l *Log) start(from uint64) (uint64, error) {
	first := l.first.Load()
	if from == 0 {
		return first, nil
	}
	if from < first {
		return 0, fmt.Errorf("%w: seq %d, first retained is %d", ErrCompacted, from, first)
	}
	return from, nil
}

// readRange returns copies of events from..until (0: up to LastSeq). The
// caller holds the gate.
func (l *Log) readRange(from, until uint64) ([]event.Event, error) {
	var out []event.Event
	if last := l.durable.Load(); until == 0 || until > last {
		until = last
	}
	if until >= from {
		out = make([]event.Event, 0, min(until-from+1, 4096))
	}
	err := l.iterate(from, until, func(e *event.Event) error {
		ev := *e
		ev.Payload = append([]byte(nil), e.Payload...)
		out = append(out, ev)
		return nil
	})
	return out, err
}

// iterate is Iterate without the gate; it bounds the range by LastSeq so
// readers never see an applied but not yet durable batch.
func (l *Log) iterate(from, until uint64, fn func(*event.Event) error) error {
	if last := l.durable.Load(); until == 0 || until > last {
		until = last
	}
	if from > until {
		return nil
	}
	lo := appendSeqKey(make([]byte, 0, 9), prefixEvent, from)
	hi := appendSeqKey(make([]byte, 0, 9), prefixEvent, until+1)
	if until == ^uint64(0) {
		hi = []byte{prefixEvent + 1}
	}
	it, err := l.db.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		return fmt.Errorf("eventlog: iterate: %w", err)
	}
	expect := from
	// One Event for the whole scan (fn must not keep it): a fresh one per
	// record would be a heap allocation per event, as fn takes its address.
	ev := new(event.Event)
	for ok := it.First(); ok; ok = it.Next() {
		seq := binary.BigEndian.Uint64(it.Key()[1:])
		if seq != expect {
			_ = it.Close()
			return l.gapError(expect)
		}
		v, err := it.ValueAndErr()
		if err != nil {
			_ = it.Close()
			return fmt.Errorf("eventlog: read seq %d: %w", seq, err)
		}
		*ev, err = event.Decode(v)
		if err != nil {
			_ = it.Close()
			return &CorruptError{Seq: seq, Err: err}
		}
		if ev.Seq != seq {
			_ = it.Close()
			return &CorruptError{Seq: seq, Err: fmt.Errorf("record carries seq %d", ev.Seq)}
		}
		if err := fn(ev); err != nil {
			_ = it.Close()
			return err
		}
		expect++
	}
	if err := errors.Join(it.Error(), it.Close()); err != nil {
		return fmt.Errorf("eventlog: iterate: %w", err)
	}
	if expect <= until {
		return l.gapError(expect)
	}
	return nil
}

// gapError reports a missing sequence: compaction if TruncatePrefix removed
// it meanwhile, corruption otherwise.
func (l *Log) gapError(seq uint64) error {
	if first := l.first.Load(); seq < first {
		return fmt.Errorf("%w: seq %d, first retained is %d", ErrCompacted, seq, first)
	}
	return &CorruptError{Seq: seq, Err: errors.New("missing record")}
}
