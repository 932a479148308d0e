package silkagent

import (
	"context"
	"syscall"

	"github.com/sbxlog/sbxlog/executors/guest/silkd"
)

// MaxPtys bounds the terminals open at once (each holds a shell and a
// pty pair of the guest).
const MaxPtys = 32

// PtySpawner is a Spawner that also starts shells under a terminal
// (pty_open).
type PtySpawner interface {
	// SpawnPty starts the guest's shell, interactive, on a new terminal of
	// req's size, with req's cwd, env and user as exec has them.
	SpawnPty(req *silkd.PtyOpen) (Pty, error)
}

// Pty is a process on a terminal: Stdout is the terminal's output, Stdin
// its input (Close is not an EOF: it is ignored), Stderr is empty.
type Pty interface {
	Process
	// Argv is what ps shows for it.
	Argv() []string
	// Resize sets the terminal's size; the shell gets SIGWINCH.
	Resize(cols, rows uint16) error
}

// procOp serves the process table's ops, the terminals and the sessions;
// nil means the backends do not serve req (unimplemented).
func (s *Server) procOp(ctx context.Context, req silkd.Request, w *silkd.Writer) *call {
	if s.Procs == nil {
		return nil
	}
	answer := func(r silkd.Response) *call {
		_ = w.WriteResponse(r)
		return finished()
	}
	switch v := req.(type) {
	case *silkd.Ps:
		return answer(silkd.Procs{Procs: s.table.list()})
	case *silkd.Logs:
		s.logs(v, w)
		return finished()
	case *silkd.Attach:
		return s.attach(ctx, v, w)
	case *silkd.PtyOpen:
		if ps, ok := s.Procs.(PtySpawner); ok {
			return s.ptyOpen(ps, v, w)
		}
	case *silkd.PtyResize:
		if _, ok := s.Procs.(PtySpawner); ok {
			return answer(s.ptyResize(v))
		}
	case *silkd.SessionCreate:
		if ss, ok := s.Procs.(ShellSpawner); ok {
			return answer(s.sessionCreate(ss, v))
		}
	case *silkd.SessionList:
		if _, ok := s.Procs.(ShellSpawner); ok {
			return answer(silkd.Sessions{Sessions: s.sessions.list(s.now())})
		}
	case *silkd.SessionRm:
		if _, ok := s.Procs.(ShellSpawner); ok {
			return answer(s.sessionRm(v))
		}
	}
	return nil
}

// ptyOpen runs pty_open: started, the terminal's output as stdout frames,
// exit. stdin frames are typed into it; stdin_close is ignored (a terminal
// outlives its input's end); the end of the client's input (its stream
// ends, or it sends another request) hangs up: the shell is killed, and
// the kernel sends its foreground job SIGHUP.
func (s *Server) ptyOpen(ps PtySpawner, req *silkd.PtyOpen, w *silkd.Writer) *call {
	fail := func(e *silkd.Error) *call {
		_ = w.WriteResponse(e)
		return finished()
	}
	if s.ptys.Add(1) > MaxPtys {
		s.ptys.Add(-1)
		return fail(silkd.Errorf(silkd.KindInternal, "pty_open: %d terminals are open, the most this agent keeps", MaxPtys))
	}
	p, err := ps.SpawnPty(req)
	if err != nil {
		s.ptys.Add(-1)
		return fail(errFrame(silkd.OpPtyOpen, err))
	}
	e := s.table.add(p, p.Argv(), false, s.now())
	if err := w.WriteResponse(silkd.Started{Pid: p.Pid()}); err != nil {
		_ = p.Signal(syscall.SIGKILL)
	}
	c := &call{done: make(chan struct{})}
	stdin := p.Stdin()
	c.feed = func(in silkd.Request) {
		if v, ok := in.(*silkd.Stdin); ok {
			_, _ = stdin.Write(v.Data) // a terminal whose shell is gone drops it
		}
	}
	c.endFn = func() { _ = p.Signal(syscall.SIGKILL) }
	go func() {
		defer c.finish()
		defer s.ptys.Add(-1)
		code := s.supervise(e, w)
		_ = w.WriteResponse(silkd.Exit{Code: code})
	}()
	return c
}

func (s *Server) ptyResize(req *silkd.PtyResize) silkd.Response {
	e, ferr := s.lookup(silkd.OpPtyResize, req.Pid)
	if ferr != nil {
		return ferr
	}
	t, ok := e.p.(Pty)
	if !ok {
		return badRequest("pty_resize: pid %d is not a terminal (pty_open starts those)", req.Pid)
	}
	if _, exited := e.out.exitCode(); exited {
		return silkd.Errorf(silkd.KindNotFound, "pty_resize: pid %d has exited", req.Pid)
	}
	if err := t.Resize(req.Cols, req.Rows); err != nil {
		return errFrame(silkd.OpPtyResize, err)
	}
	return silkd.Done{}
}
