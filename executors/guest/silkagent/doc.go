// Package silkagent is the guest agent's side of the silkd v1 protocol
// (package executors/guest/silkd): Server serves connections, and what it
// acts on is pluggable, so the one protocol engine serves both the real
// guest (cmd/sbx-agent: OSProcs, OSFS, DialTCP) and the simulated guest of
// chsim and of nodetest's fake hypervisor (SimSpawner, MemFS, SimDial). A
// MemFS can be bounded (MemFS.Limit): what would pass the bound fails with
// ENOSPC, which reaches the client as a full tmpfs does on the real guest
// (an internal error saying "no space left on device").
//
// Served ops: info, exec (argv, cwd, env, user; stdin and stdin_close;
// stdout, stderr, exit; detach), kill, fs_read, fs_write, fs_stat, fs_list,
// fs_mkdir, fs_rm, fs_rename, port_forward, and the input frames data and
// data_end. Every other op, known to the protocol or not, is answered
// error{kind: "unimplemented"}; so is a served op whose backend is nil.
//
// Connection rules (the protocol's proto 2, which info reports truthfully):
//   - RPCs run back to back on one connection, each to its terminal frame.
//   - Input frames feed the RPC in flight, synchronously (a child that does
//     not read its stdin, or a guest socket that does not drain, holds the
//     client back). Input that arrives after the RPC's terminal frame is
//     dropped; input before any RPC on the connection is a bad_request, and
//     the connection stays open.
//   - A request frame that arrives while an RPC streams ends that RPC's
//     input (as stdin_close or data_end would) and is served after it.
//   - A line that does not parse is answered bad_request "parse: ..." and
//     the connection goes on; a line over the 8 MiB cap ends the connection
//     (after a bad_request), as the stream cannot be resynchronised.
//   - When the client's stream ends, the RPC in flight loses its input and
//     runs to its end; a foreground child whose output cannot be delivered
//     any more is killed, a silent one runs to completion.
//
// Per op:
//   - exec: the environment is PATH, TERM and the proxy and TLS bundle
//     variables (SSL_CERT_FILE, REQUESTS_CA_BUNDLE, PIP_CERT,
//     CURL_CA_BUNDLE) of the agent's own environment, then env; HOME and USER only with user. A
//     spawn that fails on a missing or non-executable argv[0] or cwd is
//     bad_request. started, then stdout/stderr (at most 32 KiB a frame),
//     then exit once the child has exited and its output has drained (for
//     at most PostExitDrain). A detached exec answers started alone; its
//     output is discarded and its stdin closed. session is not served (not
//     found; with detach, bad_request).
//   - kill: SIGKILL unless signal is given; a process that already exited
//     answers done without a signal (its pid may be reused); an unknown pid
//     is not_found. Exited processes are forgotten after ReapDelay.
//   - fs_write replaces the file atomically (a temp file in the same
//     directory, renamed at data_end) with mode, else the replaced file's
//     mode, else 0644; a refusal is answered at once and the upload that
//     follows is dropped.
//   - fs_read streams a regular file in BulkChunk frames (anything else is
//     bad_request); fs_list batches of EntriesBatch; fs_stat follows
//     symlinks, fs_list does not.
//   - port_forward connects to the guest port (a refusal is not_found),
//     answers ready, copies both ways, half-closes the guest socket at
//     data_end and answers done at the guest's EOF; the RPC ends when both
//     directions have.
//
// The simulated guest (sim.go) runs nothing on the host: SimSpawner
// simulates SimCommands (echo [-n], stderr, cat of files of its MemFS or of
// stdin, true, false, exit N, sleep S, yes [word]) with synthetic pids,
// refuses anything else and a cwd that is not a directory of its MemFS
// (bad_request, naming who simulates), and gives its processes the default
// signal dispositions (SIGKILL, SIGTERM, SIGINT and SIGHUP end one, the
// others are ignored). SimDial serves an in-memory echo server on
// SimEchoPort (half-closes passed on) and refuses every other port.
//
// Errors of a backend become error frames: an *silkd.Error as it is, one
// wrapping fs.ErrNotExist as not_found, anything else internal; messages are
// "<op>: <error>".
package silkagent
