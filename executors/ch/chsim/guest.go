package chsim

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/sbxlog/sbxlog/executors/guest/silkagent"
	"github.com/sbxlog/sbxlog/executors/guest/silkd"
)

// The simulated guest's silkd agent, on vsock port silkd.Port. It is the
// project's protocol engine (package silkagent) over simulated backends, so
// the protocol is the real one and only what it acts on is simulated:
//   - info says so: agent "chsim simulated guest", simulated true.
//   - Files live in memory, one tree per VM (its tmpfs): empty after a
//     boot, kept in the snapshot's state.json across hibernate and wake,
//     bounded by Options.GuestFSBytes and half the VM's memory (what
//     would pass it fails with ENOSPC, reported as a full tmpfs is).
//   - exec runs no host command, ever. It simulates SimCommands (echo,
//     cat of stdin or of files of the tree, true, false, sleep) with
//     synthetic pids; anything else is a bad_request that says so.
//   - port_forward reaches an in-memory echo server on SimEchoPort (both
//     half-closes work); every other port is refused (not_found).
//   - Connections opened before a pause keep being answered while the VM is
//     paused (a real guest would stall them); new ones wait for the VM to
//     run, as the CONNECT handshake does.

// SimEchoPort is the guest port where the simulated guest runs an echo
// server (the classic echo port).
const SimEchoPort = 7

// SimAgent is the simulated agent's name in info.
const SimAgent = "chsim simulated guest"

// SimCommands are the commands the simulated guest's exec understands.
var SimCommands = []string{"echo", "cat", "true", "false", "sleep"}

// simGuest is the guest side of one boot of a VM: its files and its agent.
type simGuest struct {
	files *silkagent.MemFS
	agent *silkagent.Server
}

func newSimGuest(files []silkagent.MemFile, now func() time.Time, limit int64) *simGuest {
	fs := silkagent.NewMemFS(files)
	fs.Now = now
	fs.Limit = limit
	// A guest starts with the directories a busybox initramfs has.
	for _, d := range []string{"/tmp", "/root"} {
		if _, err := fs.Stat(d); err != nil {
			_ = fs.Mkdir(d, true)
		}
	}
	return &simGuest{
		files: fs,
		agent: &silkagent.Server{
			Version:   "chsim",
			Agent:     SimAgent,
			Simulated: true,
			FS:        fs,
			Procs:     &simProcs{files: fs},
			Dial:      simDial,
		},
	}
}

// guestFSLimit is the bound of v's simulated tmpfs: GuestFSBytes (its
// default when unset), and at most half the VM's memory.
func (s *Server) guestFSLimit(v *vmInstance) int64 {
	limit := s.opts.GuestFSBytes
	if limit == 0 {
		limit = DefaultGuestFSBytes
	}
	if half := v.memSize / 2; half > 0 {
		limit = min(limit, half)
	}
	return limit
}

// simDial connects port_forward: SimEchoPort is the echo server, anything
// else is refused.
func simDial(_ context.Context, port uint16) (net.Conn, error) {
	if port != SimEchoPort {
		return nil, fmt.Errorf("chsim simulated guest: nothing listens on port %d (only the echo server on %d): %w", port, SimEchoPort, syscall.ECONNREFUSED)
	}
	client, server := pipePair()
	go func() {
		_, _ = io.Copy(server, server)
		_ = server.CloseWrite()
		server.closeRead()
	}()
	return client, nil
}

// halfConn is one end of an in-memory stream with half-close.
type halfConn struct {
	r *io.PipeReader
	w *io.PipeWriter
}

func pipePair() (*halfConn, *halfConn) {
	ar, bw := io.Pipe()
	br, aw := io.Pipe()
	return &halfConn{r: ar, w: aw}, &halfConn{r: br, w: bw}
}

type simAddr struct{}

func (simAddr) Network() string { return "chsim" }
func (simAddr) String() string  { return "chsim-guest" }

func (h *halfConn) Read(p []byte) (int, error)  { return h.r.Read(p) }
func (h *halfConn) Write(p []byte) (int, error) { return h.w.Write(p) }
func (h *halfConn) CloseWrite() error           { return h.w.Close() }
func (h *halfConn) closeRead()                  { _ = h.r.Close() }
func (h *halfConn) Close() error {
	_ = h.w.Close()
	return h.r.Close()
}
func (h *halfConn) LocalAddr() net.Addr              { return simAddr{} }
func (h *halfConn) RemoteAddr() net.Addr             { return simAddr{} }
func (h *halfConn) SetDeadline(time.Time) error      { return os.ErrNoDeadline }
func (h *halfConn) SetReadDeadline(time.Time) error  { return os.ErrNoDeadline }
func (h *halfConn) SetWriteDeadline(time.Time) error { return os.ErrNoDeadline }

// simProcs is the simulated guest's exec: commands are goroutines.
type simProcs struct {
	files *silkagent.MemFS
	pids  atomic.Uint32
}

func (p *simProcs) Spawn(req *silkd.Exec) (silkagent.Process, error) {
	name := path.Base(req.Argv[0])
	known := false
	for _, c := range SimCommands {
		known = known || c == name
	}
	if !known {
		return nil, silkd.Errorf(silkd.KindBadRequest, "exec: %s: chsim simulates the guest and runs no commands; simulated: %s",
			req.Argv[0], strings.Join(SimCommands, ", "))
	}
	if req.Cwd != "" {
		if st, err := p.files.Stat(req.Cwd); err != nil || st.Kind != silkd.FileDir {
			return nil, silkd.Errorf(silkd.KindBadRequest, "exec: cwd %s: no such directory in the simulated guest", req.Cwd)
		}
	}
	pr := newSimProc(1000 + p.pids.Add(1))
	go pr.run(name, req.Argv[1:], p.files)
	return pr, nil
}

type simProc struct {
	pid            uint32
	inR            *io.PipeReader
	inW            *io.PipeWriter
	outR, errR     *io.PipeReader
	outW, errW     *io.PipeWriter
	killed         chan struct{}
	killOnce       sync.Once
	exited         chan struct{}
	code           int32
	closeOutputOne sync.Once
}

func newSimProc(pid uint32) *simProc {
	p := &simProc{pid: pid, killed: make(chan struct{}), exited: make(chan struct{})}
	p.inR, p.inW = io.Pipe()
	p.outR, p.outW = io.Pipe()
	p.errR, p.errW = io.Pipe()
	return p
}

func (p *simProc) Pid() uint32           { return p.pid }
func (p *simProc) Stdin() io.WriteCloser { return p.inW }
func (p *simProc) Stdout() io.Reader     { return p.outR }
func (p *simProc) Stderr() io.Reader     { return p.errR }

func (p *simProc) CloseOutput() {
	p.closeOutputOne.Do(func() {
		_ = p.outR.Close()
		_ = p.errR.Close()
	})
}

func (p *simProc) Wait() int32 {
	<-p.exited
	return p.code
}

// Signal simulates the default dispositions: SIGKILL, SIGTERM, SIGINT and
// SIGHUP end the process (exit -1), the others are ignored.
func (p *simProc) Signal(sig syscall.Signal) error {
	switch sig {
	case syscall.SIGKILL, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP:
		p.killOnce.Do(func() {
			close(p.killed)
			// A command blocked on its pipes is woken, as a real one dies there.
			_ = p.inR.CloseWithError(io.ErrClosedPipe)
			_ = p.outW.CloseWithError(io.ErrClosedPipe)
			_ = p.errW.CloseWithError(io.ErrClosedPipe)
		})
	}
	select {
	case <-p.exited:
		return syscall.ESRCH
	default:
		return nil
	}
}

// run is the simulated command.
func (p *simProc) run(name string, args []string, files *silkagent.MemFS) {
	code := int32(0)
	switch name {
	case "echo":
		nl := "\n"
		if len(args) > 0 && args[0] == "-n" {
			nl, args = "", args[1:]
		}
		_, _ = io.WriteString(p.outW, strings.Join(args, " ")+nl)
	case "cat":
		if len(args) == 0 {
			_, _ = io.Copy(p.outW, p.inR)
		}
		for _, a := range args {
			f, err := files.Open(a)
			if err != nil {
				fmt.Fprintf(p.errW, "cat: %s: No such file or directory\n", a)
				code = 1
				continue
			}
			_, _ = io.Copy(p.outW, f)
			f.Close()
		}
	case "false":
		code = 1
	case "sleep":
		d := time.Duration(0)
		if len(args) > 0 {
			if s, err := strconv.ParseFloat(args[0], 64); err == nil && s > 0 {
				d = time.Duration(s * float64(time.Second))
			}
		}
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-p.killed:
		}
		t.Stop()
	}
	select {
	case <-p.killed:
		code = -1
	default:
	}
	_ = p.inR.Close()
	_ = p.outW.Close()
	_ = p.errW.Close()
	p.code = code
	close(p.exited)
}
