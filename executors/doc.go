// Package executors turns the state machine's intents into side effects and
// reports their outcome back to the single writer.
//
// Two halves:
//
//   - Driver is what a hypervisor backend implements: one method per intent
//     kind (BuildGolden, Clone, Hibernate, Wake, Destroy; Restart through the
//     optional Restarter interface). Each method is a
//     recipe of named, idempotent steps keyed by the intent's op id, so a
//     call repeated after a crash at any step either completes the operation
//     or rolls it back; see the Driver doc for the per-method contract. The
//     Cloud Hypervisor driver is package executors/chdriver.
//   - Pool runs drivers for intents: Offer(fsm.Intents or fsm.NewIntents)
//     dedupes by op id, starts at most Concurrency operations at a time in
//     the fsm's priority order (claim clones, wakes, hibernates, destroys,
//     goldens, refills), retries retryable errors with backoff, stops on
//     *Unrecoverable ones, bounds every attempt by a per-kind timeout, parks
//     refills after ErrCapacity, and proposes exactly one result command per
//     intent through a Proposer (Meta.Op = event.DeriveOpID(intent, "result"),
//     Meta.Cause = the intent's op id, so a re-run after a daemon crash
//     proposes the same op and the log dedupes it). A *fsm.Rejection of a
//     result means it is stale; it is logged and dropped, and nothing the
//     operation made is removed here: a rejection can also mean an earlier
//     run's identical result was applied, and orphan VMs are the start-up
//     reconcile's to remove, never a guess's.
//
// Error classes (see errors.go): any error is retryable unless it is (or
// wraps) an *Unrecoverable, which aborts the operation and is reported as a
// failure at once (Lost on it says the VM or snapshot is gone for good), or
// ErrCapacity (ENOSPC and friends), which reports the failure and parks
// refills for CapacityPark through an fsm.CapacityFull command.
//
// Package executors/layout lays out the data directory the drivers share.
package executors
