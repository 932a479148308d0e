package silkagent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/sbxlog/sbxlog/executors/guest/silkd"
)

// Timings of the process table and of exec.
const (
	// PostExitDrain is how long a child's output may keep flowing after it
	// exited (a grandchild may hold the pipes) before exit is sent.
	PostExitDrain = 2 * time.Second
	// ReapDelay is how long an exited process stays in the table (kill
	// answers done for it) before its pid is unknown.
	ReapDelay = 5 * time.Minute
	// DialTimeout bounds port_forward's connect to the guest port.
	DialTimeout = 10 * time.Second
)

// Server serves the silkd protocol. The zero value serves info and answers
// everything else unimplemented; set the backends to serve more. Its fields
// must not change once it serves.
type Server struct {
	// Version is info's version (default "sbx-agent").
	Version string
	// Agent is info's agent, this project's addition naming the agent.
	Agent string
	// Simulated sets info's simulated: the guest is not a real machine.
	Simulated bool
	// Procs runs exec and kill, and with them ps, logs and attach; nil
	// leaves them unimplemented. If it is also a PtySpawner it serves
	// pty_open and pty_resize, if a ShellSpawner the session ops.
	Procs Spawner
	// FS serves the fs_* ops; nil leaves them unimplemented.
	FS FS
	// Dial connects port_forward to a guest port; nil leaves it
	// unimplemented. A refused connection must wrap syscall.ECONNREFUSED.
	Dial func(ctx context.Context, port uint16) (net.Conn, error)
	// Uptime is info's uptime (default: since the Server's first use).
	Uptime func() time.Duration
	// Limits bound the whole-tree ops and fs_watch (zero: DefaultLimits).
	Limits Limits
	// LSPDir holds the guest's language-server manifests (DefaultLSPDir on
	// a real guest); empty leaves the lsp ops unimplemented.
	LSPDir string
	// Git serves the git ops (go-git on the machine's own files: a real
	// guest's); false leaves them unimplemented.
	Git bool
	// Now is the wall clock of git commits, ps's start times and idle
	// sessions (default time.Now).
	Now func() time.Time

	once     sync.Once
	start    time.Time
	table    procTable
	sessions sessionTable
	ptys     atomic.Int32 // open pty_open RPCs, for MaxPtys
	lsp      lspTable
}

func (s *Server) init() {
	s.once.Do(func() {
		s.start = time.Now()
		s.table.m = map[uint32]*procEntry{}
		s.sessions.m = map[string]*session{}
	})
}

// Serve accepts connections on l and serves each in its own goroutine until
// l fails (it returns that error).
func (s *Server) Serve(l net.Listener) error {
	for {
		c, err := l.Accept()
		if err != nil {
			return err
		}
		go s.ServeConn(c)
	}
}

// call is an RPC on a connection. feed receives its input frames (on the
// connection's reader goroutine, so it must not keep a payload past its
// return); end says no more input will come; done is closed once its
// terminal frame is written.
type call struct {
	feed    func(silkd.Request)
	endFn   func()
	endOnce sync.Once
	done    chan struct{}
	fin     atomic.Bool
}

func (c *call) end() {
	c.endOnce.Do(func() {
		if c.endFn != nil {
			c.endFn()
		}
	})
}

func (c *call) finish() {
	if c.fin.CompareAndSwap(false, true) {
		close(c.done)
	}
}

// finished is a call whose terminal frame is already written.
func finished() *call {
	c := &call{done: make(chan struct{})}
	c.finish()
	return c
}

// ServeConn serves one connection until the client's stream ends and the
// RPC in flight is over, then closes it.
func (s *Server) ServeConn(nc net.Conn) {
	s.init()
	defer nc.Close()
	ctx, cancel := context.WithCancel(context.Background())
	r := silkd.NewReader(nc)
	w := silkd.NewWriter(nc)
	var cur *call
	wait := func() {
		if cur != nil {
			cur.end()
			<-cur.done
		}
	}
	defer wait()
	// Cancelled as the client's stream ends, before the RPC in flight is
	// waited for: an RPC that only serves that client (attach, a session's
	// command) stops.
	defer cancel()
	for {
		req, err := r.ReadRequest()
		if err != nil {
			var pe *silkd.ParseError
			if errors.As(err, &pe) {
				wait()
				_ = w.WriteResponse(&silkd.Error{Kind: silkd.KindBadRequest, Message: pe.Error()})
				continue
			}
			if errors.Is(err, silkd.ErrFrameTooLarge) {
				wait()
				_ = w.WriteResponse(silkd.Errorf(silkd.KindBadRequest, "frame exceeds the %d byte cap", silkd.MaxFrame))
			}
			return
		}
		if silkd.IsInput(req.Op()) {
			switch {
			case cur == nil:
				_ = w.WriteResponse(silkd.Errorf(silkd.KindBadRequest, "stray %s frame: no RPC in flight", req.Op()))
			case !cur.fin.Load() && cur.feed != nil:
				cur.feed(req)
			}
			continue
		}
		wait()
		cur = s.dispatch(ctx, req, w)
	}
}

// dispatch starts the RPC req opens. Its first phase (validation, spawning,
// opening, dialing) runs here, on the reader goroutine, so the input frames
// that follow find it ready.
func (s *Server) dispatch(ctx context.Context, req silkd.Request, w *silkd.Writer) *call {
	answer := func(r silkd.Response) *call {
		_ = w.WriteResponse(r)
		return finished()
	}
	switch v := req.(type) {
	case *silkd.Info:
		return answer(s.info())
	case *silkd.Exec:
		if s.Procs == nil {
			break
		}
		return s.exec(ctx, v, w)
	case *silkd.Kill:
		if s.Procs == nil {
			break
		}
		return answer(s.kill(v))
	case *silkd.Ps, *silkd.Logs, *silkd.Attach, *silkd.PtyOpen, *silkd.PtyResize,
		*silkd.SessionCreate, *silkd.SessionList, *silkd.SessionRm:
		if c := s.procOp(ctx, req, w); c != nil {
			return c
		}
	case *silkd.PortForward:
		if s.Dial == nil {
			break
		}
		return s.forward(ctx, v, w)
	case *silkd.FsWrite:
		if s.FS == nil {
			break
		}
		return s.fsWrite(v, w)
	case *silkd.FsRead, *silkd.FsList, *silkd.FsStat, *silkd.FsMkdir, *silkd.FsRm, *silkd.FsRename:
		if s.FS == nil {
			break
		}
		s.fsOp(req, w)
		return finished()
	default:
		if c := s.dispatchTools(req, w); c != nil {
			return c
		}
	}
	if s.Simulated {
		// Said so, as pty_open says it: a client must not take the
		// simulated guest's gap for the real agent's.
		return answer(silkd.Errorf(silkd.KindUnimplemented, "%s is not served by this agent: the guest is simulated", req.Op()))
	}
	return answer(silkd.Errorf(silkd.KindUnimplemented, "%s is not served by this agent", req.Op()))
}

func (s *Server) info() silkd.InfoReply {
	up := time.Since(s.start)
	if s.Uptime != nil {
		up = s.Uptime()
	}
	version := s.Version
	if version == "" {
		version = "sbx-agent"
	}
	return silkd.InfoReply{
		Version:    version,
		Proto:      silkd.ProtoKeepAlive,
		UptimeSecs: uint64(up / time.Second),
		Procs:      s.table.running(),
		Sessions:   s.sessions.len(),
		Agent:      s.Agent,
		Simulated:  s.Simulated,
	}
}

// errFrame turns a backend error into an error frame for op.
func errFrame(op string, err error) *silkd.Error {
	var e *silkd.Error
	if errors.As(err, &e) {
		return e
	}
	kind := silkd.KindInternal
	if errors.Is(err, fs.ErrNotExist) {
		kind = silkd.KindNotFound
	}
	return &silkd.Error{Kind: kind, Message: op + ": " + err.Error()}
}

func badRequest(format string, args ...any) *silkd.Error {
	return silkd.Errorf(silkd.KindBadRequest, format, args...)
}

// forward runs port_forward.
func (s *Server) forward(ctx context.Context, req *silkd.PortForward, w *silkd.Writer) *call {
	if req.Port == 0 {
		_ = w.WriteResponse(badRequest("port_forward: port must be 1-65535"))
		return finished()
	}
	dctx, cancel := context.WithTimeout(ctx, DialTimeout)
	sock, err := s.Dial(dctx, req.Port)
	cancel()
	if err != nil {
		kind := silkd.KindInternal
		if errors.Is(err, syscall.ECONNREFUSED) {
			kind = silkd.KindNotFound
		}
		_ = w.WriteResponse(&silkd.Error{Kind: kind, Message: fmt.Sprintf("connect %d: %v", req.Port, err)})
		return finished()
	}
	if err := w.WriteResponse(silkd.Ready{}); err != nil {
		sock.Close()
		return finished()
	}
	c := &call{done: make(chan struct{})}
	inputDone := make(chan struct{})
	var wbroken atomic.Bool
	closeWrite := func() {
		if cw, ok := sock.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
		} else {
			sock.Close()
		}
	}
	c.feed = func(in silkd.Request) {
		switch v := in.(type) {
		case *silkd.Data:
			if !wbroken.Load() {
				if _, err := sock.Write(v.Data); err != nil {
					wbroken.Store(true)
				}
			}
		case *silkd.DataEnd:
			c.end()
		}
	}
	c.endFn = func() {
		closeWrite()
		close(inputDone)
	}
	go func() {
		defer c.finish()
		defer sock.Close()
		buf := make([]byte, silkd.BulkChunk)
		for {
			n, err := sock.Read(buf)
			if n > 0 {
				if werr := w.WriteBulk(silkd.BulkDataReply, buf[:n]); werr != nil {
					// The client is gone: nothing more can be delivered.
					return
				}
			}
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				_ = w.WriteResponse(silkd.Errorf(silkd.KindInternal, "port_forward %d: read: %v", req.Port, err))
				return
			}
		}
		if err := w.WriteResponse(silkd.Done{}); err != nil {
			return
		}
		// Both directions must end before the next RPC: the client may still
		// be sending after the guest closed its side.
		<-inputDone
	}()
	return c
}
