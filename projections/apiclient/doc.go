// Package apiclient is a typed Go client for sandboxd's HTTP API (see
// docs/api.md): one method per route, taking and returning the request and
// response types of package api, and an SSE reader for /v1/events.
//
// Errors: a response with a non-2xx status becomes an *Error carrying the
// status and the server's {"error": ...} message (use errors.As, or
// StatusOf); transport failures are returned as they are. A claim answered
// with a redirect (200 {"redirect": [...]}: other nodes have warm capacity)
// is an *Error whose Redirect lists the nodes' addresses (RedirectOf).
//
// Events: Client.Events opens one SSE connection and yields (id, event,
// data) in order; Client.Follow keeps a stream going across disconnects by
// reconnecting with Last-Event-ID, so a caller sees every event of the op
// log exactly once. An `event: error` (a cursor the node cannot serve, or a
// client that fell too far behind) ends a stream with a *StreamError; Follow
// resumes after one only if events arrived since the last connect, so a
// cursor that can never be served is reported rather than retried forever.
//
// Guests: DialAgent and DialPort open the data plane's relays with the old
// SDK's exact upgrade request and return the connection after its 101
// (the raw one when nothing came with the answer, so it can half-close and
// splice); Exec is the buffered exec. They need the sandbox's own token.
package apiclient
