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

// Group commit. An append queues a request. Whoever holds commitMu commits
// a "round": it takes every queued request, checks op ids, assigns sequences
// and writes them all as ONE Pebble batch entering the WAL (ApplyNoSyncWait).
// An uncontended append takes commitMu itself and commits inline, then waits
// for its batch's fsync and publishes it on its own goroutine: no hand-off,
// so one writer pays what a raw Pebble Set+Sync pays. When commitMu is busy
// the append wakes the committer goroutine instead, which commits rounds back
// to back and leaves the fsync waits to the syncer goroutine; while one fsync
// runs, the next batch is already forming, and Pebble's WAL writer covers
// every batch written meanwhile with its next single fsync.
//
// Why this is crash safe: sequences are assigned and batches enter Pebble's
// WAL under commitMu, so WAL order equals sequence order. WAL recovery
// replays a prefix of the WAL, so a crash loses at most a suffix of batches,
// none of which had been acknowledged; recovered sequences stay contiguous
// and an op (one batch entry, with its op-index entry) is either whole or
// absent. Batches are published (LastSeq advanced, subscribers woken,
// appends answered) strictly in WAL order, each only once it and every
// earlier batch are known synced, and a failed fsync stops all publication
// for good, so no reader or caller ever runs ahead of data that is not on
// disk. (Pebble itself treats a WAL write error as fatal and may panic on
// the next write; either way nothing unsynced is ever acknowledged.)

// request is one Append (or AppendReplica) waiting for the committer.
type request struct {
	id  event.OpID
	evs []event.Event // owned by the log, Node stamped
	// stage, when set, writes a replica batch whose sequences the caller
	// chose (AppendReplica). It runs in the committer with the next
	// sequence to assign, and is committed in a batch of its own.
	stage func(b *pebble.Batch, next uint64) error

	// seen is how many ops had been applied before the op-index probe that
	// set found (nil: not in the index then).
	seen  uint64
	found *opIndexEntry
	// fresh: the caller minted the op id for this append (BeginNew); the
	// op index is not probed.
	fresh bool

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
	replica   bool   // from AppendReplica: no dedupe entry in inflight
	index     uint64 // 1-based count of ordinary ops applied, this one included
}

// group is one Pebble batch of ops, in sequence order.
type group struct {
	batch *pebble.Batch
	ops   []*op
	last  uint64
	// Set under Log.pubMu: synced once the batch (or a later one) is known
	// synced, done once published (or failed) and out of Log.syncing.
	synced, done bool
	syncErr      error
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
	if err := ctx.Err(); err != nil {
		return AppendResult{}, err
	}
	p, err := l.Begin(evs)
	if err != nil {
		return AppendResult{}, err
	}
	return p.Wait(ctx)
}

// Pending is an append that has its place in the log's order but is not yet
// known to be durable. Wait must be called exactly once.
type Pending struct {
	l      *Log
	req    *request
	groups []*group // committed inline by Begin; their fsync wait is Wait's
}

// Begin queues evs as one op and returns without waiting for the fsync. The
// op's sequences follow every op queued by an earlier Begin or Append call
// that returned, so a caller that serialises Begin under its own lock gets
// sequences in its lock order, while the fsyncs, waited for outside that
// lock, are shared (group commit). This is how the single writer keeps the
// order in which it applies events to its state equal to the log's order.
func (l *Log) Begin(evs []event.Event) (*Pending, error) { return l.begin(evs, false) }

// BeginNew is Begin for an op id the caller has just minted and never
// appended before (engine.ProposeNew mints one per command): it skips the
// op-index probe, a Pebble read that is most of Begin's CPU. A duplicate
// can then only be a concurrent append of the same id, which the in-flight
// table still catches; an id that is in fact already durable in the log
// would be written twice, so never pass one that came from outside.
func (l *Log) BeginNew(evs []event.Event) (*Pending, error) { return l.begin(evs, true) }

func (l *Log) begin(evs []event.Event, fresh bool) (*Pending, error) {
	id, payloadBytes, err := l.check(evs)
	if err != nil {
		return nil, err
	}
	if !l.gate.enter() {
		return nil, ErrClosed
	}
	if l.readOnly {
		l.gate.exit()
		return nil, ErrReadOnly
	}
	if l.poisoned.Load() {
		l.gate.exit()
		return nil, l.failure()
	}
	req := &request{id: id, evs: l.own(evs, payloadBytes, true), fresh: fresh, done: make(chan struct{})}
	if fresh {
		return &Pending{l: l, req: req, groups: l.enqueue(req)}, nil
	}
	// Probe the op index here, outside commitMu, so concurrent appends do
	// their lookups in parallel; stage checks that no op applied since could
	// have been missed.
	req.seen = l.appliedOps.Load()
	first, count, found, err := lookupOp(l.db, id)
	if err != nil {
		l.gate.exit()
		return nil, err
	}
	if found {
		req.found = &opIndexEntry{first, count}
	}
	return &Pending{l: l, req: req, groups: l.enqueue(req)}, nil
}

// Wait returns once the op is durable (or found already durable, with
// Duplicate set). If ctx ends first it returns ctx's error; the op may still
// become durable and retrying with the same op id is safe.
func (p *Pending) Wait(ctx context.Context) (AppendResult, error) {
	defer p.l.gate.exit()
	if err := p.wait(ctx); err != nil {
		return AppendResult{}, err
	}
	if p.req.stored != nil {
		return p.l.readDuplicate(p.req.id, p.req.stored.first, p.req.stored.count)
	}
	return p.req.res, nil
}

func (p *Pending) wait(ctx context.Context) error {
	for _, g := range p.groups {
		p.l.syncAndPublish(g)
	}
	select {
	case <-p.req.done:
		return p.req.err
	case <-ctx.Done():
		return fmt.Errorf("eventlog: append of op %s: %w (it may still become durable; retrying with the same op id is safe)", p.req.id, ctx.Err())
	}
}

// submit queues req and waits for its answer; the caller holds the gate.
func (l *Log) submit(ctx context.Context, req *request) error {
	if l.poisoned.Load() {
		return l.failure()
	}
	p := &Pending{l: l, req: req, groups: l.enqueue(req)}
	return p.wait(ctx)
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

// enqueue queues req and commits it inline if no round is in progress
// (else leaves it to the committer). It returns the groups it committed
// inline, whose fsync the caller must wait for and publish.
func (l *Log) enqueue(req *request) []*group {
	l.qmu.Lock()
	l.queue = append(l.queue, req)
	l.qmu.Unlock()
	if !l.commitMu.TryLock() {
		l.wakeCommitter()
		return nil
	}
	l.qmu.Lock()
	taken := l.queue
	l.queue = nil
	l.qmu.Unlock()
	groups := l.commitRound(taken)
	l.qmu.Lock()
	more := len(l.queue) > 0
	l.qmu.Unlock()
	l.commitMu.Unlock()
	if more {
		// Queued while we held commitMu; their appends woke the
		// committer already, but a wake-up is cheap insurance.
		l.wakeCommitter()
	}
	return groups
}

func (l *Log) wakeCommitter() {
	select {
	case l.kick <- struct{}{}:
	default: // a round is already pending; it will take the queue
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
		l.commitMu.Lock()
		l.qmu.Lock()
		taken, l.queue = l.queue, taken[:0]
		l.qmu.Unlock()
		groups := l.commitRound(taken)
		l.commitMu.Unlock()
		clear(taken)
		for _, g := range groups {
			l.syncCh <- g
		}
	}
}

// commitRound writes one round of requests: ordinary appends share one
// batch; a replica request gets a batch of its own, in queue order. It
// returns the applied groups, whose fsyncs the caller waits for. Called
// under commitMu.
func (l *Log) commitRound(reqs []*request) []*group {
	if len(reqs) == 0 {
		return nil
	}
	if l.poisoned.Load() {
		err := l.failure()
		for _, r := range reqs {
			r.finish(err)
		}
		return nil
	}
	l.pruneInflight()
	var applied []*group
	g := l.newGroup()
	for _, r := range reqs {
		if r.stage != nil {
			applied = l.apply(g, applied)
			applied = l.commitReplica(r, applied)
			g = l.newGroup()
			continue
		}
		l.stage(g, r)
	}
	return l.apply(g, applied)
}

// commitReplica commits a replica request in a batch of its own: its op-index
// checks read Pebble, so every earlier batch must already be applied.
// Called under commitMu.
func (l *Log) commitReplica(r *request, applied []*group) []*group {
	g := l.newGroup()
	if err := r.stage(g.batch, l.next); err != nil {
		_ = g.batch.Close()
		r.finish(err)
		return applied
	}
	g.ops = []*op{{id: r.id, first: r.evs[0].Seq, last: r.evs[len(r.evs)-1].Seq, events: r.evs, reqs: []*request{r}, replica: true}}
	return l.apply(g, applied)
}

func (l *Log) newGroup() *group { return &group{batch: l.db.NewBatch()} }

// stage adds an ordinary append to g, or answers it as a duplicate. Called
// under commitMu.
func (l *Log) stage(g *group, r *request) {
	if prev := l.inflight[r.id]; prev != nil {
		l.pubMu.Lock()
		switch {
		case l.failErr != nil: // prev will never be published
			r.err = l.failureLocked()
			close(r.done)
		case prev.published.Load() && prev.first < l.first.Load():
			// Truncated away since: answer as the index would.
			r.stored = &opIndexEntry{prev.first, uint32(len(prev.events))}
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
	if !r.fresh && !l.lookupCovers(r.seen) {
		// Ops applied after the probe may have been pruned from inflight
		// already: probe again (rare; see keepApplied).
		first, count, found, err := lookupOp(l.db, r.id)
		if err != nil {
			r.finish(err)
			return
		}
		r.found = nil
		if found {
			r.found = &opIndexEntry{first, count}
		}
	}
	if r.found != nil {
		// In the index but not in inflight: published, so durable.
		r.stored = r.found
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

// apply writes g to Pebble (into the WAL, not yet synced), queues it for
// publication in WAL order and appends it to applied. Refused batches never
// reached the WAL, so their sequences are not used. Called under commitMu.
func (l *Log) apply(g *group, applied []*group) []*group {
	if len(g.ops) == 0 {
		_ = g.batch.Close()
		return applied
	}
	g.last = g.ops[len(g.ops)-1].last
	if err := l.db.ApplyNoSyncWait(g.batch, pebble.Sync); err != nil {
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
		return applied
	}
	l.next = g.last + 1
	for _, o := range g.ops {
		l.ring.push(o.events)
		if !o.replica {
			o.index = l.appliedOps.Load() + 1
			l.applied = append(l.applied, o)
			// After the batch is visible: a probe that reads this count
			// sees the op in Pebble.
			l.appliedOps.Store(o.index)
		}
	}
	l.pubMu.Lock()
	l.syncing = append(l.syncing, g)
	l.pubMu.Unlock()
	return append(applied, g)
}

// syncLoop is the syncer goroutine: it waits for the committer's batches.
func (l *Log) syncLoop() {
	for g := range l.syncCh {
		l.syncAndPublish(g)
	}
}

// syncAndPublish waits for g's fsync, then publishes, in WAL order, every
// queued group whose fsync is confirmed. Waits may return out of order
// (different goroutines wait for different groups); publication never does.
//
// A WAL sync error poisons the log: whether later data is on disk is
// unknown (and after a failed fsync the kernel may have dropped it), so
// nothing after the failure is ever published or acknowledged.
func (l *Log) syncAndPublish(g *group) {
	syncErr := g.batch.SyncWait()
	_ = g.batch.Close()
	l.pubMu.Lock()
	if syncErr != nil {
		g.synced, g.syncErr = true, syncErr
	} else if !g.done {
		// Pebble's WAL writer completes syncs in write order (and its errors
		// are sticky), so g being synced means every batch written before it
		// is too: publish them without waiting for their own goroutines,
		// which may not have been scheduled yet.
		for _, h := range l.syncing {
			h.synced = true
			if h == g {
				break
			}
		}
	}
	var answered []*request
	published, failed := false, l.failErr != nil
	for len(l.syncing) > 0 && l.syncing[0].synced {
		h := l.syncing[0]
		l.syncing[0] = nil
		l.syncing = l.syncing[1:]
		h.done = true
		if h.syncErr != nil && l.failErr == nil {
			l.failErr = h.syncErr
			l.poisoned.Store(true)
			l.log.Error().Err(h.syncErr).Uint64("seq", h.ops[0].first).Msg("eventlog: WAL sync failed; refusing further appends")
		}
		for _, o := range h.ops {
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
			l.durable.Store(h.last)
			published = true
		}
	}
	// Waiters wake on progress, and once on the failure: what they wait
	// for will then never be durable.
	if published || (!failed && l.failErr != nil) {
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
// for them. Called under commitMu.
func (l *Log) pruneInflight() {
	n := 0
	for len(l.applied)-n > l.keepApplied && l.applied[n].published.Load() {
		delete(l.inflight, l.applied[n].id)
		l.applied[n] = nil
		n++
	}
	l.applied = l.applied[n:]
}

// keepApplied is how many of the most recently applied ops stay in inflight
// after publication (Log.keepApplied; tests lower it). An op-index probe made before commitMu (Begin) can only
// have missed ops applied after it; as long as those are all still in
// inflight, stage finds them there. A probe older than this window is
// repeated under commitMu.
const keepApplied = 4096

// lookupCovers reports whether every op applied after the first seen ones
// is still in inflight. Called under commitMu.
func (l *Log) lookupCovers(seen uint64) bool {
	if len(l.applied) == 0 {
		return l.appliedOps.Load() <= seen
	}
	return l.applied[0].index <= seen+1
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
