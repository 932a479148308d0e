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
// stdout, stderr, exit; detach; session), kill, ps, logs, attach,
// session_create, session_list, session_rm, pty_open, pty_resize, fs_read,
// fs_write, fs_stat, fs_list, fs_mkdir, fs_rm, fs_rename, port_forward, and
// the input frames data and data_end; with an FS that is a TreeFS (OSFS and
// MemFS are) fs_push, fs_pull, fs_find and fs_replace; with one that is a
// Watcher (both are) fs_watch; with Git the git ops (git_clone, git_status,
// git_add, git_commit, git_push, git_pull, git_branch); with LSPDir and Procs
// lsp_start, lsp_request and lsp_stop. Every other op, known to the protocol
// or not, is answered error{kind: "unimplemented"}; so is a served op whose
// backend is missing (the session ops when Procs is no ShellSpawner, the pty
// ops when it is no PtySpawner).
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
//     output goes to its log only (logs, attach) and its stdin is closed. With
//     session, it runs in that session (see below; detach with session is
//     bad_request, an unknown session not_found).
//   - kill: SIGKILL unless signal is given; a process that already exited
//     answers done without a signal (its pid may be reused); an unknown pid
//     is not_found. Exited processes are forgotten after ReapDelay, or
//     sooner once MaxExited newer ones have exited.
//   - The process table (proc_table.go): every process exec and pty_open
//     start, from any connection, detached or not, with its argv, start
//     time and exit code, and its output log: the last LogRing bytes of
//     stdout and stderr in order, numbered so that a replay and the live
//     output after it neither overlap nor leave a gap. ps lists it by pid;
//     logs replays a log (output frames, exit if it has ended, done); attach
//     replays it and follows it to exit, or answers done when its client
//     sends another request or goes away. Unknown pids are not_found.
//   - Sessions (session.go; the shell of OSProcs in os_shell.go): a
//     persistent shell each (bash, else sh, in a process group of its own,
//     stdout and stderr on one pipe), at most MaxSessions, ended after
//     SessionIdle without a command (checked at session_create and
//     session_list). An exec in a session writes argv as one shell line of
//     quoted words in a { } group with stdin from /dev/null, followed by a
//     printf of a marker with a random nonce and the status: its output is
//     what comes before the marker, its exit the status; stdout frames then
//     exit, no started. One command at a time per session; a command whose
//     client goes away or stops taking its output is interrupted (the
//     processes of the shell's group but the shell are killed), and a shell
//     that does not come back within InterruptGrace is closed. A shell that
//     exits ends its session (internal). session_rm kills the group.
//   - pty_open (pty.go; os_pty.go): the guest's shell, interactive, as the
//     session leader of a new creack/pty terminal of the given size, at most
//     MaxPtys at once; started, output as stdout frames, exit. stdin frames
//     are typed; stdin_close is ignored; the end of the client's input (its
//     stream ends or another request comes) kills the shell. pty_resize sets
//     the size of a terminal's pid (bad_request for a plain exec's).
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
//   - fs_push extracts the tar stream of the data frames into a staging
//     directory inside dest and merges it into dest (directories merge, a
//     file replaces one by rename) only once the stream ended with
//     data_end: a refused or cut push leaves dest as it was. Refused
//     (bad_request, at once, the rest of the upload dropped): an entry
//     whose name is absolute or has a ".." component, one below a symlink
//     of the archive, a symlink whose target leaves dest (alone or through
//     the archive's other symlinks), a hard link to anything but an earlier
//     file of the archive (extracted as a copy), more than Limits.TarEntries
//     entries or Limits.TarBytes bytes of files (defaults 500000 and 4
//     GiB), a stream that is not a whole tar (its end-of-archive blocks
//     included). Directories are made 0755, files keep their permission
//     bits, devices and fifos are skipped.
//   - fs_pull streams a tar of the path named by its base name (as
//     `tar -C dir -c base`), symlinks as symlinks, bounded as fs_push;
//     past a bound, or when a file changes size while read, the stream ends
//     with an error frame.
//   - fs_find walks the path (symlinks not followed; unreadable
//     directories below it skipped) and answers a match frame (file, line
//     from 1, content) for every line of a regular file whose name matches
//     glob (* and ?) and whose line matches pattern (Go regexp), then done.
//     Files over Limits.FindFileBytes (8 MiB, the old agent's) or not UTF-8
//     are skipped; past Limits.FindMatches matches (100000) the find ends
//     with a bad_request saying so. A bad pattern or glob is bad_request.
//   - fs_replace rewrites each file in turn (atomically, its mode kept):
//     a replaced frame (file, replacements) a file, then done; a file over
//     FindFileBytes is left alone (0); the first failure ends the RPC.
//   - fs_watch answers ready once armed, then event frames (created,
//     modified, deleted, renamed; inotify on a real guest, the tree's own
//     changes in the simulated one; a move is renamed at both of its
//     ends, as the old agent said it, a chmod modified) until the client
//     sends any frame or its stream ends, which ends the watch without a
//     terminal frame, as the old agent's did. At most Limits.WatchQueue (256) events wait for
//     the client; past it those are sent and an internal "watch event queue
//     overflow" ends the watch.
//   - the git ops are go-git in the agent (git.go says why, and how it
//     differs from git(1)); status files are capped at
//     Limits.GitStatusFiles (truncated set). A missing path is not_found, a
//     malformed request bad_request, a failed git operation internal
//     ("git <verb>: ...").
//   - lsp_start finds the language's server (the manifest LSPDir/<language>
//     naming its argv, else a well-known server on PATH; none is not_found),
//     starts it in root and answers lsp_started; lsp_request relays its
//     stdio as port_forward relays a socket (data_end closes its stdin),
//     once: the server is reaped when the stream ends; lsp_stop kills one.
//     A server nothing attaches is reaped after LSPAttachTTL.
//
// The simulated guest (sim.go, sim_shell.go) runs nothing on the host: SimSpawner
// simulates SimCommands (echo [-n], stderr, cat of files of its MemFS or of
// stdin, true, false, exit N, sleep S, yes [word]) with synthetic pids,
// refuses anything else and a cwd that is not a directory of its MemFS
// (bad_request, naming who simulates), and gives its processes the default
// signal dispositions (SIGKILL, SIGTERM, SIGINT and SIGHUP end one, the
// others are ignored). Its sessions are a simulated shell over the MemFS
// (builtins cd, pwd, export, unset, exit; eval of simple shell text; the
// SimCommands), and pty_open is unimplemented, saying it simulates. SimDial
// serves an in-memory echo server on SimEchoPort (half-closes passed on), a
// one-request HTTP server on SimHTTPPort (with a websocket upgrade that
// echoes), and refuses every other port. Over a MemFS it serves the
// whole-tree ops and fs_watch (a MemFS holds no symlinks: a pushed one is
// bad_request); git and lsp are not simulated (unimplemented; with
// Server.Simulated set, every unimplemented answer says the guest is
// simulated).
//
// Errors of a backend become error frames: an *silkd.Error as it is, one
// wrapping fs.ErrNotExist as not_found, anything else internal; messages are
// "<op>: <error>".
package silkagent
