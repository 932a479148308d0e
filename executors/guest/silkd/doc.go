// Package silkd is the silkd v1 wire protocol, the guest agent protocol that
// the old sandboxd's SDKs speak through the agent relay, with both ends: the
// frame types, a codec, and a client for one connection. The host side (the
// relay, the ports route, the buffered exec, sbxctl) and the guest side (the
// project's agent, executors/guest/silkagent, and chsim's simulated agent)
// use this one package, so the two sides cannot drift apart.
//
// Wire format:
//   - Newline-delimited JSON, one compact object per line. A line may hold
//     at most MaxFrame bytes, not counting its newline; a longer one is
//     ErrFrameTooLarge, after which the stream cannot be resynchronised and
//     the connection must be dropped.
//   - Requests (client to agent) are tagged by "op" and stamped "v":1;
//     responses (agent to client) are tagged by "type" and carry no "v".
//     Encoders put the tag first and emit the fields in the order of the
//     protocol's golden fixtures (testdata/fixtures/v1). Decoders find the
//     tag anywhere, ignore "v" and ignore unknown fields: that is the
//     protocol's forward-compatibility rule.
//   - Binary payloads are standard padded base64 in a field named "data"
//     (request ops stdin and data; response types stdout, stderr and data).
//     B64 encodes nil as "" because the reference agent rejects null.
//   - Bulk frames have the exact shapes {"v":1,"op":"data","data":"..."} and
//     {"type":"data","data":"..."} (likewise stdin, stdout, stderr). Writer
//     builds them by hand into a reused buffer and Reader decodes them into a
//     reused buffer, so moving data allocates nothing per chunk; any other
//     shape falls back to encoding/json.
//
// RPC lifecycle on a connection: a request frame (any op but the four input
// ops, IsInput) opens an RPC; the agent streams responses until a terminal
// frame (IsTerminal: exit, done, error, or the one-shot result of info,
// stat and the like; a detached exec ends with started). Input frames feed
// the RPC in flight and are dropped once it has ended. An agent whose info
// reports proto >= ProtoKeepAlive serves further RPCs on the same
// connection; one reporting ProtoOneShot closes after the first.
//
// Errors: an error frame decodes to *Error, which is a Go error; errors.Is
// matches it against the kind sentinels ErrBadRequest, ErrNotFound,
// ErrUnimplemented and ErrInternal. The client reports a frame it did not
// expect as *UnexpectedFrameError and a stream that ends before its terminal
// frame as ErrTruncated.
package silkd
