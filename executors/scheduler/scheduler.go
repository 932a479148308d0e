package scheduler

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/sbxlog/sbxlog/eventlog/event"
	"github.com/sbxlog/sbxlog/executors"
	"github.com/sbxlog/sbxlog/fsm"
	"github.com/sbxlog/sbxlog/fsm/engine"
)

// Proposer hands a command to the single writer: Decide, durable append,
// apply. The daemon's engine implements it. A *fsm.Rejection means the
// command no longer fits the state (for a result: it is stale).
type Proposer interface {
	Propose(ctx context.Context, cmd fsm.Command) error
}

// DefaultConcurrency is refill_concurrency's default: NumCPU*2/3 clamped to
// [4, 256].
func DefaultConcurrency() int { return min(max(runtime.NumCPU()*2/3, 4), 256) }

// RetryPolicy says how often and how fast retryable failures are retried.
type RetryPolicy struct {
	// Attempts is the number of driver calls per operation before the
	// failure is reported (default 4). A kind without a failure command (a
	// destroy) has nothing to report, so it is retried without limit.
	Attempts int
	// Initial is the first backoff (default 200 ms); it doubles per attempt
	// up to Max (default 30 s).
	Initial, Max time.Duration
}

// Options configure a Scheduler; zero values take the defaults.
type Options struct {
	// Concurrency bounds operations running at once (DefaultConcurrency).
	Concurrency int
	// Clock schedules backoff and parking, and times operations: the
	// node's clock, the one the engine runs on (default the system clock). Attempt and propose timeouts are context deadlines
	// on the real clock: they bound real I/O.
	Clock engine.Clock
	// Now stamps Meta.Now of proposed commands (default Clock.Now). Backoff
	// and parking are scheduled on Clock's monotonic time, not on Now.
	Now func() time.Time
	// Timeouts bound each driver call per kind (the dispatch table's
	// default, executors.Method.Timeout, for kinds not given).
	Timeouts map[fsm.IntentKind]time.Duration
	Retry    RetryPolicy
	// CapacityPark is how long refill clones are held back after a capacity
	// failure (default fsm.CapacityParkNS, matching the state's park).
	CapacityPark time.Duration
	// ProposeTimeout bounds one Propose call (default 30 s).
	ProposeTimeout time.Duration
	Log            zerolog.Logger
	Observer       Observer
}

// Scheduler runs a Driver for fsm intents; see the package doc.
type Scheduler struct {
	d     executors.Driver
	prop  Proposer
	opt   Options
	start time.Time // monotonic origin for scheduling

	ctx    context.Context // canceled by Shutdown
	cancel context.CancelFunc

	mu        sync.Mutex
	known     map[event.OpID]*op // queued, delayed, running or proposing
	failed    map[event.OpID]struct{}
	ready     opHeap
	delayed   []*op
	running   int
	parkUntil time.Duration // monotonic offset; refills wait until then
	seq       uint64
	closed    bool

	wake     chan struct{}
	wg       sync.WaitGroup
	stopOnce sync.Once
}

// op is one intent's life in the scheduler.
type op struct {
	in     fsm.Intent
	kind   fsm.IntentKind
	method executors.Method
	refill bool
	// endless: the kind has no failure command, so it is retried without
	// limit and a failure for good is only logged.
	endless  bool
	seq      uint64
	attempts int
	readyAt  time.Duration
	first    time.Time // first start, for OpDone
}

// New starts a scheduler; Shutdown stops it.
func New(d executors.Driver, p Proposer, opt Options) *Scheduler {
	if opt.Concurrency <= 0 {
		opt.Concurrency = DefaultConcurrency()
	}
	if opt.Clock == nil {
		opt.Clock = engine.SystemClock()
	}
	if opt.Now == nil {
		opt.Now = opt.Clock.Now
	}
	if opt.Retry.Attempts <= 0 {
		opt.Retry.Attempts = 4
	}
	if opt.Retry.Initial <= 0 {
		opt.Retry.Initial = 200 * time.Millisecond
	}
	if opt.Retry.Max <= 0 {
		opt.Retry.Max = 30 * time.Second
	}
	if opt.CapacityPark <= 0 {
		opt.CapacityPark = time.Duration(fsm.CapacityParkNS)
	}
	if opt.ProposeTimeout <= 0 {
		opt.ProposeTimeout = 30 * time.Second
	}
	if opt.Observer == nil {
		opt.Observer = NopObserver{}
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Scheduler{
		d: d, prop: p, opt: opt, start: opt.Clock.Now(),
		ctx: ctx, cancel: cancel,
		known:  make(map[event.OpID]*op),
		failed: make(map[event.OpID]struct{}),
		wake:   make(chan struct{}, 1),
	}
	s.mu.Lock()
	s.spawnLocked(s.dispatch)
	s.mu.Unlock()
	return s
}

// mono is the time since the scheduler started, on the clock's monotonic
// time.
func (s *Scheduler) mono() time.Duration { return s.opt.Clock.Now().Sub(s.start) }

// timeout bounds one attempt of o: the option for its kind, else the
// dispatch table's default.
func (s *Scheduler) timeout(o *op) time.Duration {
	if t := s.opt.Timeouts[o.kind]; t > 0 {
		return t
	}
	return o.method.Timeout
}

// spawnLocked is the one way the scheduler starts a goroutine, so Shutdown
// can wait for all of them. It refuses after Shutdown began. s.mu must be
// held.
func (s *Scheduler) spawnLocked(fn func()) bool {
	if s.closed {
		return false
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		fn()
	}()
	return true
}

func (s *Scheduler) kick() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// Offer queues intents that are not already queued or running (by op id).
// Intents of a kind the dispatch table does not know are ignored. Intents
// that failed for good in this process are not retried until the next
// start. It never blocks on the driver.
func (s *Scheduler) Offer(intents []fsm.Intent) {
	s.mu.Lock()
	added := 0
	for _, in := range intents {
		if in == nil {
			continue
		}
		m, ok := executors.MethodFor(in.Kind())
		if !ok {
			continue
		}
		id := in.IntentOp()
		if _, ok := s.known[id]; ok {
			continue
		}
		if _, ok := s.failed[id]; ok {
			continue
		}
		if s.closed {
			break
		}
		o := &op{in: in, kind: in.Kind(), method: m, refill: fsm.IsRefill(in),
			endless: in.Failed(fsm.Meta{}, "", false) == nil}
		s.seq++
		o.seq = s.seq
		s.known[id] = o
		heap.Push(&s.ready, o)
		added++
	}
	s.observeLocked()
	s.mu.Unlock()
	if added > 0 {
		s.kick()
	}
}

// Stats returns the number of operations waiting and running.
func (s *Scheduler) Stats() (waiting, running int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.known) - s.running, s.running
}

func (s *Scheduler) observeLocked() {
	s.opt.Observer.Queue(len(s.known)-s.running, s.running)
}

// dispatch starts operations while slots are free, and sleeps until an
// Offer, a finished operation, a backoff or the end of a park.
func (s *Scheduler) dispatch() {
	timer := s.opt.Clock.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		s.mu.Lock()
		now := s.mono()
		kept := s.delayed[:0]
		for _, o := range s.delayed {
			if o.readyAt <= now {
				heap.Push(&s.ready, o)
			} else {
				kept = append(kept, o)
			}
		}
		s.delayed = kept
		var next time.Duration = -1
		for s.running < s.opt.Concurrency && s.ready.Len() > 0 {
			o := s.ready[0]
			if o.refill && now < s.parkUntil {
				// Refills sort last, so nothing startable remains.
				next = s.parkUntil
				break
			}
			heap.Pop(&s.ready)
			s.running++
			if o.first.IsZero() {
				o.first = s.opt.Clock.Now()
			}
			if !s.spawnLocked(func() { s.runOp(o) }) {
				s.running--
				break
			}
		}
		for _, o := range s.delayed {
			if next < 0 || o.readyAt < next {
				next = o.readyAt
			}
		}
		s.observeLocked()
		s.mu.Unlock()

		if !timer.Stop() {
			select {
			case <-timer.C():
			default:
			}
		}
		if next >= 0 {
			timer.Reset(max(next-now, 0))
		}
		select {
		case <-s.ctx.Done():
			return
		case <-s.wake:
		case <-timer.C():
		}
	}
}

// runOp makes one attempt and decides what follows: done, retry later,
// or failure.
func (s *Scheduler) runOp(o *op) {
	actx, cancel := context.WithTimeout(s.ctx, s.timeout(o))
	o.attempts++
	res, err := s.call(actx, o)
	cancel()

	log := s.opt.Log.With().Str("kind", string(o.kind)).Str("op", o.in.IntentOp().String()).Str("id", o.in.Subject()).Int("attempt", o.attempts).Logger()
	switch {
	case err == nil:
		out := fsm.Outcome{SnapshotDir: res.SnapshotDir, Digest: res.Digest, Report: res.Report, Checkpoint: res.Checkpoint}
		s.finish(o, o.in.Succeeded(s.meta(o), out), res, false, log)
	case s.ctx.Err() != nil:
		log.Info().Err(err).Msg("operation interrupted by shutdown; it resumes on the next start")
		s.end(o, OutcomeAbandoned, false)
	case executors.IsCapacity(err):
		log.Warn().Err(err).Msg("node at capacity; refills parked")
		s.park(o)
		s.fail(o, err, log)
	case executors.IsUnrecoverable(err):
		log.Error().Err(err).Msg("operation failed (unrecoverable)")
		s.fail(o, err, log)
	case o.endless || o.attempts < s.opt.Retry.Attempts:
		backoff := s.backoff(o.attempts)
		log.Warn().Err(err).Dur("backoff", backoff).Msg("operation failed; retrying")
		s.opt.Observer.Retry(o.kind, err)
		s.mu.Lock()
		o.readyAt = s.mono() + backoff
		s.delayed = append(s.delayed, o)
		s.running--
		s.observeLocked()
		s.mu.Unlock()
		s.kick()
	default:
		log.Error().Err(err).Msg("operation failed; no attempts left")
		s.fail(o, err, log)
	}
}

// call runs the driver method for o, turning a panic into an unrecoverable
// error: a bug in one recipe must not take the daemon down.
func (s *Scheduler) call(ctx context.Context, o *op) (res executors.Result, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = executors.Unrecoverablef("executor panic: %v", r)
		}
	}()
	return o.method.Call(ctx, s.d, o.in)
}

func (s *Scheduler) backoff(attempts int) time.Duration {
	d := s.opt.Retry.Initial
	for i := 1; i < attempts && d < s.opt.Retry.Max; i++ {
		d *= 2
	}
	return min(d, s.opt.Retry.Max)
}

// park holds refills back and tells the state machine the node is full.
func (s *Scheduler) park(o *op) {
	s.mu.Lock()
	s.parkUntil = s.mono() + s.opt.CapacityPark
	s.mu.Unlock()
	m := fsm.Meta{Op: event.DeriveOpID(o.in.IntentOp(), "capacity"), Now: s.opt.Now().UnixNano()}
	if err := s.propose(fsm.CapacityFull{Meta: m}); err != nil {
		s.opt.Log.Warn().Err(err).Msg("could not record capacity park")
	}
}

// fail reports a final failure; a kind without a failure command (a
// destroy) is only logged, and runs again on the next start.
func (s *Scheduler) fail(o *op, err error, log zerolog.Logger) {
	cmd := o.in.Failed(s.meta(o), err.Error(), executors.IsLost(err))
	if cmd == nil {
		log.Error().Err(err).Msgf("%s failed; it is retried on the next start", o.kind)
		s.end(o, OutcomeFailed, true)
		return
	}
	s.finish(o, cmd, executors.Result{}, true, log)
}

// meta is the Meta of an operation's result: a derived op id, so a re-run
// after a crash proposes the same op and the log dedupes it.
func (s *Scheduler) meta(o *op) fsm.Meta {
	id := o.in.IntentOp()
	return fsm.Meta{Op: event.DeriveOpID(id, "result"), Cause: id, Now: s.opt.Now().UnixNano()}
}

// finish proposes the operation's result and ends it.
func (s *Scheduler) finish(o *op, cmd fsm.Command, res executors.Result, isFailure bool, log zerolog.Logger) {
	err := s.propose(cmd)
	var rej *fsm.Rejection
	switch {
	case errors.As(err, &rej):
		log.Warn().Err(err).Msg("result rejected as stale; dropped")
		s.end(o, OutcomeStale, false)
		return
	case err != nil:
		log.Error().Err(err).Msg("result could not be proposed; the operation re-runs on the next start")
		s.end(o, OutcomeAbandoned, true)
		return
	}
	if isFailure {
		s.end(o, OutcomeFailed, false)
		return
	}
	for _, st := range res.Report.Steps {
		s.opt.Observer.Step(o.kind, st.Name, time.Duration(st.NS))
	}
	if res.AfterCommit != nil {
		after := func() {
			ctx, cancel := context.WithTimeout(context.WithoutCancel(s.ctx), s.timeout(o))
			defer cancel()
			if err := res.AfterCommit(ctx); err != nil {
				log.Warn().Err(err).Msg("post-commit cleanup failed")
			}
		}
		s.mu.Lock()
		spawned := s.spawnLocked(after)
		s.mu.Unlock()
		if !spawned {
			after()
		}
	}
	s.end(o, OutcomeDone, false)
}

// propose calls the proposer, retrying transport failures (not rejections)
// a few times; it gives up when the scheduler shuts down.
func (s *Scheduler) propose(cmd fsm.Command) error {
	var err error
	delay := 50 * time.Millisecond
	for i := 0; i < 5; i++ {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(s.ctx), s.opt.ProposeTimeout)
		err = s.prop.Propose(ctx, cmd)
		cancel()
		var rej *fsm.Rejection
		if err == nil || errors.As(err, &rej) {
			return err
		}
		t := s.opt.Clock.NewTimer(delay)
		select {
		case <-s.ctx.Done():
			t.Stop()
			return err
		case <-t.C():
		}
		delay *= 2
	}
	return err
}

// end forgets a finished operation; failed ones are remembered so a later
// Offer of the same intent does not run it again in this process.
func (s *Scheduler) end(o *op, out Outcome, remember bool) {
	s.opt.Observer.OpDone(o.kind, out, s.opt.Clock.Now().Sub(o.first))
	s.mu.Lock()
	id := o.in.IntentOp()
	delete(s.known, id)
	if remember {
		s.failed[id] = struct{}{}
	}
	s.running--
	s.observeLocked()
	s.mu.Unlock()
	s.kick()
}

// Shutdown stops starting operations, cancels the running ones (their
// recipes roll back or are resumed on the next start) and waits for every
// scheduler goroutine, or for ctx. It is idempotent; later calls wait again.
func (s *Scheduler) Shutdown(ctx context.Context) error {
	s.stopOnce.Do(func() {
		s.mu.Lock()
		s.closed = true
		s.mu.Unlock()
		s.cancel()
	})
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("scheduler: shutdown: %w", ctx.Err())
	}
}

// opHeap orders operations as fsm.Intents does (fsm.CompareIntents), then by
// arrival.
type opHeap []*op

func (h opHeap) Len() int { return len(h) }
func (h opHeap) Less(i, j int) bool {
	if c := fsm.CompareIntents(h[i].in, h[j].in); c != 0 {
		return c < 0
	}
	return h[i].seq < h[j].seq
}
func (h opHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *opHeap) Push(x any)   { *h = append(*h, x.(*op)) }
func (h *opHeap) Pop() any {
	old := *h
	o := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return o
}
