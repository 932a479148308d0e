package silkagent

import (
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

// procTable is the processes the Server started, by pid.
type procTable struct {
	mu sync.Mutex
	m  map[uint32]*procEntry
}

type procEntry struct {
	p      Process
	exited bool
}

func (t *procTable) add(p Process) *procEntry {
	e := &procEntry{p: p}
	t.mu.Lock()
	t.m[p.Pid()] = e
	t.mu.Unlock()
	return e
}

// exited marks e exited and forgets it after ReapDelay.
func (t *procTable) exited(e *procEntry) {
	t.mu.Lock()
	e.exited = true
	t.mu.Unlock()
	time.AfterFunc(ReapDelay, func() {
		t.mu.Lock()
		defer t.mu.Unlock()
		if t.m[e.p.Pid()] == e {
			delete(t.m, e.p.Pid())
		}
	})
}

func (t *procTable) running() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for _, e := range t.m {
		if !e.exited {
			n++
		}
	}
	return n
}

func (s *Server) kill(req *silkd.Kill) silkd.Response {
	s.table.mu.Lock()
	e, ok := s.table.m[req.Pid]
	exited := ok && e.exited
	s.table.mu.Unlock()
	if !ok {
		return silkd.Errorf(silkd.KindNotFound, "kill: no such pid %d", req.Pid)
	}
	if exited {
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
// goroutines.
func (s *Server) exec(req *silkd.Exec, w *silkd.Writer) *call {
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
		return fail(silkd.Errorf(silkd.KindNotFound, "no such session %q (sessions are not served by this agent)", req.Session))
	}
	p, err := s.Procs.Spawn(req)
	if err != nil {
		return fail(errFrame(silkd.OpExec, err))
	}
	e := s.table.add(p)
	if err := w.WriteResponse(silkd.Started{Pid: p.Pid()}); err != nil && !req.Detach {
		_ = p.Signal(syscall.SIGKILL)
	}
	if req.Detach {
		_ = p.Stdin().Close()
		go func() {
			var wg sync.WaitGroup
			for _, r := range []io.Reader{p.Stdout(), p.Stderr()} {
				wg.Add(1)
				go func() { defer wg.Done(); _, _ = io.Copy(io.Discard, r) }()
			}
			p.Wait()
			s.table.exited(e)
			drain(&wg, p)
		}()
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
		var wg sync.WaitGroup
		for kind, r := range map[silkd.Bulk]io.Reader{silkd.BulkStdout: p.Stdout(), silkd.BulkStderr: p.Stderr()} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				pump(w, kind, r, p)
			}()
		}
		code := p.Wait()
		s.table.exited(e)
		drain(&wg, p)
		_ = w.WriteResponse(silkd.Exit{Code: code})
	}()
	return c
}

// pump sends r as frames of kind until EOF. A client that no longer takes
// output gets the child killed: nothing it writes can be delivered.
func pump(w *silkd.Writer, kind silkd.Bulk, r io.Reader, p Process) {
	buf := make([]byte, silkd.OutputChunk)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			if werr := w.WriteBulk(kind, buf[:n]); werr != nil {
				_ = p.Signal(syscall.SIGKILL)
				_, _ = io.Copy(io.Discard, r)
				return
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
