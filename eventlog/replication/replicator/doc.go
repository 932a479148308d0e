// Package replicator publishes a node's op log to its JetStream subject
// (<prefix>.<token>, see package stream), one message per event in the
// stream's message format (stream.Config.Message): Nats-Msg-Id = token +
// "-" + seq, Sbx-* headers describing the event, payload = the event's
// checksummed record (event.Encode).
//
// Contract:
//   - Every durable event of the local log reaches the subject exactly once
//     and in sequence order. The resume point after a start, a disconnect or
//     any publish error is read from the stream (the last message on the
//     node's subject): JetStream may acknowledge before it fsyncs, so a
//     crashed server can lose a tail the local log still has; that tail is
//     published again. Only a subject without any message consults the
//     cursor file (Options.CursorFile: what was acknowledged, in which
//     stream, told apart by its creation time): its messages left the
//     stream (an age or size limit, a purge) and are not published again.
//   - Windows are atomic batches when the stream has several replicas,
//     whatever the node is configured for; compatible stream settings that
//     differ from sbxlog's (stream.Warnings) are logged and in Status.
//   - Each outage is logged once at warn and its end at info; Status's
//     LastError is the current outage's error (*UnreachableError while the
//     client has no connection) and is cleared once replication runs.
//   - Local appends never wait for NATS. The replicator tails the log on its
//     own goroutine with a bounded number of publishes in flight; while NATS
//     is unreachable it retries with capped backoff and on its return
//     catches up from the stream's last message.
//   - The subject only ever holds a gap-free prefix of the log. Events go out
//     in windows of up to Window events. The first message of a window
//     carries Nats-Expected-Last-Subject-Sequence (the stream sequence of our
//     last acknowledged message). With one stream replica, the rest are
//     pipelined after it is acknowledged, each with Nats-Expected-Last-Msg-Id
//     naming its predecessor, so none is stored unless its predecessor is.
//     With several replicas (a shared cluster, where a leader change can drop
//     some pipelined messages and store later ones) a window is one atomic
//     batch (nats-server 2.12+), stored entirely or not at all.
//   - Single writer per subject. Before publishing, the stream's last
//     message for the node must be byte-identical to the local event with
//     that sequence, and every window is fenced as above. A second process
//     using the same node id with a different log therefore fails one of
//     these checks: the replicator logs the refusal at error level, stops for
//     good and returns a *SecondWriterError (errors.Is ErrSecondWriter). It
//     never overwrites or interleaves with the other writer's messages. (Two
//     processes with byte-identical logs are indistinguishable until their
//     logs differ.)
//   - Replicated reports the highest sequence acknowledged by JetStream in
//     this run, and WaitReplicated blocks until a sequence is acknowledged:
//     the opt-in synchronous mode of the API path. Status reports, until
//     this run has read its resume point from the stream, what the cursor
//     says an earlier run saw acknowledged, with Confirmed false: a node
//     started while NATS is unreachable is not shown as having replicated
//     nothing.
//
// Errors: ErrSecondWriter (via *SecondWriterError), ErrGap (via *GapError:
// the local log no longer holds events the stream lacks), *TooLargeError (an
// event above the server's max_payload) and *stream.IncompatibleError from
// the stream check are fatal: Run logs and returns them, and WaitReplicated
// returns them from then on. ErrStopped: Run returned after its context.
// Everything else (connection loss, timeouts, leader elections) is retried.
package replicator
