package silkd

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
)

// Protocol constants.
const (
	// Version is the "v" of every request, also against a proto-2 agent.
	Version = 1
	// ProtoOneShot is an agent that closes the connection after one RPC.
	ProtoOneShot = 1
	// ProtoKeepAlive is an agent that serves RPCs back to back on one
	// connection.
	ProtoKeepAlive = 2
	// MaxFrame bounds a line, without its newline, in both directions.
	MaxFrame = 8 << 20
	// Port is the agent's guest port (a vsock port on Cloud Hypervisor).
	Port = 2048
	// BulkChunk is the payload of one data frame the agent sends for
	// fs_read and port_forward, and the chunk the client uploads in.
	BulkChunk = 256 << 10
	// OutputChunk bounds the payload of one stdout or stderr frame.
	OutputChunk = 32 << 10
	// EntriesBatch bounds the entries of one entries frame.
	EntriesBatch = 4096
	// MaxPayload is the largest payload one bulk frame can carry within
	// MaxFrame; receivers accept anything up to it.
	MaxPayload = (MaxFrame - 64) / 4 * 3
	// MaxStreamFrame bounds every response frame a Conn reads during exec,
	// kill and port_forward, the RPCs the host's relays parse: the agent
	// sends their payloads in chunks of at most BulkChunk (OutputChunk for
	// stdout and stderr), so a frame is at most a bulk frame of BulkChunk
	// bytes in base64 plus room for the other fields (an error's message).
	// A larger one is ErrFrameTooLarge, so a guest cannot make the host
	// buffer MaxFrame for each such connection.
	MaxStreamFrame = (BulkChunk+2)/3*4 + 64<<10
	// StreamConnMemory bounds the frame buffers a Conn holds while its
	// frames are bounded at MaxStreamFrame (exec, kill, port_forward): the
	// line buffer (a line of MaxStreamFrame and its newline), the decoded
	// payload of the largest such line, and the writer's buffer, at most a
	// bulk frame of BulkChunk (PortWriteChunk) bytes, within MaxStreamFrame.
	// The host's relays reserve it from the node's relay memory budget
	// before they dial.
	StreamConnMemory = (MaxStreamFrame + 2) + MaxStreamFrame/4*3 + MaxStreamFrame
)

// Request ops.
const (
	OpInfo          = "info"
	OpExec          = "exec"
	OpStdin         = "stdin"
	OpStdinClose    = "stdin_close"
	OpKill          = "kill"
	OpPs            = "ps"
	OpAttach        = "attach"
	OpLogs          = "logs"
	OpSessionCreate = "session_create"
	OpSessionList   = "session_list"
	OpSessionRm     = "session_rm"
	OpFsWrite       = "fs_write"
	OpFsRead        = "fs_read"
	OpFsList        = "fs_list"
	OpFsStat        = "fs_stat"
	OpFsMkdir       = "fs_mkdir"
	OpFsRm          = "fs_rm"
	OpFsRename      = "fs_rename"
	OpFsPush        = "fs_push"
	OpFsPull        = "fs_pull"
	OpFsFind        = "fs_find"
	OpFsReplace     = "fs_replace"
	OpFsWatch       = "fs_watch"
	OpPtyOpen       = "pty_open"
	OpPtyResize     = "pty_resize"
	OpPortForward   = "port_forward"
	OpData          = "data"
	OpDataEnd       = "data_end"
	OpGitClone      = "git_clone"
	OpGitStatus     = "git_status"
	OpGitAdd        = "git_add"
	OpGitCommit     = "git_commit"
	OpGitPush       = "git_push"
	OpGitPull       = "git_pull"
	OpGitBranch     = "git_branch"
	OpLspStart      = "lsp_start"
	OpLspRequest    = "lsp_request"
	OpLspStop       = "lsp_stop"
)

// Ops lists every op of the protocol, for agents that answer the ones they
// do not serve knowingly.
var Ops = []string{
	OpInfo, OpExec, OpStdin, OpStdinClose, OpKill, OpPs, OpAttach, OpLogs,
	OpSessionCreate, OpSessionList, OpSessionRm,
	OpFsWrite, OpFsRead, OpFsList, OpFsStat, OpFsMkdir, OpFsRm, OpFsRename,
	OpFsPush, OpFsPull, OpFsFind, OpFsReplace, OpFsWatch,
	OpPtyOpen, OpPtyResize, OpPortForward, OpData, OpDataEnd,
	OpGitClone, OpGitStatus, OpGitAdd, OpGitCommit, OpGitPush, OpGitPull, OpGitBranch,
	OpLspStart, OpLspRequest, OpLspStop,
}

// IsInput reports whether op is one of the four input (continuation) ops,
// which feed the RPC in flight rather than open one.
func IsInput(op string) bool {
	switch op {
	case OpStdin, OpStdinClose, OpData, OpDataEnd:
		return true
	}
	return false
}

// Response types.
const (
	TypeStarted         = "started"
	TypeStdout          = "stdout"
	TypeStderr          = "stderr"
	TypeExit            = "exit"
	TypeDone            = "done"
	TypeReady           = "ready"
	TypeError           = "error"
	TypeInfo            = "info"
	TypeProcs           = "procs"
	TypeData            = "data"
	TypeEntries         = "entries"
	TypeStat            = "stat"
	TypeSessionCreated  = "session_created"
	TypeSessions        = "sessions"
	TypeLspStarted      = "lsp_started"
	TypeMatch           = "match"
	TypeReplaced        = "replaced"
	TypeEvent           = "event"
	TypeGitStatusResult = "git_status_result"
	TypeGitCommitResult = "git_commit_result"
	TypeGitBranches     = "git_branches"
)

// IsTerminal reports whether a response of type t ends its RPC: exit, done,
// error and the one-shot results. (A detached exec also ends with started;
// that depends on the request, so the caller decides.)
func IsTerminal(t string) bool {
	switch t {
	case TypeExit, TypeDone, TypeError,
		TypeInfo, TypeProcs, TypeStat, TypeSessionCreated, TypeSessions,
		TypeLspStarted, TypeGitStatusResult, TypeGitCommitResult, TypeGitBranches:
		return true
	}
	return false
}

// ErrorKind is the kind of an error frame.
type ErrorKind string

// Error kinds: a malformed frame or an argv/cwd the guest cannot spawn; an
// unknown pid, session or path, or a port nothing listens on; a verb this
// agent or lane does not serve; anything else.
const (
	KindBadRequest    ErrorKind = "bad_request"
	KindNotFound      ErrorKind = "not_found"
	KindUnimplemented ErrorKind = "unimplemented"
	KindInternal      ErrorKind = "internal"
)

// ErrorKinds lists every error kind.
var ErrorKinds = []ErrorKind{KindBadRequest, KindNotFound, KindUnimplemented, KindInternal}

// FileKind is the kind of a file in stat and entries frames.
type FileKind string

// File kinds.
const (
	FileRegular FileKind = "file"
	FileDir     FileKind = "dir"
	FileSymlink FileKind = "symlink"
	FileOther   FileKind = "other"
)

// FileKinds lists every file kind.
var FileKinds = []FileKind{FileRegular, FileDir, FileSymlink, FileOther}

// EventKinds are the kinds of fs_watch events.
var EventKinds = []string{"created", "modified", "deleted", "renamed"}

// GitBranchActions are the actions of git_branch.
var GitBranchActions = []string{"list", "create", "delete", "checkout"}

// B64 is a binary payload, standard padded base64 on the wire. Nil encodes
// as "" (the reference agent rejects null); null decodes as empty.
type B64 []byte

// MarshalJSON implements json.Marshaler.
func (b B64) MarshalJSON() ([]byte, error) {
	out := make([]byte, 0, base64.StdEncoding.EncodedLen(len(b))+2)
	out = append(out, '"')
	out = base64.StdEncoding.AppendEncode(out, b)
	return append(out, '"'), nil
}

// UnmarshalJSON implements json.Unmarshaler.
func (b *B64) UnmarshalJSON(data []byte) error {
	if string(data) == "null" {
		*b = nil
		return nil
	}
	var s string
	if err := json.Unmarshal(data, &s); err != nil {
		return err
	}
	out, err := base64.StdEncoding.AppendDecode((*b)[:0], []byte(s))
	if err != nil {
		return err
	}
	*b = out
	return nil
}

// Request is a client-to-agent frame.
type Request interface{ Op() string }

// Response is an agent-to-client frame.
type Response interface{ Type() string }

// Requests. Field order is the wire order of the golden fixtures.
type (
	// Info is the readiness probe and proto negotiation; answered by InfoReply.
	Info struct{}
	// Exec starts a process; answered by Started, Stdout/Stderr..., Exit (a
	// detached exec by Started alone). Detach is always emitted.
	Exec struct {
		Argv    []string          `json:"argv"`
		Cwd     string            `json:"cwd,omitempty"`
		Env     map[string]string `json:"env,omitempty"`
		User    string            `json:"user,omitempty"`
		Detach  bool              `json:"detach"`
		Session string            `json:"session,omitempty"`
	}
	// Stdin is input for the exec (or pty) in flight.
	Stdin struct {
		Data B64 `json:"data"`
	}
	// StdinClose ends the child's stdin.
	StdinClose struct{}
	// Kill signals a process the agent started; no Signal means SIGKILL.
	Kill struct {
		Pid    uint32 `json:"pid"`
		Signal *int32 `json:"signal,omitempty"`
	}
	// Ps lists processes; answered by Procs.
	Ps struct{}
	// Attach replays and follows a process's output.
	Attach struct {
		Pid uint32 `json:"pid"`
	}
	// Logs replays a process's output ring.
	Logs struct {
		Pid uint32 `json:"pid"`
	}
	// SessionCreate makes a shell session; answered by SessionCreated.
	SessionCreate struct {
		ID  string            `json:"id,omitempty"`
		Cwd string            `json:"cwd,omitempty"`
		Env map[string]string `json:"env,omitempty"`
	}
	// SessionList lists sessions; answered by Sessions.
	SessionList struct{}
	// SessionRm removes a session.
	SessionRm struct {
		ID string `json:"id"`
	}
	// FsWrite replaces Path atomically with the Data frames that follow, up
	// to DataEnd; Mode (permission bits) defaults to the replaced file's.
	FsWrite struct {
		Path string  `json:"path"`
		Mode *uint32 `json:"mode,omitempty"`
	}
	// FsRead streams a regular file as DataReply frames, then Done.
	FsRead struct {
		Path string `json:"path"`
	}
	// FsList lists a directory as Entries batches, then Done.
	FsList struct {
		Path string `json:"path"`
	}
	// FsStat is answered by Stat.
	FsStat struct {
		Path string `json:"path"`
	}
	// FsMkdir creates a directory (and its parents when Parents).
	FsMkdir struct {
		Path    string `json:"path"`
		Parents bool   `json:"parents"`
	}
	// FsRm removes a file or (with Recursive) a tree.
	FsRm struct {
		Path      string `json:"path"`
		Recursive bool   `json:"recursive"`
	}
	// FsRename renames From to To.
	FsRename struct {
		From string `json:"from"`
		To   string `json:"to"`
	}
	// FsPush extracts the tar stream that follows as Data frames under Dest.
	FsPush struct {
		Dest string `json:"dest"`
	}
	// FsPull streams a tar of Path as DataReply frames.
	FsPull struct {
		Path string `json:"path"`
	}
	// FsFind searches files under Path for a regex.
	FsFind struct {
		Path    string `json:"path"`
		Pattern string `json:"pattern"`
		Glob    string `json:"glob,omitempty"`
	}
	// FsWatch streams file events under Path.
	FsWatch struct {
		Path      string `json:"path"`
		Recursive bool   `json:"recursive"`
	}
	// PtyOpen starts a shell under a pty.
	PtyOpen struct {
		Cols uint16            `json:"cols"`
		Rows uint16            `json:"rows"`
		Cwd  string            `json:"cwd,omitempty"`
		Env  map[string]string `json:"env,omitempty"`
		User string            `json:"user,omitempty"`
	}
	// PtyResize resizes the pty of Pid.
	PtyResize struct {
		Pid  uint32 `json:"pid"`
		Cols uint16 `json:"cols"`
		Rows uint16 `json:"rows"`
	}
	// PortForward connects to the guest's 127.0.0.1:Port; answered by Ready,
	// then data both ways: Data frames to the guest socket, DataEnd
	// half-closes it, DataReply frames from it, Done at its EOF.
	PortForward struct {
		Port uint16 `json:"port"`
	}
	// Data is input for fs_write, fs_push and port_forward.
	Data struct {
		Data B64 `json:"data"`
	}
	// DataEnd ends an upload, or half-closes a forwarded port.
	DataEnd struct{}
)

// Requests of the tool ops: text replacement, git and the language-server
// broker.
type (
	// FsReplace rewrites Pattern (a regular expression; $1 and ${name} in
	// Replacement expand its groups) in each of Files, one Replaced frame a
	// file, then Done.
	FsReplace struct {
		Files       []string `json:"files"`
		Pattern     string   `json:"pattern"`
		Replacement string   `json:"replacement"`
	}
	// GitClone clones URL into Path. Auth is a bearer token, sent as an
	// Authorization header and never stored in the guest.
	GitClone struct {
		URL    string `json:"url"`
		Path   string `json:"path"`
		Branch string `json:"branch,omitempty"`
		Depth  uint32 `json:"depth,omitempty"`
		Auth   string `json:"auth,omitempty"`
	}
	// GitStatus is answered by GitStatusResult.
	GitStatus struct {
		Path string `json:"path"`
	}
	// GitAdd stages Files (relative to the repository at Path).
	GitAdd struct {
		Path  string   `json:"path"`
		Files []string `json:"files"`
	}
	// GitCommit commits what is staged; Author is "Name <email>" and is the
	// committer too. Answered by GitCommitResult.
	GitCommit struct {
		Path    string `json:"path"`
		Message string `json:"message"`
		Author  string `json:"author"`
	}
	// GitPush pushes the current branch to its remote.
	GitPush struct {
		Path string `json:"path"`
		Auth string `json:"auth,omitempty"`
	}
	// GitPull pulls the current branch from its remote.
	GitPull struct {
		Path string `json:"path"`
		Auth string `json:"auth,omitempty"`
	}
	// GitBranch lists (answered by GitBranches), creates, deletes or checks
	// out (answered by Done) a branch; Action is one of GitBranchActions.
	GitBranch struct {
		Path   string `json:"path"`
		Action string `json:"action"`
		Name   string `json:"name,omitempty"`
	}
	// LspStart starts the language server for Language in Root; answered by
	// LspStarted.
	LspStart struct {
		Language string `json:"language"`
		Root     string `json:"root,omitempty"`
	}
	// LspRequest attaches the connection to a started server's stdio:
	// Ready, then Data frames both ways (DataEnd closes its stdin), Done at
	// its stdout's EOF.
	LspRequest struct {
		ServerID string `json:"server_id"`
	}
	// LspStop kills a started server.
	LspStop struct {
		ServerID string `json:"server_id"`
	}
)

// Op implementations.
func (Info) Op() string          { return OpInfo }
func (Exec) Op() string          { return OpExec }
func (Stdin) Op() string         { return OpStdin }
func (StdinClose) Op() string    { return OpStdinClose }
func (Kill) Op() string          { return OpKill }
func (Ps) Op() string            { return OpPs }
func (Attach) Op() string        { return OpAttach }
func (Logs) Op() string          { return OpLogs }
func (SessionCreate) Op() string { return OpSessionCreate }
func (SessionList) Op() string   { return OpSessionList }
func (SessionRm) Op() string     { return OpSessionRm }
func (FsWrite) Op() string       { return OpFsWrite }
func (FsRead) Op() string        { return OpFsRead }
func (FsList) Op() string        { return OpFsList }
func (FsStat) Op() string        { return OpFsStat }
func (FsMkdir) Op() string       { return OpFsMkdir }
func (FsRm) Op() string          { return OpFsRm }
func (FsRename) Op() string      { return OpFsRename }
func (FsPush) Op() string        { return OpFsPush }
func (FsPull) Op() string        { return OpFsPull }
func (FsFind) Op() string        { return OpFsFind }
func (FsWatch) Op() string       { return OpFsWatch }
func (PtyOpen) Op() string       { return OpPtyOpen }
func (PtyResize) Op() string     { return OpPtyResize }
func (PortForward) Op() string   { return OpPortForward }
func (Data) Op() string          { return OpData }
func (DataEnd) Op() string       { return OpDataEnd }
func (FsReplace) Op() string     { return OpFsReplace }
func (GitClone) Op() string      { return OpGitClone }
func (GitStatus) Op() string     { return OpGitStatus }
func (GitAdd) Op() string        { return OpGitAdd }
func (GitCommit) Op() string     { return OpGitCommit }
func (GitPush) Op() string       { return OpGitPush }
func (GitPull) Op() string       { return OpGitPull }
func (GitBranch) Op() string     { return OpGitBranch }
func (LspStart) Op() string      { return OpLspStart }
func (LspRequest) Op() string    { return OpLspRequest }
func (LspStop) Op() string       { return OpLspStop }

// UnknownOp is a well-formed request whose op this package has no type for
// (an op newer than the package). Raw is the whole line.
type UnknownOp struct {
	Name string
	Raw  []byte
}

// Op implements Request.
func (u UnknownOp) Op() string { return u.Name }

// Responses.
type (
	// Started reports the pid of a started process.
	Started struct {
		Pid uint32 `json:"pid"`
	}
	// Stdout is output of the process in flight.
	Stdout struct {
		Data B64 `json:"data"`
	}
	// Stderr is error output of the process in flight.
	Stderr struct {
		Data B64 `json:"data"`
	}
	// Exit ends an exec: the exit code, -1 for killed or unknown.
	Exit struct {
		Code int32 `json:"code"`
	}
	// Done ends an RPC that has no other result.
	Done struct{}
	// Ready says a port_forward (or watch, lsp_request) is connected.
	Ready struct{}
	// InfoReply answers Info. Agent and Simulated are this project's
	// additions, which old clients ignore: the agent's name, and whether the
	// guest is simulated (chsim) rather than a real machine.
	InfoReply struct {
		Version    string `json:"version"`
		Proto      uint32 `json:"proto"`
		UptimeSecs uint64 `json:"uptime_secs"`
		Procs      int    `json:"procs"`
		Sessions   int    `json:"sessions"`
		Agent      string `json:"agent,omitempty"`
		Simulated  bool   `json:"simulated,omitempty"`
	}
	// Procs answers Ps.
	Procs struct {
		Procs []Proc `json:"procs"`
	}
	// DataReply is a chunk of a file, tar stream or forwarded port.
	DataReply struct {
		Data B64 `json:"data"`
	}
	// Entries is a batch of a directory listing.
	Entries struct {
		Entries []Entry `json:"entries"`
	}
	// Stat answers FsStat.
	Stat struct {
		Info StatInfo `json:"info"`
	}
	// SessionCreated answers SessionCreate.
	SessionCreated struct {
		ID string `json:"id"`
	}
	// Sessions answers SessionList.
	Sessions struct {
		Sessions []string `json:"sessions"`
	}
	// LspStarted answers lsp_start.
	LspStarted struct {
		ServerID string `json:"server_id"`
	}
	// Match is one fs_find hit.
	Match struct {
		File    string `json:"file"`
		Line    uint64 `json:"line"`
		Content string `json:"content"`
	}
	// Replaced is one fs_replace result.
	Replaced struct {
		File         string `json:"file"`
		Replacements uint64 `json:"replacements"`
	}
	// Event is one fs_watch event.
	Event struct {
		Kind string `json:"kind"`
		Path string `json:"path"`
	}
)

// Responses of the git ops.
type (
	// GitStatusResult answers GitStatus: the branch ("HEAD" when detached),
	// commits ahead of and behind its upstream, and the changed files.
	// Truncated says Files was cut at the agent's bound.
	GitStatusResult struct {
		Branch    string          `json:"branch"`
		Ahead     uint32          `json:"ahead"`
		Behind    uint32          `json:"behind"`
		Files     []GitFileStatus `json:"files"`
		Truncated bool            `json:"truncated,omitempty"`
	}
	// GitCommitResult answers GitCommit with the new commit's hash.
	GitCommitResult struct {
		Hash string `json:"hash"`
	}
	// GitBranches answers GitBranch list.
	GitBranches struct {
		Current  string   `json:"current"`
		Branches []string `json:"branches"`
	}
)

// GitFileStatus is one changed file: Staged and Unstaged are git's
// porcelain XY codes ("." unchanged, "M", "A", "D", "R", "?" untracked).
type GitFileStatus struct {
	Path     string `json:"path"`
	Staged   string `json:"staged"`
	Unstaged string `json:"unstaged"`
}

// Proc is one process of a Procs frame; ExitCode is absent while it runs.
type Proc struct {
	Pid                uint32   `json:"pid"`
	Argv               []string `json:"argv"`
	Detached           bool     `json:"detached"`
	State              string   `json:"state"`
	ExitCode           *int32   `json:"exit_code,omitempty"`
	StartedAtEpochSecs uint64   `json:"started_at_epoch_secs"`
}

// Entry is one directory entry.
type Entry struct {
	Name string   `json:"name"`
	Kind FileKind `json:"kind"`
	Size uint64   `json:"size"`
}

// StatInfo describes a file; Mode holds permission bits only.
type StatInfo struct {
	Kind           FileKind `json:"kind"`
	Size           uint64   `json:"size"`
	Mode           uint32   `json:"mode"`
	MtimeEpochSecs uint64   `json:"mtime_epoch_secs"`
}

// Type implementations.
func (Started) Type() string         { return TypeStarted }
func (Stdout) Type() string          { return TypeStdout }
func (Stderr) Type() string          { return TypeStderr }
func (Exit) Type() string            { return TypeExit }
func (Done) Type() string            { return TypeDone }
func (Ready) Type() string           { return TypeReady }
func (*Error) Type() string          { return TypeError }
func (InfoReply) Type() string       { return TypeInfo }
func (Procs) Type() string           { return TypeProcs }
func (DataReply) Type() string       { return TypeData }
func (Entries) Type() string         { return TypeEntries }
func (Stat) Type() string            { return TypeStat }
func (SessionCreated) Type() string  { return TypeSessionCreated }
func (Sessions) Type() string        { return TypeSessions }
func (LspStarted) Type() string      { return TypeLspStarted }
func (Match) Type() string           { return TypeMatch }
func (Replaced) Type() string        { return TypeReplaced }
func (Event) Type() string           { return TypeEvent }
func (GitStatusResult) Type() string { return TypeGitStatusResult }
func (GitCommitResult) Type() string { return TypeGitCommitResult }
func (GitBranches) Type() string     { return TypeGitBranches }

// UnknownType is a well-formed response whose type this package has no
// type for (a type newer than the package). Raw is the whole line.
type UnknownType struct {
	Name string
	Raw  []byte
}

// Type implements Response.
func (u UnknownType) Type() string { return u.Name }

// Error is an error frame, and the Go error a client returns for it.
type Error struct {
	Kind    ErrorKind `json:"kind"`
	Message string    `json:"message"`
}

func (e *Error) Error() string {
	if e.Message == "" {
		return "silkd: " + string(e.Kind)
	}
	return "silkd: " + string(e.Kind) + ": " + e.Message
}

// Is matches e against the kind sentinels (an *Error without a message).
func (e *Error) Is(target error) bool {
	var t *Error
	if !errors.As(target, &t) || t.Message != "" {
		return false
	}
	return t.Kind == e.Kind
}

// Errorf makes an error frame of kind with a formatted message.
func Errorf(kind ErrorKind, format string, args ...any) *Error {
	return &Error{Kind: kind, Message: fmt.Sprintf(format, args...)}
}

// Kind sentinels, for errors.Is.
var (
	ErrBadRequest    = &Error{Kind: KindBadRequest}
	ErrNotFound      = &Error{Kind: KindNotFound}
	ErrUnimplemented = &Error{Kind: KindUnimplemented}
	ErrInternal      = &Error{Kind: KindInternal}
)

// Codec and client errors.
var (
	// ErrFrameTooLarge: a line exceeds MaxFrame; the connection is unusable.
	ErrFrameTooLarge = errors.New("silkd: frame exceeds the 8 MiB cap")
	// ErrTruncated: the stream ended before the RPC's terminal frame (or in
	// the middle of a line).
	ErrTruncated = errors.New("silkd: stream ended before the terminal frame")
)

// ParseError is a line that is not a well-formed frame: bad JSON, no tag,
// or a field of the wrong type. An agent answers it with a bad_request
// whose message starts with "parse: ".
type ParseError struct {
	Err error
}

func (e *ParseError) Error() string { return "parse: " + e.Err.Error() }
func (e *ParseError) Unwrap() error { return e.Err }

// UnexpectedFrameError is a response the client did not expect at that
// point of an RPC.
type UnexpectedFrameError struct {
	Op, Type string
}

func (e *UnexpectedFrameError) Error() string {
	return fmt.Sprintf("silkd: %s: unexpected frame %q", e.Op, e.Type)
}
