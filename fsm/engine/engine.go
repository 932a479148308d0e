// Package engine is the single writer of a node's op log: it turns commands
// into durable, applied events and tells the rest of the daemon what changed.
//
// Propose runs, in this order: fsm.Decide against the current state; on a
// rejection, return it (nothing is written). Otherwise queue the events in
// the log (eventlog.Begin) and fold them into the state (fsm.Apply), both
// under the engine's lock, so the order of application is the log's order;
// then, outside the lock, wait until the events are durable (fsyncs are
// shared between concurrent proposals) and only then answer and hand the new
// intents to the executors. An error from the log is an *AppendError, never
// a rejection: "the append failed" and "the command was rejected" stay apart.
//
// Readers (View) may see events that are applied but whose fsync is still in
// flight; nothing is acknowledged to a client, streamed on /v1/events or
// given to an executor before it is durable. If the fsync of an applied event
// fails, the state is ahead of the log, so the engine stops accepting
// proposals (ErrStopped wraps the cause) and the daemon must restart and
// rebuild from the log.
//
// The engine also runs the two loops every node needs: a timer loop that
// proposes fsm.Tick when the state's next timer is due, and a refill loop
// that proposes fsm.Refill once a pool has been short of its warm target for
// Options.RefillDelay (so one Refill answers a burst of claims). Both loops,
// like every time the engine stamps or measures, read Options.Clock.
package engine

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/oklog/ulid/v2"
	"github.com/rs/zerolog"

	"github.com/sbxlog/sbxlog/eventlog"
	"github.com/sbxlog/sbxlog/eventlog/event"
	"github.com/sbxlog/sbxlog/fsm"
)

// Log is what the engine needs of the op log.
type Log interface {
	// Begin queues events; sequences follow call order (see eventlog.Begin).
	Begin(evs []event.Event) (*eventlog.Pending, error)
	// BeginNew is Begin for an op id minted for this call and never
	// appended before: the log may skip its duplicate check.
	BeginNew(evs []event.Event) (*eventlog.Pending, error)
	LastSeq() uint64
	// WaitDurable returns once every event up to seq is durable, or the
	// log failed or closed first (see eventlog.WaitDurable).
	WaitDurable(ctx context.Context, seq uint64) error
}

var _ Log = (*eventlog.Log)(nil)

// ErrStopped is returned by Propose once the engine is shut down or has
// failed; errors.Is(err, ErrStopped) holds for both.
var ErrStopped = errors.New("engine stopped")

// AppendError says the log could not make a decided command durable. The
// command was valid; the caller should answer 5xx, not 4xx.
type AppendError struct{ Err error }

func (e *AppendError) Error() string { return "op log append failed: " + e.Err.Error() }
func (e *AppendError) Unwrap() error { return e.Err }

// Commit describes one durable, applied command, for observers.
type Commit struct {
	Events []event.Event
	// Intents are the side effects the events created (fsm.NewIntents).
	Intents []fsm.Intent
}

// Options configure an Engine.
type Options struct {
	Log zerolog.Logger
	// Clock is the time stamped into commands and the loops' schedule
	// (default: the system clock).
	Clock Clock
	// OnCommit, if set, is called after every durable commit, in log order,
	// outside the engine's lock. It must not block for long.
	OnCommit func(Commit)
	// OnAppend, if set, receives each proposal's append latency (queued
	// to durable).
	OnAppend func(time.Duration)
	// TickEvery caps the timer loop's sleep (default 1 s), so a clock jump
	// cannot delay timers for long.
	TickEvery time.Duration
	// RefillDelay is how long a pool may stay short before the refill loop
	// proposes a Refill (default DefaultRefillDelay; negative: none). Every
	// warm claim leaves its pool short; refilling at once would put one
	// extra op, and its fsync, right in front of the next claim's. Waiting
	// a little lets one Refill answer a burst of claims, with its fsync
	// shared or out of their way. The delay is bounded: later commits do
	// not push it back.
	RefillDelay time.Duration
}

// DefaultRefillDelay is Options.RefillDelay's default: small next to a clone
// (tens of milliseconds at best), long next to an fsync.
const DefaultRefillDelay = 10 * time.Millisecond

// Engine is a node's single writer. Create with New, start the loops with
// Start, stop with Shutdown.
type Engine struct {
	log  Log
	opts Options
	zl   zerolog.Logger

	mu    sync.RWMutex // guards st and failed; held across Decide+Begin+Apply
	st    *fsm.State
	err   error      // set once: shut down or failed
	order sync.Mutex // orders OnCommit calls by sequence

	commitMu  sync.Mutex
	committed uint64 // highest seq handed to OnCommit
	pending   map[uint64]Commit

	wake chan struct{} // pokes the timer and refill loops
	// The loop's plan, published under mu (read) and checked under mu, so
	// a commit pokes the loop only when the plan no longer holds: an
	// earlier timer, or a pool short with no refill planned. A poke per
	// commit would wake the loop's goroutine on every claim.
	planTimer  atomic.Int64 // Clock ns by which the loop looks at timers
	planRefill atomic.Bool  // a refill is planned
	stop       chan struct{}
	wg         sync.WaitGroup
	started    bool
	once       sync.Once

	entropy *ulid.MonotonicEntropy
	entMu   sync.Mutex
}

// New wraps a state rebuilt from log (see Rebuild). The
// engine owns st from now on.
func New(log Log, st *fsm.State, opts Options) *Engine {
	if opts.Clock == nil {
		opts.Clock = systemClock{}
	}
	if opts.TickEvery <= 0 {
		opts.TickEvery = time.Second
	}
	switch {
	case opts.RefillDelay == 0:
		opts.RefillDelay = DefaultRefillDelay
	case opts.RefillDelay < 0:
		opts.RefillDelay = 0
	}
	return &Engine{
		log: log, opts: opts, zl: opts.Log, st: st,
		// Commits are handed on from the first after the state's: the
		// first commit to arrive may not be the first one made.
		committed: st.Applied(),
		pending:   map[uint64]Commit{},
		wake:      make(chan struct{}, 1),
		stop:      make(chan struct{}),
		entropy:   ulid.Monotonic(rand.Reader, 0),
	}
}

// NewOpID mints a fresh op id (a ULID) for a command.
func (e *Engine) NewOpID() event.OpID {
	e.entMu.Lock()
	defer e.entMu.Unlock()
	return ulid.MustNew(ulid.Timestamp(e.opts.Clock.Now()), e.entropy)
}

// Meta stamps a new command: a fresh op id and the current time.
func (e *Engine) Meta() fsm.Meta {
	return fsm.Meta{Op: e.NewOpID(), Now: e.opts.Clock.Now().UnixNano()}
}

// Result is what a proposal did.
type Result struct {
	// Events are the durable events, with sequences; none when the command
	// was already satisfied (an idempotent no-op).
	Events []event.Event
	// Seq is the log sequence the outcome reflects: the last event's, or,
	// for a no-op, the last one applied when the command was decided (the
	// change that already satisfied it). It is durable when Propose
	// returns without error, so an answer built from the state at Seq
	// acknowledges nothing a crash could take back.
	Seq uint64
}

// Propose decides cmd, makes its events durable and applies them. It returns
// a *fsm.Rejection when the state refuses the command, an *AppendError when
// the log failed, ErrStopped after Shutdown. A command whose op id is
// already in the log is an idempotent no-op (the log dedupes it).
func (e *Engine) Propose(ctx context.Context, cmd fsm.Command) (Result, error) {
	return e.propose(ctx, cmd, false, Hooks{})
}

// ProposeNew is Propose for a command that needs a new op id: build gets
// the Meta (op id and time) minted here and returns the command, which must
// carry it and must not be proposed again. Its op id being new by
// construction, the log skips the duplicate check (eventlog.BeginNew), a
// Pebble read per command. For commands from clients, which never retry an
// op id; executor results, whose op ids derive from their intents and may
// repeat after a crash, go through Propose. hooks lets the caller work in
// the fsync's shadow and answer before the commit observers run.
func (e *Engine) ProposeNew(ctx context.Context, build func(fsm.Meta) fsm.Command, hooks Hooks) (Result, error) {
	return e.propose(ctx, build(e.Meta()), true, hooks)
}

// Hooks are a proposer's callbacks, run on its goroutine inside ProposeNew,
// each at most once and only when the command's events were applied (not
// for a rejection, a no-op or a failed append). Either may be nil.
type Hooks struct {
	// Prepare runs once the events are applied and before their fsync is
	// waited for, outside the engine's lock, so a caller can build its
	// answer in the fsync's shadow (it may read the state through View). It
	// must not let anything out: the events may still be lost.
	Prepare func()
	// Durable runs once the events are durable and, unless a concurrent
	// proposal hands this commit on first, before the commit observers
	// (Options.OnCommit: executors, projections) are told, so the caller
	// can send its answer without waiting for their work. It should not
	// block for long: while it runs, this commit reaches the observers only
	// through later proposals. Once it ran the command took effect,
	// whatever ProposeNew then returns (a cancelled ctx still yields ctx's
	// error).
	Durable func()
}

func (e *Engine) propose(ctx context.Context, cmd fsm.Command, fresh bool, hooks Hooks) (Result, error) {
	e.mu.Lock()
	if e.err != nil {
		err := e.err
		e.mu.Unlock()
		return Result{}, err
	}
	evs, payloads, err := fsm.DecidePayloads(e.st, cmd)
	if err != nil {
		e.mu.Unlock()
		return Result{}, err
	}
	if len(evs) == 0 {
		// Already satisfied, by events that are applied but may still be
		// in their fsync: the answer waits for them, so a duplicate
		// request is never acknowledged before the change it reports is
		// durable (a crash could otherwise take back what it confirmed).
		applied := e.st.Applied()
		e.mu.Unlock()
		if err := e.log.WaitDurable(ctx, applied); err != nil {
			if ctx.Err() != nil {
				return Result{}, ctx.Err()
			}
			return Result{}, &AppendError{Err: err}
		}
		return Result{Seq: applied}, nil
	}
	began := e.opts.Clock.Now()
	var p *eventlog.Pending
	if fresh {
		p, err = e.log.BeginNew(evs)
	} else {
		p, err = e.log.Begin(evs)
	}
	if err != nil {
		e.mu.Unlock()
		return Result{}, &AppendError{Err: err}
	}
	// Begin copied the events and stamped node and sequences only in its
	// copy; number ours the same way for Apply. The log assigns contiguous
	// sequences in Begin order, and Begin calls are serialised here.
	first := e.st.Applied() + 1
	for i := range evs {
		evs[i].Seq = first + uint64(i)
		evs[i].Node = e.st.Node()
	}
	for i := range evs {
		// The payloads as Decide built them: no decoding what was just
		// encoded. Replay decodes the log's bytes; fsm's randomized test
		// pins that both give the same state.
		if err := fsm.ApplyDecoded(e.st, &evs[i], payloads[i]); err != nil {
			// Decide produced an event Apply refuses: a bug in fsm. The
			// state may now disagree with the log; stop rather than serve it.
			e.failLocked(fmt.Errorf("apply of %s (seq %d) failed: %w", evs[i].Type, evs[i].Seq, err))
			e.mu.Unlock()
			_, _ = p.Wait(context.Background())
			return Result{}, e.err
		}
	}
	intents := fsm.NewIntents(e.st, evs)
	wake := e.planStale()
	e.mu.Unlock()
	if hooks.Prepare != nil {
		// Begin woke Pebble's WAL writer onto this P, where it would start
		// the write and fsync only once this goroutine blocks in Wait: after
		// Prepare. Yielding lets it start them now; Prepare then runs on
		// another P while the fsync is in flight. Harness A/B on 2 vCPUs:
		// warm claim p50 217/190/218/220 -> 203/182/196/198 µs.
		runtime.Gosched()
		hooks.Prepare()
	}

	// The fsync is shared with concurrent proposals. A cancelled client
	// must not leave the state ahead of an unknown log, so wait regardless
	// of ctx; an fsync is bounded by the disk.
	res, err := p.Wait(context.Background())
	if e.opts.OnAppend != nil {
		e.opts.OnAppend(e.opts.Clock.Now().Sub(began))
	}
	if err == nil && (res.Duplicate || len(res.Events) != len(evs) || res.Events[0].Seq != evs[0].Seq) {
		err = fmt.Errorf("log stored op %s at seq %d (duplicate=%v), state applied it at %d", evs[0].OpID, firstSeq(res.Events), res.Duplicate, evs[0].Seq)
	}
	if err != nil {
		e.mu.Lock()
		e.failLocked(fmt.Errorf("append of applied events failed: %w", err))
		e.mu.Unlock()
		return Result{}, &AppendError{Err: err}
	}
	// Recorded before Durable and delivered after: the next proposal's
	// delivery hands this commit on too, so a Durable that blocks (a client
	// not reading its reply) holds up nobody else's observers.
	e.recordCommit(Commit{Events: res.Events, Intents: intents})
	if hooks.Durable != nil {
		hooks.Durable()
	}
	e.deliverCommits()
	if wake {
		e.poke()
	}
	return Result{Events: res.Events, Seq: res.Events[len(res.Events)-1].Seq}, ctx.Err()
}

// planStale reports whether the state, just changed, needs the loop sooner
// than it planned. Called under mu.
func (e *Engine) planStale() bool {
	if at, ok := e.st.NextTimer(); ok && at < e.planTimer.Load() {
		return true
	}
	return !e.planRefill.Load() && fsm.NeedsRefill(e.st)
}

func firstSeq(evs []event.Event) uint64 {
	if len(evs) == 0 {
		return 0
	}
	return evs[0].Seq
}

// SetOnCommit replaces the commit observer (the daemon wires its executors
// and API after the engine has replayed and configured the node).
func (e *Engine) SetOnCommit(fn func(Commit)) {
	e.order.Lock()
	e.opts.OnCommit = fn
	e.order.Unlock()
}

// recordCommit marks c durable; deliverCommits hands it on.
func (e *Engine) recordCommit(c Commit) {
	e.commitMu.Lock()
	e.pending[c.Events[0].Seq] = c
	e.commitMu.Unlock()
}

// deliverCommits hands every recorded commit that continues the sequence to
// OnCommit, whoever recorded it: fsync waits finish in any order, observers
// (the executors' queue, the API's views) want log order.
func (e *Engine) deliverCommits() {
	e.commitMu.Lock()
	var ready []Commit
	for {
		n, ok := e.pending[e.committed+1]
		if !ok {
			break
		}
		delete(e.pending, e.committed+1)
		e.committed = n.Events[len(n.Events)-1].Seq
		ready = append(ready, n)
	}
	if len(ready) == 0 {
		e.commitMu.Unlock()
		return
	}
	// Taken before commitMu is let go, so deliveries run in the order
	// their commits were taken: a later run cannot overtake this one.
	e.order.Lock()
	e.commitMu.Unlock()
	for _, r := range ready {
		if e.opts.OnCommit != nil {
			e.opts.OnCommit(r)
		}
	}
	e.order.Unlock()
}

func (e *Engine) failLocked(err error) {
	if e.err == nil {
		e.err = fmt.Errorf("%w: %v", ErrStopped, err)
		e.zl.Error().Err(err).Msg("engine: stopping; restart to rebuild state from the log")
	}
}

// Err returns why the engine stopped, or nil while it runs.
func (e *Engine) Err() error {
	e.mu.RLock()
	defer e.mu.RUnlock()
	return e.err
}

// View runs fn with the current state under a read lock. fn must not keep st
// or block.
func (e *Engine) View(fn func(st *fsm.State)) {
	e.mu.RLock()
	defer e.mu.RUnlock()
	fn(e.st)
}

// Snapshot encodes the state and returns it with the sequence it reflects.
func (e *Engine) Snapshot() (seq uint64, data []byte) {
	e.mu.RLock()
	defer e.mu.RUnlock()
	return e.st.Applied(), fsm.Encode(e.st)
}

// Intents returns every pending side effect (for executors at start-up).
func (e *Engine) Intents() []fsm.Intent {
	e.mu.RLock()
	defer e.mu.RUnlock()
	return fsm.Intents(e.st)
}

func (e *Engine) poke() {
	select {
	case e.wake <- struct{}{}:
	default:
	}
}

// Start runs the timer and refill loops until Shutdown.
func (e *Engine) Start() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.started || e.err != nil {
		return
	}
	e.started = true
	e.wg.Add(1)
	go func() { defer e.wg.Done(); e.loop() }()
	e.poke()
}

// Shutdown stops the loops and refuses further proposals. It is idempotent
// and waits for the loops to exit.
func (e *Engine) Shutdown() {
	e.once.Do(func() {
		close(e.stop)
		e.mu.Lock()
		if e.err == nil {
			e.err = ErrStopped
		}
		e.mu.Unlock()
	})
	e.wg.Wait()
}

// loop proposes Ticks when a timer is due and Refills when a pool has been
// short for RefillDelay. After each pass it plans its next wake-up under the
// read lock and publishes the plan before releasing it, so every commit
// either is seen by the plan or sees the plan (and pokes if it is stale).
func (e *Engine) loop() {
	t := e.opts.Clock.NewTimer(0)
	defer t.Stop()
	var refillAt time.Time // when a short pool is refilled; zero: none planned
	for {
		select {
		case <-e.stop:
			return
		case <-t.C():
		case <-e.wake:
		}
		e.tickIfDue()
		if !refillAt.IsZero() && !e.opts.Clock.Now().Before(refillAt) {
			refillAt = time.Time{}
			e.refill()
		}
		var d time.Duration
		refillAt, d = e.replan(refillAt)
		if !t.Stop() {
			select {
			case <-t.C():
			default:
			}
		}
		t.Reset(d)
	}
}

// replan decides when the loop next wakes and publishes that plan (see
// planStale). refillAt is when a refill is due (zero: none planned); it is
// set when a pool is short and none was, cleared when no pool is short.
func (e *Engine) replan(refillAt time.Time) (time.Time, time.Duration) {
	e.mu.RLock()
	defer e.mu.RUnlock()
	now := e.opts.Clock.Now()
	clock := now.UnixNano()
	switch short := fsm.NeedsRefill(e.st); {
	case !short:
		refillAt = time.Time{}
	case refillAt.IsZero():
		refillAt = now.Add(e.opts.RefillDelay)
	}
	d := e.opts.TickEvery
	if !refillAt.IsZero() {
		// At least 1 ms: a refill that cannot proceed must not spin.
		d = min(d, max(refillAt.Sub(now), time.Millisecond))
	}
	if at, ok := e.st.NextTimer(); ok {
		if until := time.Duration(at - clock); until < d {
			d = max(until, time.Millisecond)
		}
	}
	e.planTimer.Store(clock + int64(d))
	e.planRefill.Store(!refillAt.IsZero())
	return refillAt, d
}

func (e *Engine) tickIfDue() {
	now := e.opts.Clock.Now().UnixNano()
	e.mu.RLock()
	at, ok := e.st.NextTimer()
	e.mu.RUnlock()
	if !ok || at > now {
		return
	}
	m := e.Meta()
	m.Now = now
	if _, err := e.Propose(context.Background(), fsm.Tick{Meta: m}); err != nil && !errors.Is(err, ErrStopped) {
		e.zl.Warn().Err(err).Msg("engine: tick failed")
	}
}

func (e *Engine) refill() {
	if _, err := e.Propose(context.Background(), fsm.Refill{Meta: e.Meta()}); err != nil && !errors.Is(err, ErrStopped) {
		if _, rejected := fsm.AsRejection(err); !rejected {
			e.zl.Warn().Err(err).Msg("engine: refill failed")
		}
	}
}
