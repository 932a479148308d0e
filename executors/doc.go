// Package executors is the port between the state machine's intents and the
// hypervisor backends that perform them.
//
//   - Driver is what a hypervisor backend implements: one method per intent
//     kind (BuildGolden, Clone, Hibernate, Wake, Destroy; Restart through the
//     optional Restarter interface; Archive, Unarchive, DeleteArchive through
//     Archiver, which package executors/archive implements for every driver). Each method is a recipe of named,
//     idempotent steps keyed by the intent's op id, so a call repeated after
//     a crash at any step either completes the operation or rolls it back;
//     see the Driver doc for the per-method contract. The Cloud Hypervisor
//     driver is package executors/chdriver, the QEMU one executors/qemu.
//   - The dispatch table (MethodFor) maps every fsm.IntentKind to the Driver
//     method performing it and the default bound of one call. It is the one
//     place that knows which method serves which kind: everything else about
//     an intent (its subject, priority, result and failure commands) is the
//     fsm intent's own.
//   - Error classes (errors.go): any error is retryable unless it is (or
//     wraps) an *Unrecoverable, which aborts the operation and is reported
//     as a failure at once (Lost on it says the VM or snapshot is gone for
//     good), or ErrCapacity (ENOSPC and friends), which reports the failure
//     and parks refills through an fsm.CapacityFull command.
//   - AgentDialer (agent.go) is the data plane's transport: a driver that
//     implements it connects to a VM's guest agent, which speaks silkd v1
//     (package executors/guest/silkd). Cloud Hypervisor reaches it over
//     hybrid vsock (package executors/hvsock), QEMU over its agent network
//     (package executors/qemu). Failures wrap ErrAgentUnreachable.
//
// Package executors/scheduler runs a Driver for intents and proposes their
// results; package executors/layout lays out the data directory the drivers
// share.
package executors
