package scheduler

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sbxlog/sbxlog/executors"
	"github.com/sbxlog/sbxlog/fsm"
	"github.com/sbxlog/sbxlog/fsm/engine"
)

// fakeClock is a Clock that moves only when Advance says so.
type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	timers []*fakeTimer
}

type fakeTimer struct {
	c  *fakeClock
	ch chan time.Time
	at time.Time
	on bool
}

var _ engine.Clock = (*fakeClock)(nil)

func newFakeClock() *fakeClock { return &fakeClock{now: time.Unix(1_900_000_000, 0)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) NewTimer(d time.Duration) engine.Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &fakeTimer{c: c, ch: make(chan time.Time, 1)}
	c.timers = append(c.timers, t)
	t.arm(d)
	return t
}

// Advance moves the clock by d and fires the timers due.
func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	for _, t := range c.timers {
		t.fireIfDue()
	}
}

// armed reports whether a timer is set to fire within d from now.
func (c *fakeClock) armed(d time.Duration) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, t := range c.timers {
		if t.on && !t.at.After(c.now.Add(d)) {
			return true
		}
	}
	return false
}

// arm and fireIfDue run with c.mu held.
func (t *fakeTimer) arm(d time.Duration) {
	t.at, t.on = t.c.now.Add(d), true
	t.fireIfDue()
}

func (t *fakeTimer) fireIfDue() {
	if t.on && !t.at.After(t.c.now) {
		t.on = false
		select {
		case t.ch <- t.c.now:
		default:
		}
	}
}

func (t *fakeTimer) C() <-chan time.Time { return t.ch }

func (t *fakeTimer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	was := t.on
	t.on = false
	return was
}

func (t *fakeTimer) Reset(d time.Duration) bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	was := t.on
	t.arm(d)
	return was
}

// durObserver records the durations OpDone reports.
type durObserver struct {
	NopObserver
	mu   sync.Mutex
	durs []time.Duration
}

func (o *durObserver) OpDone(_ fsm.IntentKind, _ Outcome, d time.Duration) {
	o.mu.Lock()
	o.durs = append(o.durs, d)
	o.mu.Unlock()
}

// Backoff waits on the injected clock, operations are timed on it, and
// results are stamped with its time when Now is not given.
func TestSchedulerBackoffOnTheClock(t *testing.T) {
	clk := newFakeClock()
	var mu sync.Mutex
	calls := 0
	d := &fakeDriver{fn: func(context.Context, fsm.Intent) (executors.Result, error) {
		mu.Lock()
		defer mu.Unlock()
		calls++
		if calls == 1 {
			return executors.Result{}, errors.New("transient")
		}
		return executors.Result{}, nil
	}}
	p := newProposer()
	obs := &durObserver{}
	const backoff = 10 * time.Minute
	sc := startScheduler(t, d, p, Options{Clock: clk, Observer: obs, Retry: RetryPolicy{Initial: backoff}})
	sc.Offer([]fsm.Intent{refill("vm-1", 1)})
	waitUntil(t, "the retry scheduled", func() bool { return d.callCount() == 1 && clk.armed(backoff) })
	p.none(t, 30*time.Millisecond) // real time passes, the clock does not
	clk.Advance(backoff)
	cmd, ok := p.next(t).(fsm.VMCloned)
	if !ok || cmd.Now != clk.Now().UnixNano() {
		t.Fatalf("got %#v, want VMCloned stamped %d", cmd, clk.Now().UnixNano())
	}
	waitUntil(t, "op done", func() bool { obs.mu.Lock(); defer obs.mu.Unlock(); return len(obs.durs) == 1 })
	if obs.durs[0] != backoff {
		t.Fatalf("operation took %v on the clock, want %v", obs.durs[0], backoff)
	}
}

// A capacity park holds refills back until the injected clock passes it.
func TestSchedulerParkOnTheClock(t *testing.T) {
	clk := newFakeClock()
	d := &fakeDriver{fn: func(_ context.Context, in fsm.Intent) (executors.Result, error) {
		if in.Subject() == "vm-full" {
			return executors.Result{}, fmt.Errorf("clone_disk: %w", syscall.ENOSPC)
		}
		return executors.Result{}, nil
	}}
	p := newProposer()
	const park = 10 * time.Minute
	sc := startScheduler(t, d, p, Options{Clock: clk, CapacityPark: park})
	sc.Offer([]fsm.Intent{refill("vm-full", 1)})
	if _, ok := p.next(t).(fsm.CapacityFull); !ok {
		t.Fatal("want CapacityFull")
	}
	if _, ok := p.next(t).(fsm.VMCloneFailed); !ok {
		t.Fatal("want VMCloneFailed")
	}
	sc.Offer([]fsm.Intent{refill("vm-refill", 2)})
	waitUntil(t, "the park's end scheduled", func() bool { return clk.armed(park) })
	p.none(t, 30*time.Millisecond)
	clk.Advance(park)
	if c, ok := p.next(t).(fsm.VMCloned); !ok || c.VM != "vm-refill" {
		t.Fatalf("got %#v, want the refill cloned once the park ended", c)
	}
}
