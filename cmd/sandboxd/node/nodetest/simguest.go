package nodetest

import (
	"net"
	"sync"

	"github.com/sbxlog/sbxlog/executors/guest/silkagent"
)

// simGuests are the fake VMs' simulated guest agents: the silkd protocol of
// the project's agent (package silkagent) over silkagent's simulated guest,
// one per VM: an in-memory file tree (kept while the fake runs, so across
// hibernate and wake) that starts with /tmp and /work, exec simulating
// silkagent.SimCommands (echo, stderr, cat, true, false, exit N, sleep N,
// yes [word]) and answering bad_request for anything else, ps, logs and
// attach of them, sessions of silkagent's simulated shell, and
// port_forward to the echo server on silkagent.SimEchoPort. NOTHING RUNS ON
// THE HOST.
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
		Procs: &silkagent.SimSpawner{Name: "nodetest", FS: fs}, FS: fs, Dial: silkagent.SimDial,
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
