// Package fsm is sbxlog's pure state machine: pools, golden snapshots, VMs and
// claims, as a function of the op log.
//
// The contract:
//
//   - Decide(s, cmd) checks a command against the current state and returns
//     the events that record its outcome, or a *Rejection (typed, with an
//     HTTP status) and no events. It never changes s. A command that is
//     already satisfied (release of a released claim, hibernate of a
//     hibernated one, a Tick with nothing due) returns no events and no error.
//   - Apply(s, ev) folds one event into s, in place. It is deterministic: the
//     same events in the same order give the same state, byte for byte
//     (compare Hash). It never fails on events Decide produced from the same
//     state; it fails only on undecodable or inconsistent events, and then
//     leaves s unchanged.
//   - Intents(s) lists the side effects the state asks for (build a golden,
//     clone, hibernate, wake, destroy), each with the op id its executor keys
//     its idempotent steps by. It is computed from state alone, so a restarted
//     daemon recomputes the same intents with the same op ids. NewIntents
//     gives the intents created by a batch of applied events (an incremental
//     feed); RefillsNeeded lists pools whose warm target is short, which the
//     proposer answers with a Refill command.
//
// Everything outside the log is stamped by the caller into commands: op ids,
// claim ids, token generations and the time (Meta.Now; timers are Tick
// commands carrying the time). VM ids are derived from the command's op id
// (see VMID), so they are deterministic too. The package has no clock, no
// randomness, no I/O and no dependence on map order (enforced by
// purity_test.go).
//
// Cost model: Decide and Apply are O(1) in the number of live claims except
// where noted (PUT pools re-arms idle timers of claims in pools whose idle
// setting changed). Timers live in an indexed min-heap, so a Tick costs
// O(due timers · log n). Intents costs O(pending side effects), never a scan
// of all VMs or claims.
//
// Encode/Decode give a versioned, deterministic binary form of State for the
// op log's snapshots; Decode rebuilds every index (timers, pending intents,
// counters) from the records, and the warm VMs' LIFO order is part of the
// encoding.
package fsm
