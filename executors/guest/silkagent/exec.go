package silkagent

import (
	"context"
	"errors"
	"io"
	"sync"
	"syscall"
	"time"

	"github.com/sbxlog/sbxlog/executors/guest/silkd"
)

// Spawner starts the processes of exec.
type Spawner interface {
	// Spawn starts req's process (req.Argv is non-empty; Detach and Session
	// are the Server's business). A failure to spawn argv[0] or enter Cwd
	// should be a bad_request *silkd.Error.
	Spawn(req *silkd.Exec) (Process, error)
}

// Process is a started process.
type Process interface {
	// Pid identifies it in started and kill (synthetic if need be, unique
	// while it is in the table).
	Pid() uint32
	// Stdin is the child's standard input; Close is its EOF. Write and
	// Close may run concurrently (Close ends a blocked Write).
	Stdin() io.WriteCloser
	// Stdout and Stderr are read to EOF by the Server.
	Stdout() io.Reader
	Stderr() io.Reader
	// CloseOutput ends reads blocked on Stdout and Stderr: the post-exit
	// drain is over.
	CloseOutput()
	// Wait blocks until the process exits and returns its code, -1 when a
	// signal ended it.
	Wait() int32
	// Signal sends sig to the process.
	Signal(sig syscall.Signal) error
}

func (s *Server) kill(req *silkd.Kill) silkd.Response {
	e, ok := s.table.get(req.Pid)
	if !ok {
		return silkd.Errorf(silkd.KindNotFound, "kill: no such pid %d", req.Pid)
	}
	if _, exited := e.out.exitCode(); exited {
		return silkd.Done{} // never signal a reaped pid: it may be another process now
	}
	sig := syscall.SIGKILL
	if req.Signal != nil {
		sig = syscall.Signal(*req.Signal)
	}
	if err := e.p.Signal(sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		return errFrame(silkd.OpKill, err)
	}
	return silkd.Done{}
}

// exec runs exec: spawned here, on the reader goroutine, so the stdin
// frames that follow reach the child; its output and exit are sent from
// goroutines. Every process's output goes to its log (logs, attach); a
// foreground one's also to the client.
func (s *Server) exec(ctx context.Context, req *silkd.Exec, w *silkd.Writer) *call {
	fail := func(e *silkd.Error) *call {
		_ = w.WriteResponse(e)
		return finished()
	}
	switch {
	case len(req.Argv) == 0:
		return fail(badRequest("argv must not be empty"))
	case req.Detach && req.Session != "":
		return fail(badRequest("detach is not supported with session"))
	case req.Session != "":
		return s.sessionExec(ctx, req, w)
	}
	p, err := s.Procs.Spawn(req)
	if err != nil {
		return fail(errFrame(silkd.OpExec, err))
	}
	e := s.table.add(p, req.Argv, req.Detach, s.now())
	if err := w.WriteResponse(silkd.Started{Pid: p.Pid()}); err != nil && !req.Detach {
		_ = p.Signal(syscall.SIGKILL)
	}
	if req.Detach {
		_ = p.Stdin().Close()
		go s.supervise(e, nil)
		return finished()
	}
	c := &call{done: make(chan struct{})}
	stdin := p.Stdin()
	c.feed = func(in silkd.Request) {
		switch v := in.(type) {
		case *silkd.Stdin:
			_, _ = stdin.Write(v.Data) // a child that closed its stdin drops it
		case *silkd.StdinClose:
			c.end()
		}
	}
	c.endFn = func() { _ = stdin.Close() }
	go func() {
		defer c.finish()
		defer c.end()
		code := s.supervise(e, w)
		_ = w.WriteResponse(silkd.Exit{Code: code})
	}()
	return c
}

// supervise pumps e's output into its log (and to w, if not nil) until the
// process has exited and its output drained, records the exit, and returns
// the code.
func (s *Server) supervise(e *procEntry, w *silkd.Writer) int32 {
	p := e.p
	var wg sync.WaitGroup
	for kind, r := range map[silkd.Bulk]io.Reader{silkd.BulkStdout: p.Stdout(), silkd.BulkStderr: p.Stderr()} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pump(w, kind, r, e)
		}()
	}
	code := p.Wait()
	s.table.reaped(e, code)
	drain(&wg, p)
	s.table.ended(e)
	return code
}

// pump copies r into e's log, and to w as frames of kind when w is not
// nil, until EOF. A client that no longer takes output gets the child
// killed: nothing it writes can be delivered.
func pump(w *silkd.Writer, kind silkd.Bulk, r io.Reader, e *procEntry) {
	buf := make([]byte, silkd.OutputChunk)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			e.out.append(kind, buf[:n])
			if w != nil {
				if werr := w.WriteBulk(kind, buf[:n]); werr != nil {
					_ = e.p.Signal(syscall.SIGKILL)
					w = nil
				}
			}
		}
		if err != nil {
			return
		}
	}
}

// drain waits for the output pumps for at most PostExitDrain, then ends
// them.
func drain(wg *sync.WaitGroup, p Process) {
	pumped := make(chan struct{})
	go func() { wg.Wait(); close(pumped) }()
	t := time.NewTimer(PostExitDrain)
	defer t.Stop()
	select {
	case <-pumped:
	case <-t.C:
		p.CloseOutput()
		<-pumped
	}
}
