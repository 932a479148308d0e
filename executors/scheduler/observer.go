package scheduler

import (
	"time"

	"github.com/sbxlog/sbxlog/fsm"
)

// Outcome is how an operation ended in the scheduler.
type Outcome string

// Outcomes.
const (
	// OutcomeDone: the driver succeeded and its result was proposed.
	OutcomeDone Outcome = "done"
	// OutcomeFailed: the driver failed for good and the failure was proposed
	// (or, for a destroy, logged: there is no failure command).
	OutcomeFailed Outcome = "failed"
	// OutcomeStale: the proposer rejected the result (the state moved on).
	OutcomeStale Outcome = "stale"
	// OutcomeAbandoned: the scheduler shut down, or the result could not be
	// proposed; the intent stays pending and is re-run on the next start.
	OutcomeAbandoned Outcome = "abandoned"
)

// Observer receives the scheduler's metrics; the daemon adapts it to
// Prometheus. Methods are called from scheduler goroutines and must not block.
type Observer interface {
	// OpDone reports an operation's end and its time from first start to
	// end, retries and backoff included.
	OpDone(kind fsm.IntentKind, outcome Outcome, d time.Duration)
	// Retry reports a failed attempt that will be retried.
	Retry(kind fsm.IntentKind, err error)
	// Step reports one step of a successful operation's report.
	Step(kind fsm.IntentKind, step string, d time.Duration)
	// Queue reports the number of operations waiting (queued, backing off or
	// parked) and running, after every change.
	Queue(waiting, running int)
}

// NopObserver ignores everything.
type NopObserver struct{}

var _ Observer = NopObserver{}

func (NopObserver) OpDone(fsm.IntentKind, Outcome, time.Duration) {}
func (NopObserver) Retry(fsm.IntentKind, error)                   {}
func (NopObserver) Step(fsm.IntentKind, string, time.Duration)    {}
func (NopObserver) Queue(int, int)                                {}
