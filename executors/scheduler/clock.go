package scheduler

import "time"

// Clock is the scheduler's time source: operation start and end times,
// backoff, capacity parks and the delays between propose retries. Tests
// inject a fake to drive these without sleeping; RealClock is the default.
type Clock interface {
	// Now returns the current time; the scheduler only takes differences
	// of its values (monotonic with the real clock).
	Now() time.Time
	// NewTimer returns a timer that fires once d has passed.
	NewTimer(d time.Duration) Timer
}

// Timer is the part of *time.Timer the scheduler uses.
type Timer interface {
	C() <-chan time.Time
	Stop() bool
	Reset(d time.Duration) bool
}

// RealClock is the system clock.
type RealClock struct{}

var _ Clock = RealClock{}

func (RealClock) Now() time.Time { return time.Now() }

func (RealClock) NewTimer(d time.Duration) Timer { return realTimer{time.NewTimer(d)} }

type realTimer struct{ t *time.Timer }

func (r realTimer) C() <-chan time.Time        { return r.t.C }
func (r realTimer) Stop() bool                 { return r.t.Stop() }
func (r realTimer) Reset(d time.Duration) bool { return r.t.Reset(d) }
