package engine

import (
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sbxlog/sbxlog/fsm"
)

// awaitTimeout bounds every wait for a condition in these tests; reaching it
// is a failure, never a pass.
const awaitTimeout = 10 * time.Second

// fakeClock is a Clock whose time moves only when a test advances it.
//
// A timer is armed d from the time the clock was last read, not from its
// current time. The loop reads the clock, plans, then arms its timer; with a
// real clock hardly any time passes in between. A test may advance a fake one
// right there, and a timer armed from the advanced time would sleep the whole
// jump longer than the loop planned and, since nothing else moves the clock,
// never wake. Armed from the reading the loop planned with, it fires at once
// if its time has passed, and the loop plans again from the new time.
type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	read   time.Time // what Now last returned
	timers []*fakeTimer
	armed  chan struct{} // closed (and replaced) whenever a timer is armed
}

func newFakeClock(now time.Time) *fakeClock {
	return &fakeClock{now: now, read: now, armed: make(chan struct{})}
}

// awaitArmed waits until cond holds, checking it again each time a timer is
// armed: the loop arms its timer at the end of every pass, after it
// published its plan.
func (c *fakeClock) awaitArmed(t *testing.T, what string, cond func() bool) {
	t.Helper()
	timeout := time.After(awaitTimeout)
	for {
		c.mu.Lock()
		armed := c.armed
		c.mu.Unlock()
		if cond() {
			return
		}
		select {
		case <-armed:
		case <-timeout:
			t.Fatalf("%s: not reached within %s", what, awaitTimeout)
		}
	}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.read = c.now
	return c.now
}

func (c *fakeClock) NewTimer(d time.Duration) Timer {
	t := &fakeTimer{c: c, ch: make(chan time.Time, 1)}
	t.Reset(d)
	return t
}

// advance moves the clock by d and fires every timer then due.
func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	c.fireLocked()
}

func (c *fakeClock) fireLocked() {
	for _, t := range c.timers {
		if t.active && !t.at.After(c.now) {
			t.active = false
			select {
			case t.ch <- c.now:
			default:
			}
		}
	}
}

type fakeTimer struct {
	c      *fakeClock
	ch     chan time.Time
	at     time.Time
	active bool
}

func (t *fakeTimer) C() <-chan time.Time { return t.ch }

func (t *fakeTimer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	was := t.active
	t.active = false
	t.drainLocked()
	return was
}

// Reset rearms the timer d from the clock's last reading, dropping a firing
// not yet received (as time.Timer does since Go 1.23).
func (t *fakeTimer) Reset(d time.Duration) bool {
	c := t.c
	c.mu.Lock()
	defer c.mu.Unlock()
	was := t.active
	t.drainLocked()
	t.at, t.active = c.read.Add(d), true
	if !slices.Contains(c.timers, t) {
		c.timers = append(c.timers, t)
	}
	close(c.armed)
	c.armed = make(chan struct{})
	c.fireLocked()
	return was
}

func (t *fakeTimer) drainLocked() {
	select {
	case <-t.ch:
	default:
	}
}

// awaitState waits until cond holds for the state and the log has made
// everything applied durable, checking after every commit the engine hands
// on. It takes over e's commit observer.
func awaitState(t *testing.T, e *Engine, what string, cond func(*fsm.State) bool) {
	t.Helper()
	committed := make(chan struct{}, 1)
	e.SetOnCommit(func(Commit) {
		select {
		case committed <- struct{}{}:
		default:
		}
	})
	timeout := time.After(awaitTimeout)
	for {
		var ok bool
		var applied uint64
		// Views may run ahead of the log by the fsync in flight.
		e.View(func(st *fsm.State) { ok, applied = cond(st), st.Applied() })
		if ok && e.log.LastSeq() >= applied {
			return
		}
		select {
		case <-committed:
		case <-timeout:
			t.Fatalf("%s: not reached within %s", what, awaitTimeout)
		}
	}
}

// The fake clock's contract, which the loop tests rely on.
func TestFakeClock(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	c := newFakeClock(t0)
	tm := c.NewTimer(time.Second)
	fired := func() bool {
		select {
		case <-tm.C():
			return true
		default:
			return false
		}
	}
	c.advance(time.Second - time.Nanosecond)
	if fired() {
		t.Fatal("timer fired before its time")
	}
	c.advance(time.Nanosecond)
	if !fired() {
		t.Fatal("timer did not fire at its time")
	}
	if tm.Stop() {
		t.Fatal("Stop of a fired timer reported it active")
	}
	// Armed from the last reading (t0), not from now (t0+1s): already due.
	if tm.Reset(500 * time.Millisecond) {
		t.Fatal("Reset of a stopped timer reported it active")
	}
	if !fired() {
		t.Fatal("a timer armed from the last reading past its time did not fire at once")
	}
	if got := c.Now(); !got.Equal(t0.Add(time.Second)) {
		t.Fatalf("Now = %v, want %v", got, t0.Add(time.Second))
	}
	tm.Reset(500 * time.Millisecond)
	if fired() {
		t.Fatal("a timer armed from the new reading fired at once")
	}
	if !tm.Stop() {
		t.Fatal("Stop of an armed timer reported it inactive")
	}
	c.advance(time.Second)
	if fired() {
		t.Fatal("a stopped timer fired")
	}
}
