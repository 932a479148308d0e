package eventlog

import (
	"context"
	"encoding/binary"
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

// Group commit. Appends hand a request to one committer goroutine and wait.
// The committer takes every request queued since its last round, checks op
// ids, assigns sequences and writes them all as ONE Pebble batch entering the
// WAL with ApplyNoSyncWait; it then hands the batch to one syncer goroutine
// and immediately starts the next round, so while one fsync runs the next
// batch is already forming. The syncer waits for the batches' fsyncs in the
// order they were written and publishes each (advances LastSeq, wakes
// subscribers, answers its appends) only once it is synced.
//
// Why this is crash safe: sequences are assigned in the order batches enter
// Pebble's WAL (one goroutine does both), so WAL order equals sequence order.
// WAL recovery replays a prefix of the WAL, so a crash loses at most a suffix
// of batches, none of which had been acknowledged; recovered sequences stay
// contiguous and an op (one batch entry, with its op-index entry) is either
// whole or absent. Since batches are published in WAL order and a failed
// fsync stops all publication for good, no reader or caller ever runs ahead
// of an earlier batch that is not on disk. (Pebble itself treats a WAL write
// error as fatal and may panic on the next write; either way nothing
// unsynced is ever acknowledged.)

// request is one Append (or AppendReplica) waiting for the committer.
type request struct {
	id  event.OpID
	evs []event.Event // owned by the log, Node stamped
	// stage, when set, writes a replica batch whose sequences the caller
	// chose (AppendReplica). It runs in the committer with the next
	// sequence to assign, and is committed in a batch of its own.
	stage func(b *pebble.Batch, next uint64) error

	// Set before done is closed.
	res    AppendResult
	err    error
	stored *opIndexEntry // the op was already durable: the caller reads it
	done   chan struct{}
}

type opIndexEntry struct {
	first uint64
	count uint32
}

func (r *request) finish(err error) {
	r.err = err
	close(r.done)
}

// op is one applied append on its way to durability.
type op struct {
	id          event.OpID
	first, last uint64
	events      []event.Event
	// reqs are answered when the op is published: the append that wrote it
	// first, then appends of the same op id that arrived while it was in
	// flight. Guarded by Log.pubMu.
	reqs      []*request
	published atomic.Bool
	replica   bool // from AppendReplica: no dedupe entry in inflight
}

// group is one Pebble batch of ops, in sequence order.
type group struct {
	batch *pebble.Batch
	ops   []*op
	last  uint64
}

// Append makes evs durable as one op and returns them with their sequences.
// All events must share one non-zero op id. It returns only once the events
// are synced to disk; concurrent calls share fsyncs (see above).
//
// An op id already in the log, or in flight, is not written again: Append
// returns the original events with Duplicate set. If ctx ends while the
// append is in flight, Append returns ctx's error and the append may still
// become durable; retrying with the same op id is safe.
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
	req := &request{id: id, evs: l.own(evs, payloadBytes, true), done: make(chan struct{})}
	if err := l.submit(ctx, req); err != nil {
		return AppendResult{}, err
	}
	if req.stored != nil {
		return l.readDuplicate(id, req.stored.first, req.stored.count)
	}
	return req.res, nil
}

// own copies evs and their payloads into memory the log owns: the ring
// shares them with subscribers, so a caller reusing its buffers must not
// change them. stamp sets Node to the log's.
func (l *Log) own(evs []event.Event, payloadBytes int, stamp bool) []event.Event {
	out := slices.Clone(evs)
	arena := make([]byte, 0, payloadBytes)
	for i := range out {
		start := len(arena)
		arena = append(arena, out[i].Payload...)
		out[i].Payload = arena[start:len(arena):len(arena)]
		if stamp {
			out[i].Node = l.node
		}
	}
	return out
}

// submit queues req for the committer and waits for its answer.
func (l *Log) submit(ctx context.Context, req *request) error {
	if l.poisoned.Load() {
		return l.failure()
	}
	l.qmu.Lock()
	l.queue = append(l.queue, req)
	l.qmu.Unlock()
	select {
	case l.kick <- struct{}{}:
	default: // a round is already pending; it will take req
	}
	select {
	case <-req.done:
		return req.err
	case <-ctx.Done():
		return fmt.Errorf("eventlog: append of op %s: %w (it may still become durable; retrying with the same op id is safe)", req.id, ctx.Err())
	}
}

// check validates an append before anything is queued or written. It
// returns the shared op id and the payload bytes to copy.
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

// commitLoop is the committer goroutine. On stop it fails what is still
// queued (its callers have given up: Close waits for Append calls first) and
// closes syncCh so the syncer drains.
func (l *Log) commitLoop() {
	defer close(l.syncCh)
	var taken []*request
	for {
		select {
		case <-l.kick:
		case <-l.stop:
			l.qmu.Lock()
			taken, l.queue = l.queue, nil
			l.qmu.Unlock()
			for _, r := range taken {
				r.finish(ErrClosed)
			}
			return
		}
		l.qmu.Lock()
		taken, l.queue = l.queue, taken[:0]
		l.qmu.Unlock()
		l.commitRound(taken)
		clear(taken)
	}
}

// commitRound writes one round of requests: ordinary appends share one
// batch; a replica request gets a batch of its own, in queue order.
func (l *Log) commitRound(reqs []*request) {
	if l.poisoned.Load() {
		err := l.failure()
		for _, r := range reqs {
			r.finish(err)
		}
		return
	}
	l.pruneInflight()
	g := l.newGroup()
	for _, r := range reqs {
		if r.stage != nil {
			l.apply(g)
			l.commitReplica(r)
			g = l.newGroup()
			continue
		}
		l.stage(g, r)
	}
	l.apply(g)
}

// commitReplica commits a replica request in a batch of its own: its op-index
// checks read Pebble, so every earlier batch must already be applied.
// Committer only.
func (l *Log) commitReplica(r *request) {
	g := l.newGroup()
	if err := r.stage(g.batch, l.next); err != nil {
		_ = g.batch.Close()
		r.finish(err)
		return
	}
	g.ops = []*op{{id: r.id, first: r.evs[0].Seq, last: r.evs[len(r.evs)-1].Seq, events: r.evs, reqs: []*request{r}, replica: true}}
	l.apply(g)
}

func (l *Log) newGroup() *group { return &group{batch: l.db.NewBatch()} }

// stage adds an ordinary append to g, or answers it as a duplicate.
func (l *Log) stage(g *group, r *request) {
	if prev := l.inflight[r.id]; prev != nil {
		l.pubMu.Lock()
		switch {
		case l.failErr != nil: // prev will never be published
			r.err = l.failureLocked()
			close(r.done)
		case prev.published.Load():
			r.res = AppendResult{Events: slices.Clone(prev.events), Duplicate: true}
			close(r.done)
		default:
			prev.reqs = append(prev.reqs, r)
		}
		l.pubMu.Unlock()
		return
	}
	first, count, found, err := lookupOp(l.db, r.id)
	switch {
	case err != nil:
		r.finish(err)
		return
	case found:
		r.stored = &opIndexEntry{first, count}
		close(r.done)
		return
	}
	next := l.nextSeq(g)
	o := &op{id: r.id, first: next, last: next + uint64(len(r.evs)) - 1, events: r.evs, reqs: []*request{r}}
	for i := range r.evs {
		r.evs[i].Seq = o.first + uint64(i)
		l.putRecord(g.batch, &r.evs[i])
	}
	var ov [12]byte
	binary.BigEndian.PutUint64(ov[:8], o.first)
	binary.BigEndian.PutUint32(ov[8:], uint32(len(r.evs)))
	_ = g.batch.Set(opKey(r.id), ov[:], nil)
	l.inflight[r.id] = o // a later request of this round with the same op id waits on it
	g.ops = append(g.ops, o)
}

// nextSeq is the next sequence to assign, counting ops staged in g.
func (l *Log) nextSeq(g *group) uint64 {
	if n := len(g.ops); n > 0 {
		return g.ops[n-1].last + 1
	}
	return l.next
}

// putRecord encodes e into b under its sequence key.
func (l *Log) putRecord(b *pebble.Batch, e *event.Event) {
	l.scratch = event.AppendEncode(l.scratch[:0], e)
	l.key = appendSeqKey(l.key[:0], prefixEvent, e.Seq)
	_ = b.Set(l.key, l.scratch, nil)
}

// apply writes g to Pebble (into the WAL, not yet synced) and hands it to
// the syncer. Refused batches never reached the WAL, so their sequences are
// not used.
func (l *Log) apply(g *group) {
	if len(g.ops) == 0 {
		_ = g.batch.Close()
		return
	}
	g.last = g.ops[len(g.ops)-1].last
	l.mu.Lock()
	err := l.db.ApplyNoSyncWait(g.batch, pebble.Sync)
	if err == nil {
		l.next = g.last + 1
	}
	l.mu.Unlock()
	if err != nil {
		_ = g.batch.Close()
		err = fmt.Errorf("eventlog: apply: %w", err)
		for _, o := range g.ops {
			if !o.replica {
				delete(l.inflight, o.id)
			}
			for _, r := range o.reqs {
				r.finish(err)
			}
		}
		return
	}
	for _, o := range g.ops {
		l.ring.push(o.events)
		if !o.replica {
			l.applied = append(l.applied, o)
		}
	}
	l.syncCh <- g
}

// syncLoop is the syncer goroutine: it waits for each batch's fsync in WAL
// order and publishes it.
func (l *Log) syncLoop() {
	for g := range l.syncCh {
		err := g.batch.SyncWait()
		_ = g.batch.Close()
		l.publish(g, err)
	}
}

// publish makes g visible (LastSeq, subscribers) and answers its appends. A
// WAL sync error poisons the log: whether later data is on disk is unknown
// (and after a failed fsync the kernel may have dropped it), so nothing
// after the failure is ever published or acknowledged.
func (l *Log) publish(g *group, syncErr error) {
	l.pubMu.Lock()
	if syncErr != nil && l.failErr == nil {
		l.failErr = syncErr
		l.poisoned.Store(true)
		l.log.Error().Err(syncErr).Uint64("seq", g.ops[0].first).Msg("eventlog: WAL sync failed; refusing further appends")
	}
	var answered []*request
	for _, o := range g.ops {
		for i, r := range o.reqs {
			switch {
			case l.failErr != nil:
				r.err = l.failureLocked()
			case i == 0:
				r.res = AppendResult{Events: o.events}
			default:
				r.res = AppendResult{Events: slices.Clone(o.events), Duplicate: true}
			}
		}
		answered = append(answered, o.reqs...)
		o.reqs = nil
		if l.failErr == nil {
			o.published.Store(true)
		}
	}
	if l.failErr == nil {
		l.durable.Store(g.last)
		ch := make(chan struct{})
		close(*l.notify.Swap(&ch))
	}
	l.pubMu.Unlock()
	for _, r := range answered {
		close(r.done)
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
// for them. Committer only.
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
	v, ok, err := getFrom(r, opKey(id))
	if err != nil || !ok {
		return 0, 0, false, err
	}
	if len(v) != 12 {
		return 0, 0, false, &CorruptError{Err: fmt.Errorf("op index entry of %s has %d bytes", id, len(v))}
	}
	return binary.BigEndian.Uint64(v), binary.BigEndian.Uint32(v[8:]), true, nil
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
