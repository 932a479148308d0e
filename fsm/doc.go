// Package fsm is sbxlog's pure state machine: pools, golden snapshots, VMs and
// claims, as a function of the op log.
//
// The contract:
//
//   - Decide(s, cmd) checks a command against the current state and returns
//     the events that record its outcome, or a *Rejection (typed by Code,
//     with an HTTP status) and no events. It never changes s. A command that
//     is already satisfied (release of an ended claim, hibernate of a
//     hibernating or hibernated one, wake of a running or waking one, a Tick
//     with nothing due) returns no events and no error. Any other error is a
//     bug, never a property of the input; append failures are the caller's
//     and never a Rejection.
//   - Apply(s, ev) folds one event into s, in place. It is deterministic: the
//     same events in the same order give the same state, byte for byte
//     (compare Hash). It reads neither Seq nor Node, so applying an event
//     before or after the log sequenced it is the same. It never fails on
//     events Decide produced from the same state; it fails only on
//     undecodable or inconsistent events (*ApplyError), and then leaves s
//     unchanged.
//   - Intents(s) lists the side effects the state asks for (BuildGolden,
//     CloneVM, HibernateVM, WakeVM, DestroyVM, RestartVM, PromoteVM,
//     CollectSnapshot, and a claim's AttachVolume and DetachVolume:
//     volumes.go), each with the op id its
//     executor keys its idempotent steps by (derived from the request
//     event's op id, see IntentOp), computed from state alone, so a restarted
//     daemon recomputes the same intents with the same op ids. Intents costs
//     O(pending side effects) thanks to an index Apply maintains; NewIntents
//     is the incremental feed (the intents a just-applied batch created, in
//     O(batch)). Results come back as commands (VMCloned, HibernateDone...)
//     whose Meta.Cause is the intent's op id; a result that does not match
//     the op in flight is refused as a stale InvalidTransition. Each intent
//     type carries what an executor needs as methods: its IntentKind (the
//     one set of kind names), its subject, and the result and failure
//     commands it turns into (Succeeded, Failed), so executors dispatch on
//     the interface, never on the type.
//   - RefillsNeeded(s) lists pools short of their warm target that may
//     refill now; the proposer answers with a Refill command, which creates
//     the clone requests (refill clones in flight count toward the target).
//     Refills are commands rather than side effects of every decision so a
//     claim's decision stays one event.
//   - s.NextTimer() says when to send the next Tick. Timers (a pending
//     claim's serve deadline, a lease, idle hibernation, a failed golden's
//     retry, parked refills) live in an indexed min-heap, so a Tick costs
//     O(due timers), and a Tick with nothing due decides nothing.
//
// Each command carries its own decision (an unexported decide method next to
// the others in decide.go), so Decide has no switch over command types.
//
// Everything from outside the log is stamped by the caller into commands:
// op ids, claim ids, token generations and the time (Meta.Now). VM ids are
// derived from the command's op id (VMID), so they are deterministic too. A
// VM keeps its id and run dir across hibernate and wake (statuses claimed ->
// hibernating -> hibernated -> waking -> claimed); its snapshot dir is
// recorded by Hibernated and removed by its eventual destroy. A claimed VM
// whose VMM dies (VMExited) is restarted cold from its own disk (claimed ->
// restarting -> claimed, its claim running throughout) as long as the
// command's RestartPolicy allows; then its claim fails. The package has
// no clock, no randomness, no I/O and no map-order dependence (enforced by
// purity_test.go: every range over a map carries an //fsm:unordered marker
// saying why order cannot reach an output).
//
// Claims are served by tiers, as the old daemon: warm (the newest warm VM,
// LIFO, in the same decision), else clone (a pending claim plus an on-demand
// clone from the ready golden, ahead of refills), else cold (a pending claim
// served by a cold boot of the template). A pending claim not served by its
// serve deadline fails with reason "deadline"; a VM that arrives for a claim
// that ended meanwhile is destroyed. A claim of a key no configured pool has
// (never configured, or removed and draining) is not refused: as the old
// daemon, it is served from the key's golden if one is ready, else by a cold
// boot of the template (which fails, and fails the claim, when the template
// does not exist), under a draining pool record dropped with its last claim
// and VM. Ended claims stay ClaimRetentionNS, so
// a second release still answers 204, then are forgotten.
//
// Operator state lives here too (tenants.go, drain.go): the tenant table
// (name, token SHA-256 — never the token — and caps), changed at runtime
// and by the config's tenants until the API first changes it; and the
// node's drain, under which claims are refused with the old daemon's quota
// text, refills stop and warm VMs are destroyed, until uncordoned. So is
// guarded egress (egressstate.go): the pools' policies, the egress classes
// tenants point at, what each claim pinned when it was made (its tenant's
// class, egress false, whether its key had a pool) and its env, whose
// values the caller seals (the state never holds a secret in the clear);
// State.Egress is a claim's effective policy (fsm/egress, pure), read by
// the proxy per connection, so a change applies to the next one.
//
// The snapshot store (store.go, templates.go): every snapshot dir has an
// owner here (SnapshotRefs), VMs record the golden they map, a dir no owner
// holds is retired and collected once nothing maps it; promoted templates
// are goldens of new keys with their owner tenant, digest and labels.
//
// Relays (relays.go) are the data plane's facts: OpenRelay records a client
// connection spliced to a running claim's guest, CloseRelay its end. An open
// relay holds its claim's idle clock; a decision that takes a claim out of
// running closes its relays first, in the same batch; CloseAllRelays is a
// starting node's record that no relay survived the previous process.
//
// Cost model: Decide and Apply are O(1) in the number of live claims, except
// that PUT pools re-arms the idle timers of the claims in pools whose idle
// setting changed (O(claims), rarely). Encode/Decode give a versioned
// (first byte StateFormatCurrent; Decode reads every earlier format),
// deterministic binary form of State for the op
// log's snapshots; Decode rebuilds every index and runs Check, and the warm
// VMs' LIFO order is part of the encoding.
package fsm
