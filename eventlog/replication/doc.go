// Package replication is the home of the op log's replication over NATS
// JetStream. It holds no code itself; the parts are:
//
//   - natsembed: the embedded NATS server with JetStream (and loopback
//     clusters for tests and benchmarks);
//   - natsauth: the clients' credentials (the embedded server's generated
//     NKey seed, an external server's options);
//   - stream: the stream's name, per-node subjects <prefix>.<node token>,
//     the message format and the stream's create-or-check;
//   - replicator: publishes the local log, exactly once, in order, resuming
//     from the stream, refusing a second writer;
//   - feed: verified delivery of the stream to consumers through durable
//     consumers;
//   - journal: the keyed JSON-lines file behind audit and usage;
//   - follower, audit, usage, cluster: the consumers (replica log,
//     audit.jsonl, usage.jsonl, cluster view with node addresses);
//   - service: all of it wired for one sandboxd node (Start/Close).
//
// The tests in this directory run the parts together: a three-server R3
// cluster losing its stream leader under load (acceptance 1 at the
// replicator level), a follower's replica replaying to the node's state hash,
// and the consumers riding out a restart of the embedded server.
package replication
