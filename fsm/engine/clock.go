package engine

import "time"

// Clock is the engine's only source of time: the time stamped into commands
// and op ids, the append latency reported to Options.OnAppend, and the timer
// and refill loop's schedule. Tests inject a fake one to move time by hand;
// the default (Options.Clock nil) is the system clock.
type Clock interface {
	Now() time.Time
	// NewTimer returns a started timer that fires once, d from Now.
	NewTimer(d time.Duration) Timer
}

// Timer is the part of *time.Timer the loop uses.
type Timer interface {
	// C delivers the time when the timer fires.
	C() <-chan time.Time
	// Stop and Reset behave as time.Timer's.
	Stop() bool
	Reset(d time.Duration) bool
}

// SystemClock returns the system clock (time.Now and time.NewTimer), the
// default; other clocks may embed it and change only Now.
func SystemClock() Clock { return systemClock{} }

// wallClock is where the engine's time comes from when no clock is
// injected: the one reading of the system clock, at the injection seam.
var wallClock = time.Now

// systemClock is the default Clock: time.Now and time.NewTimer.
type systemClock struct{}

func (systemClock) Now() time.Time                 { return wallClock() }
func (systemClock) NewTimer(d time.Duration) Timer { return systemTimer{time.NewTimer(d)} }

type systemTimer struct{ t *time.Timer }

func (s systemTimer) C() <-chan time.Time        { return s.t.C }
func (s systemTimer) Stop() bool                 { return s.t.Stop() }
func (s systemTimer) Reset(d time.Duration) bool { return s.t.Reset(d) }
