package silkagent

import (
	"bufio"
	"context"
	"crypto/sha1"
	"encoding/base64"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"path"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/sbxlog/sbxlog/executors/guest/silkd"
)

// The simulated guest (see the package doc): the backends a Server gets
// where there is no real guest, so the protocol stays the real one and only
// what it acts on is simulated.

// SimEchoPort is the guest port where the simulated guest runs an echo
// server (the classic echo port); SimHTTPPort its HTTP server; every other
// port refuses.
const SimEchoPort = 7

// SimHTTPPort is the simulated guest's HTTP server: one request per
// connection, answered 200 text/plain with the request line and the names
// of the headers it got ("GET /a?b=c HTTP/1.1" then "header: Name" lines,
// sorted); a request to upgrade to websocket is answered 101 with its
// Sec-WebSocket-Accept, after which every byte is echoed (the frames come
// back as they were sent: the relay, not WebSocket, is what it shows).
const SimHTTPPort = 80

// SimCommands are the commands the simulated guest's exec understands
// (argv[0]'s base name, so /bin/true is true):
//   - echo [-n] args: the arguments to stdout, a newline unless -n;
//   - stderr args: the arguments to stderr, with a newline;
//   - cat [files]: the files of the guest's tree to stdout (exit 1 if one
//     is missing, after the others), or stdin when none is named;
//   - true, false: exit 0, 1; exit N: exit N (bad_request if N is not a
//     number);
//   - sleep S: sleep S seconds (bad_request unless S is a number >= 0);
//   - yes [word]: word ("y" by default) line after line, until killed or
//     its output is closed.
var SimCommands = []string{"echo", "stderr", "cat", "true", "false", "exit", "sleep", "yes"}

// SimSpawner is the simulated guest's Spawner: anything not in SimCommands
// is a bad_request that names the simulation, and so is a cwd that is not
// a directory of FS. Its processes take the default dispositions of
// signals: SIGKILL, SIGTERM, SIGINT and SIGHUP end one (exit -1), the
// others are ignored; a signal to one that exited is ESRCH.
type SimSpawner struct {
	// Name is who simulates, for the refusal ("<Name> simulates the guest
	// and runs no commands").
	Name string
	// FS is the guest's file tree (required): cwd is checked against it and
	// cat reads it.
	FS *MemFS

	pids atomic.Uint32
}

// Spawn implements Spawner.
func (s *SimSpawner) Spawn(req *silkd.Exec) (Process, error) {
	run, err := s.command(req.Argv)
	if err != nil {
		return nil, err
	}
	if req.Cwd != "" {
		if st, err := s.FS.Stat(req.Cwd); err != nil || st.Kind != silkd.FileDir {
			return nil, badRequest("exec: cwd %s: no such directory in the simulated guest", req.Cwd)
		}
	}
	return startSimProc(1000+s.pids.Add(1), run), nil
}

// command returns what argv does, or a bad_request when the simulated guest
// cannot run it. Arguments are checked here, so a bad one fails the spawn.
func (s *SimSpawner) command(argv []string) (func(*simProc) int32, error) {
	args := argv[1:]
	switch path.Base(argv[0]) {
	case "true":
		return func(*simProc) int32 { return 0 }, nil
	case "false":
		return func(*simProc) int32 { return 1 }, nil
	case "echo":
		nl := "\n"
		if len(args) > 0 && args[0] == "-n" {
			nl, args = "", args[1:]
		}
		return func(p *simProc) int32 {
			_, _ = io.WriteString(p.outW, strings.Join(args, " ")+nl)
			return 0
		}, nil
	case "stderr":
		return func(p *simProc) int32 {
			_, _ = io.WriteString(p.errW, strings.Join(args, " ")+"\n")
			return 0
		}, nil
	case "cat":
		return func(p *simProc) int32 { return p.cat(s.FS, args) }, nil
	case "exit":
		code, err := strconv.Atoi(strings.Join(args, ""))
		if err != nil {
			return nil, badRequest("exit: want a number")
		}
		return func(*simProc) int32 { return int32(code) }, nil
	case "sleep":
		d, err := simSleep(args)
		if err != nil {
			return nil, err
		}
		return func(p *simProc) int32 {
			t := time.NewTimer(d)
			defer t.Stop()
			select {
			case <-t.C:
			case <-p.killed:
			}
			return 0
		}, nil
	case "yes":
		word := "y"
		if len(args) > 0 {
			word = strings.Join(args, " ")
		}
		line := []byte(strings.Repeat(word+"\n", 4096))
		return func(p *simProc) int32 {
			for {
				if _, err := p.outW.Write(line); err != nil {
					return 0 // killed, or its output closed
				}
			}
		}, nil
	}
	return nil, badRequest("spawn %s: %s simulates the guest and runs no commands; simulated: %s",
		argv[0], s.Name, strings.Join(SimCommands, ", "))
}

// simSleep is sleep's duration: its first argument in seconds (one too big
// for a time.Duration sleeps as long as one can).
func simSleep(args []string) (time.Duration, error) {
	if len(args) == 0 {
		return 0, badRequest("sleep: want seconds")
	}
	secs, err := strconv.ParseFloat(args[0], 64)
	if err != nil || !(secs >= 0) {
		return 0, badRequest("sleep: want seconds")
	}
	if secs >= float64(math.MaxInt64)/float64(time.Second) {
		return math.MaxInt64, nil
	}
	return time.Duration(secs * float64(time.Second)), nil
}

// SimDial is the simulated guest's port_forward dialer: SimEchoPort is an
// in-memory echo server that passes half-closes on, every other port is
// refused.
func SimDial(_ context.Context, port uint16) (net.Conn, error) {
	var serve func(*halfConn)
	switch port {
	case SimEchoPort:
		serve = func(server *halfConn) { _, _ = io.Copy(server, server) }
	case SimHTTPPort:
		serve = simHTTP
	default:
		return nil, fmt.Errorf("simulated guest: nothing listens on port %d (only the echo server on %d and HTTP on %d): %w", port, SimEchoPort, SimHTTPPort, syscall.ECONNREFUSED)
	}
	client, server := pipePair()
	go func() {
		serve(server)
		_ = server.CloseWrite()
		server.closeRead()
	}()
	return client, nil
}

// simHTTP serves one request of SimHTTPPort on conn.
func simHTTP(conn *halfConn) {
	br := bufio.NewReader(conn)
	req, err := http.ReadRequest(br)
	if err != nil {
		return
	}
	if strings.EqualFold(req.Header.Get("Upgrade"), "websocket") {
		sum := sha1.Sum([]byte(req.Header.Get("Sec-WebSocket-Key") + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"))
		_, _ = fmt.Fprintf(conn, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: %s\r\n\r\n",
			base64.StdEncoding.EncodeToString(sum[:]))
		_, _ = io.Copy(conn, br)
		return
	}
	_, _ = io.Copy(io.Discard, req.Body)
	names := make([]string, 0, len(req.Header))
	for k := range req.Header {
		names = append(names, "header: "+k)
	}
	sort.Strings(names)
	body := req.Method + " " + req.RequestURI + " " + req.Proto + "\n" + strings.Join(names, "\n") + "\n"
	_, _ = fmt.Fprintf(conn, "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", len(body), body)
}

// simProc is a simulated process: pipes for its streams, a goroutine for
// its body.
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

// startSimProc starts run as process pid; a process a signal ended exits
// -1 whatever run returns.
func startSimProc(pid uint32, run func(*simProc) int32) *simProc {
	p := &simProc{pid: pid, killed: make(chan struct{}), exited: make(chan struct{})}
	p.inR, p.inW = io.Pipe()
	p.outR, p.outW = io.Pipe()
	p.errR, p.errW = io.Pipe()
	go func() {
		code := run(p)
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
	}()
	return p
}

// cat copies the named files of fs to stdout, or stdin when none is named.
func (p *simProc) cat(fs *MemFS, files []string) int32 {
	if len(files) == 0 {
		_, _ = io.Copy(p.outW, p.inR)
		return 0
	}
	code := int32(0)
	for _, name := range files {
		f, err := fs.Open(name)
		if err != nil {
			fmt.Fprintf(p.errW, "cat: %s: No such file or directory\n", name)
			code = 1
			continue
		}
		_, _ = io.Copy(p.outW, f)
		f.Close()
	}
	return code
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

func (simAddr) Network() string { return "sim" }
func (simAddr) String() string  { return "simulated-guest" }

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
