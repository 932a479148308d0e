package executors

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
	"github.com/sbxlog/sbxlog/fsm"
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

// Default per-attempt timeouts.
var DefaultTimeouts = map[Kind]time.Duration{
	KindGolden:    10 * time.Minute,
	KindClone:     2 * time.Minute,
	KindHibernate: 10 * time.Minute,
	KindWake:      2 * time.Minute,
	KindDestroy:   time.Minute,
	KindRestart:   2 * time.Minute,
}

// RetryPolicy says how often and how fast retryable failures are retried.
type RetryPolicy struct {
	// Attempts is the number of driver calls per operation before the
	// failure is reported (default 4). Destroys have no failure command, so
	// they are retried without limit.
	Attempts int
	// Initial is the first backoff (default 200 ms); it doubles per attempt
	// up to Max (default 30 s).
	Initial, Max time.Duration
}

// PoolOptions configure a Pool; zero values take the defaults.
type PoolOptions struct {
	// Concurrency bounds operations running at once (DefaultConcurrency).
	Concurrency int
	// Now stamps Meta.Now of proposed commands (default time.Now). Backoff
	// and parking are scheduled on the monotonic clock, not on Now.
	Now func() time.Time
	// Timeouts bound each driver call per kind (DefaultTimeouts for kinds
	// not given).
	Timeouts map[Kind]time.Duration
	Retry    RetryPolicy
	// CapacityPark is how long refill clones are held back after a capacity
	// failure (default fsm.CapacityParkNS, matching the state's park).
	CapacityPark time.Duration
	// ProposeTimeout bounds one Propose call (default 30 s).
	ProposeTimeout time.Duration
	Log            zerolog.Logger
	Observer       Observer
}

// Pool runs a Driver for fsm intents; see the package doc.
type Pool struct {
	d     Driver
	prop  Proposer
	opt   PoolOptions
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

// op is one intent's life in the pool.
type op struct {
	in       fsm.Intent
	kind     Kind
	refill   bool
	id       string
	seq      uint64
	attempts int
	readyAt  time.Duration
	first    time.Time // first start, for OpDone
}

// isRefill reports a refill clone: the class capacity parking holds back.
func isRefill(in fsm.Intent) bool {
	c, ok := in.(fsm.CloneVM)
	return ok && c.ForClaim == ""
}

// NewPool starts a pool; Shutdown stops it.
func NewPool(d Driver, p Proposer, opt PoolOptions) *Pool {
	if opt.Concurrency <= 0 {
		opt.Concurrency = DefaultConcurrency()
	}
	if opt.Now == nil {
		opt.Now = time.Now
	}
	to := make(map[Kind]time.Duration, len(DefaultTimeouts))
	for k, v := range DefaultTimeouts {
		to[k] = v
	}
	for k, v := range opt.Timeouts {
		if v > 0 {
			to[k] = v
		}
	}
	opt.Timeouts = to
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
	pl := &Pool{
		d: d, prop: p, opt: opt, start: time.Now(),
		ctx: ctx, cancel: cancel,
		known:  make(map[event.OpID]*op),
		failed: make(map[event.OpID]struct{}),
		wake:   make(chan struct{}, 1),
	}
	pl.mu.Lock()
	pl.spawnLocked(pl.dispatch)
	pl.mu.Unlock()
	return pl
}

// mono is the time since the pool started, on the monotonic clock.
func (p *Pool) mono() time.Duration { return time.Since(p.start) }

// spawnLocked is the one way the pool starts a goroutine, so Shutdown can
// wait for all of them. It refuses after Shutdown began. p.mu must be held.
func (p *Pool) spawnLocked(fn func()) bool {
	if p.closed {
		return false
	}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		fn()
	}()
	return true
}

func (p *Pool) kick() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// Offer queues intents that are not already queued or running (by op id).
// Intents that failed for good in this process are not retried until the
// next start. It never blocks on the driver.
func (p *Pool) Offer(intents []fsm.Intent) {
	p.mu.Lock()
	added := 0
	for _, in := range intents {
		if in == nil || KindOf(in) == "" {
			continue
		}
		id := in.IntentOp()
		if _, ok := p.known[id]; ok {
			continue
		}
		if _, ok := p.failed[id]; ok {
			continue
		}
		if p.closed {
			break
		}
		o := &op{in: in, kind: KindOf(in), refill: isRefill(in), id: intentID(in)}
		p.seq++
		o.seq = p.seq
		p.known[id] = o
		heap.Push(&p.ready, o)
		added++
	}
	p.observeLocked()
	p.mu.Unlock()
	if added > 0 {
		p.kick()
	}
}

// Stats returns the number of operations waiting and running.
func (p *Pool) Stats() (waiting, running int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.known) - p.running, p.running
}

func (p *Pool) observeLocked() {
	p.opt.Observer.Queue(len(p.known)-p.running, p.running)
}

// dispatch starts operations while slots are free, and sleeps until an
// Offer, a finished operation, a backoff or the end of a park.
func (p *Pool) dispatch() {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		p.mu.Lock()
		now := p.mono()
		kept := p.delayed[:0]
		for _, o := range p.delayed {
			if o.readyAt <= now {
				heap.Push(&p.ready, o)
			} else {
				kept = append(kept, o)
			}
		}
		p.delayed = kept
		var next time.Duration = -1
		for p.running < p.opt.Concurrency && p.ready.Len() > 0 {
			o := p.ready[0]
			if o.refill && now < p.parkUntil {
				// Refills sort last, so nothing startable remains.
				next = p.parkUntil
				break
			}
			heap.Pop(&p.ready)
			p.running++
			if o.first.IsZero() {
				o.first = time.Now()
			}
			if !p.spawnLocked(func() { p.runOp(o) }) {
				p.running--
				break
			}
		}
		for _, o := range p.delayed {
			if next < 0 || o.readyAt < next {
				next = o.readyAt
			}
		}
		p.observeLocked()
		p.mu.Unlock()

		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		if next >= 0 {
			timer.Reset(max(next-now, 0))
		}
		select {
		case <-p.ctx.Done():
			return
		case <-p.wake:
		case <-timer.C:
		}
	}
}

// runOp makes one attempt and decides what follows: done, retry later,
// or failure.
func (p *Pool) runOp(o *op) {
	timeout := p.opt.Timeouts[o.kind]
	actx, cancel := context.WithTimeout(p.ctx, timeout)
	o.attempts++
	res, err := p.call(actx, o.in)
	cancel()

	log := p.opt.Log.With().Str("kind", string(o.kind)).Str("op", o.in.IntentOp().String()).Str("id", o.id).Int("attempt", o.attempts).Logger()
	switch {
	case err == nil:
		p.finish(o, success(o.in, p.meta(o), res), res, false, log)
	case p.ctx.Err() != nil:
		log.Info().Err(err).Msg("operation interrupted by shutdown; it resumes on the next start")
		p.end(o, OutcomeAbandoned, false)
	case IsCapacity(err):
		log.Warn().Err(err).Msg("node at capacity; refills parked")
		p.park(o)
		p.fail(o, err, log)
	case IsUnrecoverable(err):
		log.Error().Err(err).Msg("operation failed (unrecoverable)")
		p.fail(o, err, log)
	case o.kind == KindDestroy || o.attempts < p.opt.Retry.Attempts:
		backoff := p.backoff(o.attempts)
		log.Warn().Err(err).Dur("backoff", backoff).Msg("operation failed; retrying")
		p.opt.Observer.Retry(o.kind, err)
		p.mu.Lock()
		o.readyAt = p.mono() + backoff
		p.delayed = append(p.delayed, o)
		p.running--
		p.observeLocked()
		p.mu.Unlock()
		p.kick()
	default:
		log.Error().Err(err).Msg("operation failed; no attempts left")
		p.fail(o, err, log)
	}
}

// call runs the driver method for in, turning a panic into an unrecoverable
// error: a bug in one recipe must not take the daemon down.
func (p *Pool) call(ctx context.Context, in fsm.Intent) (res Result, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = Unrecoverablef("executor panic: %v", r)
		}
	}()
	switch t := in.(type) {
	case fsm.BuildGolden:
		return p.d.BuildGolden(ctx, t)
	case fsm.CloneVM:
		return p.d.Clone(ctx, t)
	case fsm.HibernateVM:
		return p.d.Hibernate(ctx, t)
	case fsm.WakeVM:
		return p.d.Wake(ctx, t)
	case fsm.DestroyVM:
		return p.d.Destroy(ctx, t)
	case fsm.RestartVM:
		if r, ok := p.d.(Restarter); ok {
			return r.Restart(ctx, t)
		}
		return res, Unrecoverablef("restart %s: this hypervisor driver cannot restart VMs", t.VM)
	}
	return res, Unrecoverablef("unknown intent %T", in)
}

func (p *Pool) backoff(attempts int) time.Duration {
	d := p.opt.Retry.Initial
	for i := 1; i < attempts && d < p.opt.Retry.Max; i++ {
		d *= 2
	}
	return min(d, p.opt.Retry.Max)
}

// park holds refills back and tells the state machine the node is full.
func (p *Pool) park(o *op) {
	p.mu.Lock()
	p.parkUntil = p.mono() + p.opt.CapacityPark
	p.mu.Unlock()
	m := fsm.Meta{Op: event.DeriveOpID(o.in.IntentOp(), "capacity"), Now: p.opt.Now().UnixNano()}
	if err := p.propose(fsm.CapacityFull{Meta: m}); err != nil {
		p.opt.Log.Warn().Err(err).Msg("could not record capacity park")
	}
}

// fail reports a final failure (destroys have no failure command).
func (p *Pool) fail(o *op, err error, log zerolog.Logger) {
	if o.kind == KindDestroy {
		log.Error().Err(err).Msg("destroy failed; it is retried on the next start")
		p.end(o, OutcomeFailed, true)
		return
	}
	p.finish(o, failure(o.in, p.meta(o), err), Result{}, true, log)
}

// meta is the Meta of an operation's result: a derived op id, so a re-run
// after a crash proposes the same op and the log dedupes it.
func (p *Pool) meta(o *op) fsm.Meta {
	id := o.in.IntentOp()
	return fsm.Meta{Op: event.DeriveOpID(id, "result"), Cause: id, Now: p.opt.Now().UnixNano()}
}

// finish proposes the operation's result and ends it.
func (p *Pool) finish(o *op, cmd fsm.Command, res Result, isFailure bool, log zerolog.Logger) {
	err := p.propose(cmd)
	var rej *fsm.Rejection
	switch {
	case errors.As(err, &rej):
		log.Warn().Err(err).Msg("result rejected as stale; dropped")
		p.end(o, OutcomeStale, false)
		return
	case err != nil:
		log.Error().Err(err).Msg("result could not be proposed; the operation re-runs on the next start")
		p.end(o, OutcomeAbandoned, true)
		return
	}
	if isFailure {
		p.end(o, OutcomeFailed, false)
		return
	}
	for _, s := range res.Report.Steps {
		p.opt.Observer.Step(o.kind, s.Name, time.Duration(s.NS))
	}
	if res.AfterCommit != nil {
		after := func() {
			ctx, cancel := context.WithTimeout(context.WithoutCancel(p.ctx), p.opt.Timeouts[o.kind])
			defer cancel()
			if err := res.AfterCommit(ctx); err != nil {
				log.Warn().Err(err).Msg("post-commit cleanup failed")
			}
		}
		p.mu.Lock()
		spawned := p.spawnLocked(after)
		p.mu.Unlock()
		if !spawned {
			after()
		}
	}
	p.end(o, OutcomeDone, false)
}

// propose calls the proposer, retrying transport failures (not rejections)
// a few times; it gives up when the pool shuts down.
func (p *Pool) propose(cmd fsm.Command) error {
	var err error
	delay := 50 * time.Millisecond
	for i := 0; i < 5; i++ {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(p.ctx), p.opt.ProposeTimeout)
		err = p.prop.Propose(ctx, cmd)
		cancel()
		var rej *fsm.Rejection
		if err == nil || errors.As(err, &rej) {
			return err
		}
		select {
		case <-p.ctx.Done():
			return err
		case <-time.After(delay):
		}
		delay *= 2
	}
	return err
}

// end forgets a finished operation; failed ones are remembered so a later
// Offer of the same intent does not run it again in this process.
func (p *Pool) end(o *op, out Outcome, remember bool) {
	p.opt.Observer.OpDone(o.kind, out, time.Since(o.first))
	p.mu.Lock()
	id := o.in.IntentOp()
	delete(p.known, id)
	if remember {
		p.failed[id] = struct{}{}
	}
	p.running--
	p.observeLocked()
	p.mu.Unlock()
	p.kick()
}

// Shutdown stops starting operations, cancels the running ones (their
// recipes roll back or are resumed on the next start) and waits for every
// pool goroutine, or for ctx. It is idempotent; later calls wait again.
func (p *Pool) Shutdown(ctx context.Context) error {
	p.stopOnce.Do(func() {
		p.mu.Lock()
		p.closed = true
		p.mu.Unlock()
		p.cancel()
	})
	done := make(chan struct{})
	go func() { p.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("executors: pool shutdown: %w", ctx.Err())
	}
}

// success builds the result command of a successful operation.
func success(in fsm.Intent, m fsm.Meta, res Result) fsm.Command {
	rep := res.Report
	switch t := in.(type) {
	case fsm.BuildGolden:
		return fsm.GoldenBuilt{Meta: m, Key: t.Key, SnapshotDir: res.SnapshotDir, Report: &rep}
	case fsm.CloneVM:
		return fsm.VMCloned{Meta: m, VM: t.VM, Report: &rep}
	case fsm.HibernateVM:
		return fsm.HibernateDone{Meta: m, VM: t.VM, SnapshotDir: res.SnapshotDir, Report: &rep}
	case fsm.WakeVM:
		return fsm.WakeDone{Meta: m, VM: t.VM, Report: &rep}
	case fsm.DestroyVM:
		return fsm.VMDestroyed{Meta: m, VM: t.VM, Report: &rep}
	case fsm.RestartVM:
		return fsm.VMRestarted{Meta: m, VM: t.VM, Report: &rep}
	}
	return nil
}

// failure builds the failure command of an operation.
func failure(in fsm.Intent, m fsm.Meta, err error) fsm.Command {
	msg := err.Error()
	lost := IsLost(err)
	switch t := in.(type) {
	case fsm.BuildGolden:
		return fsm.GoldenFailed{Meta: m, Key: t.Key, Error: msg}
	case fsm.CloneVM:
		return fsm.VMCloneFailed{Meta: m, VM: t.VM, Error: msg}
	case fsm.HibernateVM:
		return fsm.HibernateFailed{Meta: m, VM: t.VM, Error: msg, Lost: lost}
	case fsm.WakeVM:
		return fsm.WakeFailed{Meta: m, VM: t.VM, Error: msg, Lost: lost}
	case fsm.RestartVM:
		return fsm.VMRestartFailed{Meta: m, VM: t.VM, Error: msg}
	}
	return nil
}

// intentID is the id intents are logged under: the VM, or the golden's key.
func intentID(in fsm.Intent) string {
	switch t := in.(type) {
	case fsm.CloneVM:
		return t.VM
	case fsm.WakeVM:
		return t.VM
	case fsm.HibernateVM:
		return t.VM
	case fsm.DestroyVM:
		return t.VM
	case fsm.RestartVM:
		return t.VM
	case fsm.BuildGolden:
		return t.Key.String()
	}
	return ""
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
