// Package api is sandboxd's HTTP API, compatible with the old daemon's routes,
// field names and status codes (see docs/api.md, which a test keeps in step
// with the routes registered here).
//
// Handlers only translate: they authenticate, validate the body, stamp what
// the state machine must not invent (claim ids, op ids, token generations,
// the time) into an fsm command and hand it to the engine, which answers once
// the command's events are durable and applied. A *fsm.Rejection becomes its
// 4xx; an engine append failure becomes 503, never a 4xx. Every error body is
// {"error": "..."}; bodies are capped at 1 MiB.
package api
