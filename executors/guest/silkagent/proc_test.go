package silkagent

import (
	"bytes"
	"errors"
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

// The table remembers at most MaxExited exited processes of each kind: a
// run of short execs pushes out the oldest of them, not a detached one.
func TestExitedBound(t *testing.T) {
	fs := NewMemFS(nil)
	dial := procDial(t, &Server{Simulated: true, FS: fs, Procs: &SimSpawner{Name: "test", FS: fs}})
	c := dial(t)
	ctx := testCtx(t)
	det, err := c.Exec(ctx, silkd.Exec{Argv: []string{"echo", "kept"}, Detach: true}, silkd.ExecIO{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Attach(ctx, det.Pid, nil, nil); err != nil { // to its exit
		t.Fatal(err)
	}
	var first uint32
	for i := range MaxExited + 1 {
		res, err := c.Exec(ctx, silkd.Exec{Argv: []string{"true"}}, silkd.ExecIO{})
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			first = res.Pid
		}
	}
	var out bytes.Buffer
	if got, err := c.Logs(ctx, det.Pid, &out, nil); err != nil || !got.Exited || out.String() != "kept\n" {
		t.Fatalf("logs of the detached process after %d execs: %+v, %v, %q", MaxExited+1, got, err, out.String())
	}
	if _, err := c.Logs(ctx, first, nil, nil); !errors.Is(err, silkd.ErrNotFound) {
		t.Fatalf("logs of the oldest of %d exited execs = %v, want not_found", MaxExited+1, err)
	}
	ps, err := c.Ps(ctx)
	if err != nil || len(ps) != MaxExited+1 {
		t.Fatalf("ps lists %d processes (%v), want %d", len(ps), err, MaxExited+1)
	}
}
