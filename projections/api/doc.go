// Package api is sandboxd's HTTP API, compatible with the old daemon's routes,
// field names and status codes (see docs/api.md, which a test keeps in step
// with the routes registered here).
//
// Handlers only translate: they authenticate, validate the body, stamp what
// the state machine must not invent (claim ids, op ids, token generations,
// the time, and the sealing of env values under the node's key, so no
// secret reaches the log in the clear) into an fsm command and hand it to
// the engine, which answers once the command's events are durable and
// applied. A *fsm.Rejection becomes its 4xx; an engine append failure
// becomes 503, never a 4xx. Every error body is {"error": "..."}; bodies
// are capped at 1 MiB, and every answer that does not read a declared
// body closes its connection (the body guard, bodyguard.go).
//
// Requests that answer with an outcome rather than the command (a claim
// served by a clone, a hibernate or wake, which answer once done as the old
// daemon's did) then wait for the events that settle it, delivered by
// OnCommit once durable; hibernates and wakes of one sandbox queue in
// arrival order, bounded by Config.LifecycleWait. The waiting changes
// nothing the state machine, the log or the executors do.
//
// The data plane (agent.go, ports.go, exec.go, dataplane.go) reaches inside
// sandboxes through the driver's executors.AgentDialer and authenticates as
// the old daemon did (a token that is not the sandbox's own is 404). Each
// connection is a relay recorded open and closed in the log (fsm.OpenRelay,
// fsm.CloseRelay), never per byte; a relay to a sandbox that is not running
// first brings it there as a wake does, in the same queue; a relay the log
// closes (a release, a reap, a hibernate) has its connection ended on that
// commit. Before anything else a relay reserves its worst-case buffers from
// the node's relay memory budget (relaymem.go), given back when it ends;
// when the budget is spent it is refused with 503. The bytes move in
// package relay.
package api
