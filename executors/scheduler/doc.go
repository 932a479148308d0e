// Package scheduler runs an executors.Driver for the state machine's
// intents and reports each outcome back to the single writer.
//
// Offer(fsm.Intents or fsm.NewIntents) dedupes by op id; the scheduler
// starts at most Concurrency operations at a time in the fsm's priority
// order (claim clones, wakes, hibernates, destroys, goldens, refills),
// calls the Driver method the executors dispatch table names for the
// intent's kind, retries retryable errors with backoff, stops on
// *executors.Unrecoverable ones, bounds every attempt by a per-kind timeout,
// parks refills after executors.ErrCapacity, and proposes exactly one result
// command per intent through a Proposer: the intent's own Succeeded or
// Failed command, with Meta.Op = event.DeriveOpID(intent, "result") and
// Meta.Cause = the intent's op id, so a re-run after a daemon crash proposes
// the same op and the log dedupes it. A kind without a failure command (a
// destroy) is retried without limit and, failing for good, only logged.
//
// A *fsm.Rejection of a result means it is stale; it is logged and dropped,
// and nothing the operation made is removed here: a rejection can also mean
// an earlier run's identical result was applied, and orphan VMs are the
// start-up reconcile's to remove, never a guess's.
//
// The scheduler knows no intent type: it dispatches on the fsm.Intent
// methods and the executors dispatch table only. Its clock (Options.Clock)
// is injectable, of the engine's kind (fsm/engine.Clock), so one clock
// drives a node's engine and its executors.
package scheduler
