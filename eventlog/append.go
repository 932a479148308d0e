package eventlog

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"

	"github.com/cockroachdb/pebble/v2"

	"github.com/sbxlog/sbxlog/eventlog/event"
)

// AppendResult is what Append made durable, or found already durable.
type AppendResult struct {
	// Events are the stored events with Seq and Node assigned. Their Payloads
	// are shared with subscribers and must not be modified.
	Events []event.Event
	// Duplicate is set when the op id was already in the log: nothing was
	// written and Events are the ones stored by the original append.
	Duplicate bool
}

// op is one applied append on its way to durability.
type op struct {
	id          event.OpID
	first, last uint64
	events      []event.Event

	// Set under Log.pubMu.
	synced  bool
	syncErr error

	// err is set before done is closed; done closes once the op is published
	// (durable and visible to readers) or has failed.
	err       error
	done      chan struct{}
	published atomic.Bool
}

// Append makes evs durable as one op and returns them with their sequences.
// All events must share one non-zero op id. It returns only once the events
// are synced to disk; concurrent calls share fsyncs.
//
// Group commit and crash consistency: a sequence range is assigned and the
// batch enters Pebble's commit pipeline (ApplyNoSyncWait, which appends it to
// the WAL in call order) under l.mu, so WAL order equals sequence order. The
// fsync wait (SyncWait) happens outside the lock: while one fsync runs, later
// appends queue their batches behind it and Pebble's WAL writer covers them
// all with the next single fsync. Because the WAL is replayed as a prefix, a
// crash loses at most a suffix of batches whose Append never returned, so
// recovered sequences stay contiguous. An op is acknowledged (and published
// to readers) only after every earlier op has been confirmed synced too, so
// LastSeq and subscribers never run ahead of an earlier unsynced batch.
//
// The op id is checked against in-flight ops and the op index under l.mu, so
// two concurrent appends of one op id write it once; the second waits for the
// first and returns its events with Duplicate set.
func (l *Log) Append(ctx context.Context, evs []event.Event) (AppendResult, error) {
	id, payloadBytes, err := l.check(evs)
	if err != nil {
		return AppendResult{}, err
	}
	if err := ctx.Err(); err != nil {
		return AppendResult{}, err
	}
	if !l.gate.enter() {
		return AppendResult{}, ErrClosed
	}
	defer l.gate.exit()
	if l.readOnly {
		return AppendResult{}, ErrReadOnly
	}

	// Own the events and their payloads: the ring shares them with
	// subscribers, so a caller reusing its buffers must not change them.
	out := slices.Clone(evs)
	arena := make([]byte, 0, payloadBytes)
	for i := range out {
		start := len(arena)
		arena = append(arena, out[i].Payload...)
		out[i].Payload = arena[start:len(arena):len(arena)]
		out[i].Node = l.node
	}

	b := l.db.NewBatch()
	l.mu.Lock()
	if l.poisoned.Load() {
		l.mu.Unlock()
		_ = b.Close()
		return AppendResult{}, l.failure()
	}
	l.pruneInflight()
	if prev := l.inflight[id]; prev != nil {
		l.mu.Unlock()
		_ = b.Close()
		return l.awaitDuplicate(ctx, prev)
	}
	first, count, found, err := lookupOp(l.db, id)
	if err != nil || found {
		l.mu.Unlock()
		_ = b.Close()
		if err != nil {
			return AppendResult{}, err
		}
		return l.readDuplicate(id, first, count)
	}

	o := &op{id: id, first: l.next, last: l.next + uint64(len(out)) - 1, events: out, done: make(chan struct{})}
	for i := range out {
		out[i].Seq = o.first + uint64(i)
		l.scratch = event.AppendEncode(l.scratch[:0], &out[i])
		l.key = appendSeqKey(l.key[:0], prefixEvent, out[i].Seq)
		_ = b.Set(l.key, l.scratch, nil)
	}
	var ov [12]byte
	binary.BigEndian.PutUint64(ov[:8], o.first)
	binary.BigEndian.PutUint32(ov[8:], uint32(len(out)))
	_ = b.Set(opKey(id), ov[:], nil)
	if err := l.db.ApplyNoSyncWait(b, pebble.Sync); err != nil {
		// Refused before reaching the WAL: the sequences stay unassigned.
		l.mu.Unlock()
		_ = b.Close()
		return AppendResult{}, fmt.Errorf("eventlog: apply: %w", err)
	}
	l.next = o.last + 1
	l.inflight[id] = o
	l.applied = append(l.applied, o)
	l.ring.push(out)
	l.pubMu.Lock()
	l.syncing = append(l.syncing, o)
	l.pubMu.Unlock()
	l.mu.Unlock()

	syncErr := b.SyncWait()
	l.complete(o, syncErr)
	<-o.done
	_ = b.Close()
	if o.err != nil {
		return AppendResult{}, o.err
	}
	return AppendResult{Events: out}, nil
}

// check validates an append before anything is locked or written. It returns
// the shared op id and the payload bytes to copy.
func (l *Log) check(evs []event.Event) (event.OpID, int, error) {
	if len(evs) == 0 {
		return event.ZeroOpID, 0, ErrNoEvents
	}
	id := evs[0].OpID
	payload, size := 0, 0
	for i := range evs {
		if err := evs[i].Validate(); err != nil {
			return id, 0, fmt.Errorf("eventlog: event %d of %d: %w", i, len(evs), err)
		}
		if evs[i].OpID != id {
			return id, 0, fmt.Errorf("%w: event %d has %s, event 0 has %s", ErrMixedOpIDs, i, evs[i].OpID, id)
		}
		payload += len(evs[i].Payload)
		// Generous upper bound of one record: varints, ids, key.
		size += len(evs[i].Payload) + len(evs[i].AggID) + len(l.node) + 96
	}
	if size > MaxAppendBytes {
		return id, 0, fmt.Errorf("%w: %d events, about %d bytes, limit %d", ErrAppendTooLarge, len(evs), size, MaxAppendBytes)
	}
	return id, payload, nil
}

// complete records o's sync result and publishes, in sequence order, every
// op at the head of the queue whose sync is confirmed. A WAL sync error
// poisons the log: whether later data is on disk is unknown (and after a
// failed fsync the kernel may have dropped it), so nothing past the failure
// is ever published or acknowledged.
func (l *Log) complete(o *op, syncErr error) {
	l.pubMu.Lock()
	o.synced, o.syncErr = true, syncErr
	var ready []*op
	for len(l.syncing) > 0 && l.syncing[0].synced {
		h := l.syncing[0]
		l.syncing[0] = nil
		l.syncing = l.syncing[1:]
		if h.syncErr != nil && l.failErr == nil {
			l.failErr = h.syncErr
			l.poisoned.Store(true)
			l.log.Error().Err(h.syncErr).Uint64("seq", h.first).Msg("eventlog: WAL sync failed; refusing further appends")
		}
		if l.failErr != nil {
			h.err = l.failureLocked()
		}
		ready = append(ready, h)
	}
	var advanced bool
	for _, h := range ready {
		if h.err == nil {
			l.durable.Store(h.last)
			h.published.Store(true)
			advanced = true
		}
	}
	if advanced {
		ch := make(chan struct{})
		close(*l.notify.Swap(&ch))
	}
	l.pubMu.Unlock()
	for _, h := range ready {
		close(h.done)
	}
}

func (l *Log) failure() error {
	l.pubMu.Lock()
	defer l.pubMu.Unlock()
	return l.failureLocked()
}

func (l *Log) failureLocked() error {
	return fmt.Errorf("%w: WAL sync: %v", ErrFailed, l.failErr)
}

// pruneInflight forgets published ops; from then on the op index answers
// for them. Called under l.mu.
func (l *Log) pruneInflight() {
	n := 0
	for n < len(l.applied) && l.applied[n].published.Load() {
		delete(l.inflight, l.applied[n].id)
		l.applied[n] = nil
		n++
	}
	l.applied = l.applied[n:]
}

// lookupOp reads the op index entry of id.
func lookupOp(r pebble.Reader, id event.OpID) (first uint64, count uint32, found bool, err error) {
	v, closer, err := r.Get(opKey(id))
	if errors.Is(err, pebble.ErrNotFound) {
		return 0, 0, false, nil
	}
	if err != nil {
		return 0, 0, false, fmt.Errorf("eventlog: op index: %w", err)
	}
	defer closer.Close()
	if len(v) != 12 {
		return 0, 0, false, &CorruptError{Err: fmt.Errorf("op index entry of %s has %d bytes", id, len(v))}
	}
	return binary.BigEndian.Uint64(v), binary.BigEndian.Uint32(v[8:]), true, nil
}

func (l *Log) awaitDuplicate(ctx context.Context, prev *op) (AppendResult, error) {
	select {
	case <-prev.done:
	case <-ctx.Done():
		return AppendResult{}, ctx.Err()
	}
	if prev.err != nil {
		return AppendResult{}, prev.err
	}
	return AppendResult{Events: slices.Clone(prev.events), Duplicate: true}, nil
}

func (l *Log) readDuplicate(id event.OpID, first uint64, count uint32) (AppendResult, error) {
	if first < l.first.Load() {
		return AppendResult{Duplicate: true}, fmt.Errorf("%w: op %s was appended at seq %d..%d", ErrCompacted, id, first, first+uint64(count)-1)
	}
	evs, err := l.readRange(first, first+uint64(count)-1)
	if err != nil {
		return AppendResult{Duplicate: true}, fmt.Errorf("eventlog: read original events of op %s: %w", id, err)
	}
	return AppendResult{Events: evs, Duplicate: true}, nil
}
