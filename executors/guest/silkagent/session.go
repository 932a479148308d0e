package silkagent

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"slices"
	"sync"
	"time"
	"unicode"

	"github.com/sbxlog/sbxlog/executors/guest/silkd"
)

// Bounds of the sessions.
const (
	// MaxSessions bounds the sessions (each a shell of the guest) at once.
	MaxSessions = 32
	// SessionIdle is how long a session may go without a command before
	// the next session_create or session_list removes it, as the old
	// agent's idle reaper did.
	SessionIdle = 30 * time.Minute
	// MaxSessionID bounds a session id's length in bytes.
	MaxSessionID = 128
)

// ShellSpawner is a Spawner that also starts the persistent shells of
// sessions.
type ShellSpawner interface {
	// StartShell starts a shell in cwd (the agent's own if empty) with the
	// environment exec would give, plus env.
	StartShell(cwd string, env map[string]string) (Shell, error)
}

// Shell is a session's persistent shell: its cwd, environment and shell
// variables carry over from one command to the next.
type Shell interface {
	// Run runs argv as one command of the shell, each argument quoted, so
	// that a cd, an export or an eval of shell text acts on the shell
	// itself. Its stdin is empty; its stdout and stderr, merged, go to out
	// as they come. When interrupt is closed the command is killed, not the
	// shell; a shell that does not come back from it is closed. An error
	// means the shell is gone.
	Run(argv []string, out func([]byte), interrupt <-chan struct{}) (int32, error)
	// Close kills the shell and everything it started.
	Close()
}

// sessionTable is the sessions by id, shared by all connections.
type sessionTable struct {
	mu       sync.Mutex
	m        map[string]*session
	createMu sync.Mutex // one session_create at a time: its shell starts outside mu
}

type session struct {
	sh   Shell
	busy chan struct{} // holds a token while a command runs: one at a time
	used time.Time     // the end of its last command; under the table's mu
}

func (t *sessionTable) len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.m)
}

// list returns the ids, sorted, after removing the idle sessions.
func (t *sessionTable) list(now time.Time) []string {
	t.reapIdle(now)
	t.mu.Lock()
	defer t.mu.Unlock()
	ids := make([]string, 0, len(t.m))
	for id := range t.m {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// reapIdle removes the sessions that have run no command for SessionIdle;
// a session running one is never idle.
func (t *sessionTable) reapIdle(now time.Time) {
	t.mu.Lock()
	var idle []*session
	for id, s := range t.m {
		if now.Sub(s.used) < SessionIdle {
			continue
		}
		select {
		case s.busy <- struct{}{}:
			delete(t.m, id)
			idle = append(idle, s)
		default:
		}
	}
	t.mu.Unlock()
	for _, s := range idle {
		s.sh.Close()
	}
}

// remove removes id if it still names s (nil: whatever it names) and
// closes its shell.
func (t *sessionTable) remove(id string, s *session) bool {
	t.mu.Lock()
	cur, ok := t.m[id]
	if ok && (s == nil || cur == s) {
		delete(t.m, id)
	}
	t.mu.Unlock()
	if ok && (s == nil || cur == s) {
		cur.sh.Close()
		return true
	}
	return false
}

// validSessionID: printable, no spaces, at most MaxSessionID bytes.
func validSessionID(id string) bool {
	if len(id) > MaxSessionID {
		return false
	}
	for _, r := range id {
		if !unicode.IsPrint(r) || unicode.IsSpace(r) {
			return false
		}
	}
	return true
}

func (s *Server) sessionCreate(ss ShellSpawner, req *silkd.SessionCreate) silkd.Response {
	id := req.ID
	if !validSessionID(id) {
		return badRequest("session_create: id must be printable without spaces, at most %d bytes", MaxSessionID)
	}
	if id == "" {
		b := make([]byte, 8)
		_, _ = rand.Read(b)
		id = "sess-" + hex.EncodeToString(b)
	}
	t := &s.sessions
	t.createMu.Lock()
	defer t.createMu.Unlock()
	now := s.now()
	t.reapIdle(now)
	t.mu.Lock()
	_, dup := t.m[id]
	n := len(t.m)
	t.mu.Unlock()
	switch {
	case dup:
		return badRequest("session_create: session %q exists", id)
	case n >= MaxSessions:
		return silkd.Errorf(silkd.KindInternal, "session_create: %d sessions are open, the most this agent keeps (session_rm ends one)", MaxSessions)
	}
	sh, err := ss.StartShell(req.Cwd, req.Env)
	if err != nil {
		return errFrame(silkd.OpSessionCreate, err)
	}
	t.mu.Lock()
	t.m[id] = &session{sh: sh, busy: make(chan struct{}, 1), used: now}
	t.mu.Unlock()
	return silkd.SessionCreated{ID: id}
}

func (s *Server) sessionRm(req *silkd.SessionRm) silkd.Response {
	if !s.sessions.remove(req.ID, nil) {
		return silkd.Errorf(silkd.KindNotFound, "session_rm: no such session %q", req.ID)
	}
	return silkd.Done{}
}

// sessionExec runs an exec in a session: stdout frames (stdout and stderr
// merged), then exit; no started (the command has no pid of its own).
// Commands of one session run one at a time, in order of arrival. The
// command is interrupted when its client goes away or stops taking its
// output, since it holds the session. cwd, env and user of the request are
// the session's business and ignored, as the old agent did.
func (s *Server) sessionExec(ctx context.Context, req *silkd.Exec, w *silkd.Writer) *call {
	t := &s.sessions
	t.mu.Lock()
	sess, ok := t.m[req.Session]
	t.mu.Unlock()
	if !ok {
		_ = w.WriteResponse(silkd.Errorf(silkd.KindNotFound, "exec: no such session %q", req.Session))
		return finished()
	}
	c := &call{done: make(chan struct{})} // stdin is dropped: the command reads none
	go func() {
		defer c.finish()
		select {
		case sess.busy <- struct{}{}:
		case <-ctx.Done():
			return
		}
		interrupt := make(chan struct{})
		var once sync.Once
		stop := func() { once.Do(func() { close(interrupt) }) }
		defer context.AfterFunc(ctx, stop)()
		broken := false
		out := func(p []byte) {
			for len(p) > 0 && !broken {
				n := min(len(p), silkd.OutputChunk)
				if w.WriteBulk(silkd.BulkStdout, p[:n]) != nil {
					broken = true
					stop()
				}
				p = p[n:]
			}
		}
		code, err := sess.sh.Run(req.Argv, out, interrupt)
		t.mu.Lock()
		sess.used = s.now()
		t.mu.Unlock()
		<-sess.busy
		if err != nil {
			t.remove(req.Session, sess)
			_ = w.WriteResponse(silkd.Errorf(silkd.KindInternal, "exec: session %q: %v", req.Session, err))
			return
		}
		_ = w.WriteResponse(silkd.Exit{Code: code})
	}()
	return c
}
