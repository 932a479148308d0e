package silkagent

import (
	"testing"
	"time"

	"github.com/sbxlog/sbxlog/executors/guest/silkagent/proctest"
	"github.com/sbxlog/sbxlog/executors/guest/silkd"
)

// procDial is serve's dialer as the project's client.
func procDial(t *testing.T, s *Server) func(t *testing.T) *silkd.Conn {
	dial := serve(t, s)
	return func(*testing.T) *silkd.Conn { return silkd.NewConn(dial()) }
}

// The suite on the engine with the host's own processes and shells.
func TestProcOpsOS(t *testing.T) {
	s := &Server{Procs: OSProcs{}, FS: OSFS{}}
	proctest.Run(t, proctest.Agent{Dial: procDial(t, s)})
}

// The suite on the simulated guest.
func TestProcOpsSim(t *testing.T) {
	fs := NewMemFS(nil)
	for _, d := range []string{"/tmp", "/root"} {
		if err := fs.Mkdir(d, true); err != nil {
			t.Fatal(err)
		}
	}
	s := &Server{Simulated: true, FS: fs, Procs: &SimSpawner{Name: "test", FS: fs}}
	proctest.Run(t, proctest.Agent{Dial: procDial(t, s), Simulated: true, Timeout: 10 * time.Second})
}
