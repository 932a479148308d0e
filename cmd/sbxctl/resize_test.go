package main

import (
	"bytes"
	"context"
	"net"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/creack/pty"

	"github.com/sbxlog/sbxlog/executors/guest/silkagent"
	"github.com/sbxlog/sbxlog/executors/guest/silkd"
)

// resizeRecorder is the real agent's processes with every terminal resize
// the agent applies also sent on sizes, so the test knows when a resize
// reached the guest's terminal.
type resizeRecorder struct {
	silkagent.OSProcs
	sizes chan [2]uint16
}

func (r resizeRecorder) SpawnPty(req *silkd.PtyOpen) (silkagent.Pty, error) {
	p, err := r.OSProcs.SpawnPty(req)
	if err != nil {
		return nil, err
	}
	return recordedPty{Pty: p, sizes: r.sizes}, nil
}

type recordedPty struct {
	silkagent.Pty
	sizes chan<- [2]uint16
}

func (p recordedPty) Resize(cols, rows uint16) error {
	err := p.Pty.Resize(cols, rows)
	p.sizes <- [2]uint16{cols, rows}
	return err
}

// lockedBuffer is sbxctl's stdout, read by the test while sbxctl writes.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// exec -it on a real local terminal (a pty pair: the test holds its
// master side as a terminal emulator would): the guest's terminal starts
// at the local size, and after the local terminal is resized and
// sbxctl gets SIGWINCH, the command in the guest sees the new size (issue
// 25: exec -it with resize). The real agent's engine on the host's
// processes stands in for the guest, as in TestExecTerminal.
func TestExecTerminalFollowsResize(t *testing.T) {
	n := startNode(t, 1)
	sizes := make(chan [2]uint16, 4)
	agent := &silkagent.Server{Procs: resizeRecorder{sizes: sizes}}
	n.Driver.SetAgent(func(conn net.Conn, _ string) {
		defer conn.Close()
		agent.ServeConn(conn)
	})
	cl := claimOne(t)

	master, tty, err := pty.Open()
	if err != nil {
		t.Skipf("no pty: %v", err)
	}
	t.Cleanup(func() { master.Close(); tty.Close() })
	if err := pty.Setsize(tty, &pty.Winsize{Cols: 100, Rows: 30}); err != nil {
		t.Fatal(err)
	}
	setStdin(t, tty)

	var out, errs lockedBuffer
	done := make(chan int, 1)
	go func() {
		done <- dispatch([]string{"exec", "-it", "--sandbox-token", cl.Token, cl.ID, "--", "sh", "-c", "stty size; read x; stty size; exit 3"}, &out, &errs)
	}()
	// await polls until cond holds, or fails the test naming what.
	await := func(what string, cond func() bool) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for !cond() {
			select {
			case code := <-done:
				t.Fatalf("%s: sbxctl ended first: exit %d, stdout %q, stderr %q", what, code, out.String(), errs.String())
			case <-ctx.Done():
				t.Fatalf("%s: not within 30s; stdout %q, stderr %q", what, out.String(), errs.String())
			case <-tick.C:
			}
		}
	}
	await("the local size at the start", func() bool { return strings.Contains(out.String(), "30 100\r\n") })

	// The local terminal grows; its owner gets SIGWINCH (sbxctl is not
	// the pty's foreground process here, so the test sends it).
	if err := pty.Setsize(tty, &pty.Winsize{Cols: 120, Rows: 40}); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(syscall.Getpid(), syscall.SIGWINCH); err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-sizes:
		if got != [2]uint16{120, 40} {
			t.Fatalf("the guest's terminal was resized to %dx%d, want 120x40", got[0], got[1])
		}
	case code := <-done:
		t.Fatalf("sbxctl ended before the resize: exit %d, stderr %q", code, errs.String())
	case <-time.After(30 * time.Second):
		t.Fatalf("no resize reached the guest within 30s; stderr %q", errs.String())
	}
	// The command reads a line, then reports the size it now has.
	if _, err := master.Write([]byte("\n")); err != nil {
		t.Fatal(err)
	}
	select {
	case code := <-done:
		if code != 3 || !strings.Contains(out.String(), "40 120\r\n") {
			t.Fatalf("exit %d, stdout %q, stderr %q; want 3 and the new size 40 120", code, out.String(), errs.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("sbxctl did not end within 30s; stdout %q", out.String())
	}
}
