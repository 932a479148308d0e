// Package ch is the project's client for the Cloud Hypervisor REST API, spoken
// as HTTP/1.1 over the VMM's unix socket (root /api/v1).
//
// Contract:
//   - Every method takes a context and is additionally bounded by a per-call
//     timeout (Timeouts: seconds for most calls, minutes for vm.snapshot and
//     vm.restore); whichever ends first wins.
//   - A non-2xx answer is returned as *APIError carrying the operation, the
//     status code and CH's error chain (the JSON array of strings the server
//     sends). IsNotFound, IsInvalidState, IsConflict and IsBadRequest classify it.
//   - Failures below HTTP are *TransportError wrapping one of two sentinels:
//     ErrVMMGone (the socket is missing or nobody listens: nothing was sent,
//     the VMM is not running) or ErrConnectionLost (the connection broke after
//     the request may have been sent: the outcome is unknown). Timeouts wrap
//     ErrTimeout and context.DeadlineExceeded.
//   - Pause of a paused VM and Resume of a running VM succeed: the real server
//     answers 500 with InvalidStateTransition(Paused, Paused) or
//     (Running, Running), and callers want idempotent steps.
//
// VmConfig is kept as a JSON tree rather than a struct so that a config.json
// written by any CH version survives a read-modify-write with its unknown keys
// intact; typed accessors cover the fields the executors rewrite.
//
// The server side of this API, for machines without Cloud Hypervisor, is the
// simulator in package chsim (binary cmd/chsim).
package ch
