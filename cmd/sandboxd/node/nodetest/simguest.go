package nodetest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/sbxlog/sbxlog/executors/guest/silkagent"
	"github.com/sbxlog/sbxlog/executors/guest/silkd"
)

// EchoPort is the simulated guest's one TCP port: port_forward to it
// reaches an echo server (half-close passed on); any other port refuses.
const EchoPort = 7

// simGuests are the fake VMs' simulated guest agents: the silkd protocol of
// the project's agent (package silkagent) over an in-memory file tree per
// VM (kept while the fake runs, so across hibernate and wake), a few
// simulated commands and the echo port. NOTHING RUNS ON THE HOST: exec
// knows echo, stderr (its arguments to stderr), cat (stdin to stdout),
// true, false, exit N, sleep N and yes [word] (endless output), and
// answers bad_request for anything else. Its tree starts with /tmp and
// /work.
type simGuests struct {
	mu  sync.Mutex
	fss map[string]*silkagent.MemFS // run dir -> its guest's files
	srv map[string]*silkagent.Server
}

// simDirs are the directories a simulated guest starts with.
var simDirs = []string{"/tmp", "/work"}

// SimAgent is the default Agent: the simulated guest of the VM at runDir.
func (g *simGuests) SimAgent(conn net.Conn, runDir string) {
	defer conn.Close()
	g.server(runDir).ServeConn(conn)
}

func (g *simGuests) server(runDir string) *silkagent.Server {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.srv == nil {
		g.fss, g.srv = map[string]*silkagent.MemFS{}, map[string]*silkagent.Server{}
	}
	if s := g.srv[runDir]; s != nil {
		return s
	}
	fs := silkagent.NewMemFS(nil)
	for _, d := range simDirs {
		_ = fs.Mkdir(d, true)
	}
	s := &silkagent.Server{
		Version: "nodetest", Agent: "nodetest simulated guest", Simulated: true,
		Procs: &simProcs{}, FS: fs, Dial: dialEcho,
	}
	g.fss[runDir], g.srv[runDir] = fs, s
	return s
}

// GuestFS returns the simulated file tree of the guest at runDir, nil if
// no agent of it was served yet.
func (g *simGuests) GuestFS(runDir string) *silkagent.MemFS {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.fss[runDir]
}

// dialEcho connects port_forward to the simulated guest's ports.
func dialEcho(_ context.Context, port uint16) (net.Conn, error) {
	if port != EchoPort {
		return nil, fmt.Errorf("connect 127.0.0.1:%d: %w", port, syscall.ECONNREFUSED)
	}
	host, guest, err := socketPair()
	if err != nil {
		return nil, err
	}
	go EchoAgent(guest, "")
	return host, nil
}

// simProcs spawns the simulated commands.
type simProcs struct{ pids atomic.Uint32 }

// Spawn implements silkagent.Spawner.
func (p *simProcs) Spawn(req *silkd.Exec) (silkagent.Process, error) {
	run, err := simCommand(req.Argv)
	if err != nil {
		return nil, err
	}
	return startSim(p.pids.Add(1)+100, run), nil
}

// simCommand returns what argv does, or a bad_request for a command the
// simulated guest does not know.
func simCommand(argv []string) (func(*simProc) int32, error) {
	args := argv[1:]
	switch argv[0] {
	case "true":
		return func(*simProc) int32 { return 0 }, nil
	case "false":
		return func(*simProc) int32 { return 1 }, nil
	case "echo":
		return func(p *simProc) int32 { return p.print(p.outW, strings.Join(args, " ")+"\n") }, nil
	case "stderr":
		return func(p *simProc) int32 { return p.print(p.errW, strings.Join(args, " ")+"\n") }, nil
	case "cat":
		return func(p *simProc) int32 {
			if _, err := io.Copy(p.outW, p.stdinR); err != nil && p.isKilled() {
				return -1
			}
			return 0
		}, nil
	case "exit":
		code, err := strconv.Atoi(strings.Join(args, ""))
		if err != nil {
			return nil, silkd.Errorf(silkd.KindBadRequest, "exit: want a number")
		}
		return func(*simProc) int32 { return int32(code) }, nil
	case "sleep":
		secs, err := strconv.ParseFloat(strings.Join(args, ""), 64)
		if err != nil {
			return nil, silkd.Errorf(silkd.KindBadRequest, "sleep: want seconds")
		}
		return func(p *simProc) int32 {
			select {
			case <-time.After(time.Duration(secs * float64(time.Second))):
				return 0
			case <-p.killed:
				return -1
			}
		}, nil
	case "yes":
		word := "y"
		if len(args) > 0 {
			word = strings.Join(args, " ")
		}
		return func(p *simProc) int32 {
			line := []byte(strings.Repeat(word+"\n", 4096))
			for {
				if _, err := p.outW.Write(line); err != nil {
					return -1
				}
			}
		}, nil
	}
	return nil, silkd.Errorf(silkd.KindBadRequest, "spawn %s: the nodetest guest is simulated and runs no commands (echo, stderr, cat, true, false, exit, sleep, yes)", argv[0])
}

// simProc is a simulated process: pipes for its streams, a goroutine for
// its body.
type simProc struct {
	pid          uint32
	stdinR       *io.PipeReader
	stdinW       *io.PipeWriter
	outR, errR   *io.PipeReader
	outW, errW   *io.PipeWriter
	done, killed chan struct{}
	killOnce     sync.Once
	code         int32
}

var errKilled = errors.New("killed")

func startSim(pid uint32, run func(*simProc) int32) *simProc {
	p := &simProc{pid: pid, done: make(chan struct{}), killed: make(chan struct{})}
	p.stdinR, p.stdinW = io.Pipe()
	p.outR, p.outW = io.Pipe()
	p.errR, p.errW = io.Pipe()
	go func() {
		code := run(p)
		if p.isKilled() {
			code = -1
		}
		p.code = code
		p.outW.Close()
		p.errW.Close()
		close(p.done)
	}()
	return p
}

func (p *simProc) print(w *io.PipeWriter, s string) int32 {
	if _, err := io.WriteString(w, s); err != nil {
		return -1
	}
	return 0
}

func (p *simProc) isKilled() bool {
	select {
	case <-p.killed:
		return true
	default:
		return false
	}
}

func (p *simProc) Pid() uint32           { return p.pid }
func (p *simProc) Stdin() io.WriteCloser { return p.stdinW }
func (p *simProc) Stdout() io.Reader     { return p.outR }
func (p *simProc) Stderr() io.Reader     { return p.errR }

func (p *simProc) CloseOutput() {
	p.outR.Close()
	p.errR.Close()
}

func (p *simProc) Wait() int32 {
	<-p.done
	return p.code
}

// Signal ends the process (any signal is fatal to a simulated command).
func (p *simProc) Signal(syscall.Signal) error {
	select {
	case <-p.done:
		return nil
	default:
	}
	p.killOnce.Do(func() {
		close(p.killed)
		p.stdinR.CloseWithError(errKilled)
		p.outW.CloseWithError(errKilled)
		p.errW.CloseWithError(errKilled)
	})
	return nil
}
