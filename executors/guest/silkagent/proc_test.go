package silkagent

import (
	"bytes"
	"errors"
	"fmt"
	"os/exec"
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

// A session's command whose client goes away is killed, and the session
// serves the next; one the shell cannot be brought back from (a builtin
// loop) costs the session, after InterruptGrace; session_rm ends a running
// command with an error.
func TestSessionInterrupts(t *testing.T) {
	dial := procDial(t, osServer())
	c := dial(t)
	ctx := testCtx(t)
	id, err := c.CreateSession(ctx, silkd.SessionCreate{})
	if err != nil {
		t.Fatal(err)
	}
	run := func(c *silkd.Conn, argv ...string) (string, error) {
		var out bytes.Buffer
		res, err := c.Exec(ctx, silkd.Exec{Argv: argv, Session: id}, silkd.ExecIO{Stdout: &out})
		if err == nil && res.Code != 0 {
			err = fmt.Errorf("exit %d", res.Code)
		}
		return out.String(), err
	}
	// gone runs shell text in the session and goes away once it has
	// printed its first line.
	gone := func(text string) {
		t.Helper()
		nc := dial(t)
		if err := nc.W.WriteRequest(silkd.Exec{Argv: []string{"eval", "echo go; " + text}, Session: id}); err != nil {
			t.Fatal(err)
		}
		if r, err := nc.R.ReadResponse(); err != nil || r.Type() != silkd.TypeStdout {
			t.Fatalf("the abandoned command's first frame: %v, %v", r, err)
		}
		nc.Close()
	}

	gone("sleep 300")
	start := time.Now()
	if out, err := run(c, "echo", "next"); err != nil || out != "next\n" {
		t.Fatalf("the command after an abandoned sleep: %q, %v", out, err)
	}
	if d := time.Since(start); d > InterruptGrace {
		t.Fatalf("the abandoned sleep held the session %v", d)
	}

	gone("while :; do :; done")
	if _, err := run(c, "true"); !errors.Is(err, silkd.ErrInternal) && !errors.Is(err, silkd.ErrNotFound) {
		t.Fatalf("after a loop the shell could not be brought back from: %v, want the session ended", err)
	}
	if _, err := run(c, "true"); !errors.Is(err, silkd.ErrNotFound) {
		t.Fatalf("the session after its shell was closed: %v, want not_found", err)
	}

	id, err = c.CreateSession(ctx, silkd.SessionCreate{})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { _, err := run(dial(t), "sleep", "300"); done <- err }()
	waitUntil(t, "the sleep to hold the session", func() bool {
		ps, _ := exec.Command("pgrep", "-f", "^sleep 300$").Output()
		return len(ps) > 0
	})
	if err := c.RemoveSession(ctx, id); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, silkd.ErrInternal) {
			t.Fatalf("a command of a removed session: %v, want internal", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("session_rm did not end the running command")
	}
}
