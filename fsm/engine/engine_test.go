package engine

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sbxlog/sbxlog/eventlog"
	"github.com/sbxlog/sbxlog/eventlog/event"
	"github.com/sbxlog/sbxlog/fsm"
)

var key = fsm.PoolKey{Template: "default", Net: "none", Size: "small"}

func newEngine(t *testing.T, dir string, opts Options) (*Engine, *eventlog.Log) {
	t.Helper()
	l, err := eventlog.Open(dir, eventlog.Options{NodeID: "n1"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	res, err := Rebuild(l, RebuildOptions{})
	if err != nil {
		t.Fatal(err)
	}
	e := New(l, res.State, opts)
	t.Cleanup(e.Shutdown)
	return e, l
}

func mustPropose(t *testing.T, e *Engine, cmd fsm.Command) Result {
	t.Helper()
	r, err := e.Propose(context.Background(), cmd)
	if err != nil {
		t.Fatalf("Propose(%T): %v", cmd, err)
	}
	return r
}

func setup(t *testing.T, e *Engine, warm int) {
	mustPropose(t, e, fsm.ConfigureNode{Meta: e.Meta(), Node: "n1", Instance: "i1"})
	mustPropose(t, e, fsm.ConfigurePools{Meta: e.Meta(), Pools: []fsm.PoolSpec{{PoolKey: key, Warm: warm}}})
}

// fillWarm answers every intent as an executor would, until the pool is warm.
func fillWarm(t *testing.T, e *Engine) {
	t.Helper()
	for i := 0; i < 10; i++ {
		mustPropose(t, e, fsm.Refill{Meta: e.Meta()})
		for _, in := range e.Intents() {
			m := e.Meta()
			m.Cause = in.IntentOp()
			switch in := in.(type) {
			case fsm.BuildGolden:
				mustPropose(t, e, fsm.GoldenBuilt{Meta: m, Key: in.Key, SnapshotDir: "goldens/x"})
			case fsm.CloneVM:
				mustPropose(t, e, fsm.VMCloned{Meta: m, VM: in.VM})
			}
		}
	}
}

func TestConcurrentProposalsMatchReplay(t *testing.T) {
	dir := t.TempDir()
	var commits []Commit
	var cmu sync.Mutex
	e, l := newEngine(t, dir, Options{OnCommit: func(c Commit) { cmu.Lock(); commits = append(commits, c); cmu.Unlock() }})
	setup(t, e, 40)
	fillWarm(t, e)
	var info fsm.Info
	e.View(func(st *fsm.State) { info = st.Info() })
	if info.Pools[0].Warm != 40 {
		t.Fatalf("warm = %d, want 40", info.Pools[0].Warm)
	}

	// 40 concurrent warm claims, plus renews racing them.
	var wg sync.WaitGroup
	errs := make(chan error, 80)
	for i := 0; i < 40; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := fmt.Sprintf("sb_%016x", i+1)
			if _, err := e.Propose(context.Background(), fsm.Claim{Meta: e.Meta(), ID: id, Key: key}); err != nil {
				errs <- err
				return
			}
			if _, err := e.Propose(context.Background(), fsm.Renew{Meta: e.Meta(), Claim: id, TTLSeconds: 600}); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	var live int
	var liveHash string
	e.View(func(st *fsm.State) { live = st.LiveClaims(); liveHash = fsm.HashHex(st) })
	if live != 40 {
		t.Fatalf("live claims = %d, want 40", live)
	}
	// Commits reached the observer in log order with no gap.
	cmu.Lock()
	var next uint64 = commits[0].Events[0].Seq
	for _, c := range commits {
		for _, ev := range c.Events {
			if ev.Seq != next {
				t.Fatalf("observer saw seq %d, want %d", ev.Seq, next)
			}
			next++
		}
	}
	cmu.Unlock()
	if next-1 != l.LastSeq() {
		t.Fatalf("observer ended at %d, log at %d", next-1, l.LastSeq())
	}
	// The state built by concurrent proposals is the state the log replays to.
	res, err := Rebuild(l, RebuildOptions{NoSnapshot: true})
	if err != nil {
		t.Fatal(err)
	}
	if got := fsm.HashHex(res.State); got != liveHash {
		t.Fatalf("replay hash %s != live hash %s", got, liveHash)
	}
}

func TestRejectionIsNotAnAppendError(t *testing.T) {
	e, l := newEngine(t, t.TempDir(), Options{})
	setup(t, e, 0)
	before := l.LastSeq()
	_, err := e.Propose(context.Background(), fsm.Release{Meta: e.Meta(), Claim: "sb_0000000000000001"})
	rej, ok := fsm.AsRejection(err)
	if !ok || rej.Code != fsm.NotFound {
		t.Fatalf("err = %v, want a NotFound rejection", err)
	}
	var ae *AppendError
	if errors.As(err, &ae) {
		t.Fatal("a rejection was reported as an append failure")
	}
	if l.LastSeq() != before {
		t.Fatal("a rejected command wrote to the log")
	}
}

func TestAppendFailureStopsEngine(t *testing.T) {
	e, l := newEngine(t, t.TempDir(), Options{})
	setup(t, e, 0)
	_ = l.Close()
	_, err := e.Propose(context.Background(), fsm.ConfigurePools{Meta: e.Meta(), Pools: []fsm.PoolSpec{{PoolKey: key, Warm: 1}}})
	var ae *AppendError
	if !errors.As(err, &ae) {
		t.Fatalf("err = %v, want *AppendError", err)
	}
	if _, ok := fsm.AsRejection(err); ok {
		t.Fatal("append failure reported as a rejection")
	}
}

// The timer loop proposes a Tick when a lease expires: the claim is reaped.
func TestTimerLoopReaps(t *testing.T) {
	clock := newFakeClock(time.Unix(1_800_000_000, 0))
	e, _ := newEngine(t, t.TempDir(), Options{Clock: clock})
	setup(t, e, 1)
	fillWarm(t, e)
	mustPropose(t, e, fsm.Claim{Meta: e.Meta(), ID: "sb_00000000000000aa", Key: key, TTLSeconds: 10})
	e.Start()
	clock.advance(11 * time.Second)
	awaitState(t, e, "claim expired after its lease ended", func(s *fsm.State) bool {
		c, _ := s.Claim("sb_00000000000000aa")
		return c.Status == fsm.ClaimExpired
	})
}

func TestShutdownIsIdempotentAndRefuses(t *testing.T) {
	e, _ := newEngine(t, t.TempDir(), Options{})
	e.Start()
	e.Shutdown()
	e.Shutdown()
	if _, err := e.Propose(context.Background(), fsm.Tick{Meta: e.Meta()}); !errors.Is(err, ErrStopped) {
		t.Fatalf("err = %v, want ErrStopped", err)
	}
}

// The refill loop waits RefillDelay after a pool falls short, so claims made
// meanwhile are answered by one Refill op, and then refills them all.
func TestRefillDelayCoalescesClaims(t *testing.T) {
	const delay = time.Second
	clock := newFakeClock(time.Unix(1_800_000_000, 0))
	e, l := newEngine(t, t.TempDir(), Options{Clock: clock, RefillDelay: delay})
	setup(t, e, 3)
	fillWarm(t, e)
	e.Start()
	from := l.LastSeq() + 1
	began := clock.Now()
	for _, id := range []string{"sb_00000000000000a1", "sb_00000000000000a2", "sb_00000000000000a3"} {
		mustPropose(t, e, fsm.Claim{Meta: e.Meta(), ID: id, Key: key})
	}
	refilling := func(st *fsm.State) int { return st.Info().Pools[0].Refilling }
	// The loop noticed the short pool and planned its refill before the
	// clock moves: the delay runs from there.
	clock.awaitArmed(t, "refill planned", e.planRefill.Load)
	// Just short of the delay no pass of the loop can refill: the clock
	// reads less than RefillDelay since the first claim.
	clock.advance(delay - time.Nanosecond)
	var early int
	e.View(func(st *fsm.State) { early = refilling(st) })
	if early != 0 {
		t.Fatalf("refilling = %d before RefillDelay %s had passed since the first claim", early, delay)
	}
	clock.advance(time.Nanosecond)
	awaitState(t, e, "refilling = 3 after the delay", func(st *fsm.State) bool { return refilling(st) == 3 })
	evs, err := l.Read(from, 1000)
	if err != nil {
		t.Fatal(err)
	}
	ops := map[string]int{}
	for _, ev := range evs {
		if ev.Type == event.TypeVMCloneRequested {
			ops[ev.OpID.String()]++
			if waited := time.Duration(ev.Time - began.UnixNano()); waited < delay {
				t.Fatalf("refill proposed %s after the first claim, before RefillDelay %s", waited, delay)
			}
		}
	}
	if len(ops) != 1 {
		t.Fatalf("clone requests in %d ops (%v), want one Refill for the three claims", len(ops), ops)
	}
}

// ProposeNew mints a fresh op id per command (the log skips its duplicate
// probe for it) and otherwise behaves as Propose: durable applied events,
// and a rejection that writes nothing.
func TestProposeNew(t *testing.T) {
	e, l := newEngine(t, t.TempDir(), Options{})
	setup(t, e, 2)
	fillWarm(t, e)
	ops := map[event.OpID]bool{}
	for _, id := range []string{"sb_00000000000000b1", "sb_00000000000000b2"} {
		res, err := e.ProposeNew(context.Background(), func(m fsm.Meta) fsm.Command { return fsm.Claim{Meta: m, ID: id, Key: key} }, Hooks{})
		if err != nil || len(res.Events) == 0 {
			t.Fatalf("ProposeNew claim %s: %v, %v", id, res, err)
		}
		if ops[res.Events[0].OpID] {
			t.Fatalf("op id %s minted twice", res.Events[0].OpID)
		}
		ops[res.Events[0].OpID] = true
		stored, err := l.Read(res.Events[0].Seq, 1)
		if err != nil || len(stored) != 1 || stored[0].OpID != res.Events[0].OpID {
			t.Fatalf("log at %d: %v, %v", res.Events[0].Seq, stored, err)
		}
		var st fsm.ClaimStatus
		e.View(func(s *fsm.State) { c, _ := s.Claim(id); st = c.Status })
		if st != fsm.ClaimRunning {
			t.Fatalf("claim %s is %v, want running", id, st)
		}
	}
	last := l.LastSeq()
	_, err := e.ProposeNew(context.Background(), func(m fsm.Meta) fsm.Command { return fsm.Claim{Meta: m, ID: "sb_00000000000000b1", Key: key} }, Hooks{})
	if _, ok := fsm.AsRejection(err); !ok {
		t.Fatalf("claim of a taken id: %v, want a rejection", err)
	}
	if l.LastSeq() != last {
		t.Fatal("a rejected ProposeNew wrote to the log")
	}
}

// A commit wakes the timer/refill loop only when the loop's plan no longer
// holds; a warm claim into a pool already waiting for its refill, whose
// lease ends after the next planned wake-up, leaves the loop asleep.
func TestCommitWakesTheLoopOnlyWhenItsPlanIsStale(t *testing.T) {
	e, _ := newEngine(t, t.TempDir(), Options{TickEvery: time.Hour, RefillDelay: time.Hour})
	setup(t, e, 4)
	fillWarm(t, e)
	// The loop is not started: pokes stay in the channel, and replan does
	// what the loop does after each pass.
	var refillAt time.Time
	poked := func(cmd func(fsm.Meta) fsm.Command) bool {
		t.Helper()
		select {
		case <-e.wake:
		default:
		}
		if _, err := e.ProposeNew(context.Background(), cmd, Hooks{}); err != nil {
			t.Fatal(err)
		}
		select {
		case <-e.wake:
			return true
		default:
			return false
		}
	}
	claim := func(id string, ttl int64) func(fsm.Meta) fsm.Command {
		return func(m fsm.Meta) fsm.Command { return fsm.Claim{Meta: m, ID: id, Key: key, TTLSeconds: ttl} }
	}
	refillAt, _ = e.replan(refillAt)
	if !refillAt.IsZero() {
		t.Fatal("a full pool got a refill planned")
	}
	if !poked(claim("sb_00000000000000c1", 600)) {
		t.Fatal("the first claim left the pool short with no refill planned, yet did not wake the loop")
	}
	refillAt, d := e.replan(refillAt)
	if refillAt.IsZero() || d > 600*time.Second {
		t.Fatalf("after the first claim the loop plans refill %v and a wake-up in %v", refillAt, d)
	}
	if poked(claim("sb_00000000000000c2", 900)) {
		t.Fatal("a claim changing nothing the loop planned woke it")
	}
	if !poked(claim("sb_00000000000000c3", 60)) {
		t.Fatal("a claim whose lease ends before the planned wake-up did not wake the loop")
	}
	refillAt, d = e.replan(refillAt)
	if d > 60*time.Second {
		t.Fatalf("after the short lease the loop sleeps %v", d)
	}
	if poked(claim("sb_00000000000000c4", 900)) {
		t.Fatal("a later lease woke the loop")
	}
}

// ProposeNew's hooks run once each, in order: Prepare after the events are
// applied (it sees them through View), Durable once they are durable and
// before the commit observer hears of them; neither for a rejection.
func TestProposeNewHooks(t *testing.T) {
	var mu sync.Mutex
	var order []string
	note := func(s string) {
		mu.Lock()
		defer mu.Unlock()
		order = append(order, s)
	}
	e, l := newEngine(t, t.TempDir(), Options{})
	setup(t, e, 1)
	fillWarm(t, e)
	const id = "sb_00000000000000d1"
	e.SetOnCommit(func(c Commit) {
		for _, ev := range c.Events {
			if ev.AggID == id {
				note("commit")
				return
			}
		}
	})
	ctx := context.Background()
	claim := func(m fsm.Meta) fsm.Command { return fsm.Claim{Meta: m, ID: id, Key: key} }
	var seen fsm.ClaimStatus
	var appliedAt, durableAt uint64
	res, err := e.ProposeNew(ctx, claim, Hooks{
		Prepare: func() {
			note("prepare")
			e.View(func(s *fsm.State) { c, _ := s.Claim(id); seen = c.Status; appliedAt = s.Applied() })
		},
		Durable: func() {
			note("durable")
			durableAt = l.LastSeq()
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	last := res.Events[len(res.Events)-1].Seq
	if want := []string{"prepare", "durable", "commit"}; !slices.Equal(order, want) {
		t.Fatalf("hooks and observer ran as %v, want %v", order, want)
	}
	if seen != fsm.ClaimRunning || appliedAt < last {
		t.Fatalf("prepare saw the claim %v at applied seq %d, want running at %d", seen, appliedAt, last)
	}
	if durableAt < last {
		t.Fatalf("durable ran with the log published to %d, before the claim's seq %d", durableAt, last)
	}
	order = nil
	if _, err := e.ProposeNew(ctx, claim, Hooks{Prepare: func() { note("prepare") }, Durable: func() { note("durable") }}); err == nil {
		t.Fatal("a second claim of the same id was accepted")
	}
	if len(order) != 0 {
		t.Fatalf("hooks ran for a rejected command: %v", order)
	}
}

// Two proposals sharing an fsync record their commits in either order.
// The observer must still get both, in sequence order, even when the later
// one is the first commit this engine hands on (a restarted daemon's first
// API write racing its refill loop once lost the API write's intents).
func TestCommitsReachTheObserverInOrderFromTheFirst(t *testing.T) {
	dir := t.TempDir()
	e, l := newEngine(t, dir, Options{})
	setup(t, e, 1)
	e.Shutdown()
	// A fresh engine over the same log, as after a restart.
	res, err := Rebuild(l, RebuildOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var got []uint64
	e2 := New(l, res.State, Options{OnCommit: func(c Commit) {
		for _, ev := range c.Events {
			got = append(got, ev.Seq)
		}
	}})
	t.Cleanup(e2.Shutdown)
	base := res.State.Applied()
	commit := func(seq uint64) {
		e2.recordCommit(Commit{Events: []event.Event{{Seq: seq}}})
		e2.deliverCommits()
	}
	commit(base + 2)
	if len(got) != 0 {
		t.Fatalf("seq %d was handed on before seq %d: %v", base+2, base+1, got)
	}
	commit(base + 1)
	commit(base + 3)
	if want := []uint64{base + 1, base + 2, base + 3}; !slices.Equal(got, want) {
		t.Fatalf("observer got seqs %v, want %v", got, want)
	}
}

// A Durable hook that blocks (a client not reading its reply) holds up only
// its own proposal: the next proposal hands both commits to the observer,
// in order, before it returns.
func TestBlockedDurableHoldsUpNoOtherObserver(t *testing.T) {
	e, _ := newEngine(t, t.TempDir(), Options{})
	setup(t, e, 2)
	fillWarm(t, e)
	observed := observe(e)
	claimsSeen := func() []string {
		var ids []string
		for _, ev := range observed() {
			if ev.Type == event.TypeClaimCreated {
				ids = append(ids, ev.AggID)
			}
		}
		return ids
	}
	claim := func(id string) func(fsm.Meta) fsm.Command {
		return func(m fsm.Meta) fsm.Command { return fsm.Claim{Meta: m, ID: id, Key: key} }
	}
	const a, b = "sb_00000000000000e1", "sb_00000000000000e2"
	inDurable, release := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		_, err := e.ProposeNew(context.Background(), claim(a), Hooks{Durable: func() {
			close(inDurable)
			<-release
		}})
		done <- err
	}()
	<-inDurable
	if _, err := e.ProposeNew(context.Background(), claim(b), Hooks{}); err != nil {
		t.Fatal(err)
	}
	seen := claimsSeen()
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if want := []string{a, b}; !slices.Equal(seen, want) {
		t.Fatalf("with %s's Durable blocked, the observer had %v once %s returned; want %v", a, seen, b, want)
	}
}

// Concurrent proposals reach the observer exactly once each, in sequence
// order, however their fsync waits and deliveries interleave.
func TestObserverSeesConcurrentCommitsInOrder(t *testing.T) {
	e, _ := newEngine(t, t.TempDir(), Options{})
	setup(t, e, 0)
	observed := observe(e)
	first := e.log.LastSeq() + 1
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 40; i++ {
				if _, err := e.ProposeNew(context.Background(), func(m fsm.Meta) fsm.Command {
					return fsm.ConfigureLimits{Meta: m, MaxClaims: g*100 + i + 1}
				}, Hooks{Durable: runtime.Gosched}); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	var seqs []uint64
	for _, ev := range observed() {
		seqs = append(seqs, ev.Seq)
	}
	last := e.log.LastSeq()
	if uint64(len(seqs)) != last-first+1 {
		t.Fatalf("observer saw %d events, the log has %d new ones", len(seqs), last-first+1)
	}
	for i, s := range seqs {
		if s != first+uint64(i) {
			t.Fatalf("observer saw seq %d at position %d, want %d (got %v...)", s, i, first+uint64(i), seqs[:min(i+1, 20)])
		}
	}
}

// observe makes e's commit observer record every event it is handed; the
// returned func gives a copy of them so far.
func observe(e *Engine) func() []event.Event {
	var mu sync.Mutex
	var evs []event.Event
	e.SetOnCommit(func(c Commit) {
		mu.Lock()
		defer mu.Unlock()
		evs = append(evs, c.Events...)
	})
	return func() []event.Event {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(evs)
	}
}
