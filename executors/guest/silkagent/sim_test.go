package silkagent

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sbxlog/sbxlog/executors/guest/silkd"
)

// simServer is the simulated guest as chsim and nodetest serve it, with
// /tmp/f holding "file\n".
func simServer(t *testing.T) (*SimSpawner, func() *silkd.Conn) {
	t.Helper()
	fs := NewMemFS([]MemFile{{Path: "/tmp", Dir: true, Mode: 0o755}, {Path: "/tmp/f", Mode: 0o644, Data: []byte("file\n")}})
	sp := &SimSpawner{Name: "the test", FS: fs}
	dial := serve(t, &Server{Agent: "test simulated guest", Simulated: true, Procs: sp, FS: fs, Dial: SimDial})
	return sp, func() *silkd.Conn { return client(t, dial) }
}

func TestSimCommands(t *testing.T) {
	_, dial := simServer(t)
	for _, tc := range []struct {
		name      string
		argv      []string
		cwd       string
		stdin     string
		code      int32
		out, errs string
		refusal   string // a bad_request containing it
	}{
		{name: "echo", argv: []string{"echo", "a", "b"}, out: "a b\n"},
		{name: "echo -n", argv: []string{"echo", "-n", "a"}, out: "a"},
		{name: "stderr", argv: []string{"stderr", "oops", "x"}, errs: "oops x\n"},
		{name: "cat of stdin", argv: []string{"cat"}, stdin: strings.Repeat("in", 40000), out: strings.Repeat("in", 40000)},
		{name: "cat of files", argv: []string{"cat", "/tmp/f", "/nope", "/tmp/f"}, code: 1, out: "file\nfile\n", errs: "cat: /nope: No such file or directory\n"},
		{name: "true", argv: []string{"true"}},
		{name: "false by its path", argv: []string{"/bin/false"}, code: 1},
		{name: "exit N", argv: []string{"exit", "42"}, code: 42},
		{name: "exit without a number", argv: []string{"exit", "x"}, refusal: "exit: want a number"},
		{name: "sleep", argv: []string{"sleep", "0.01"}},
		{name: "sleep without seconds", argv: []string{"sleep"}, refusal: "sleep: want seconds"},
		{name: "sleep a negative time", argv: []string{"sleep", "-1"}, refusal: "sleep: want seconds"},
		{name: "a cwd of the tree", argv: []string{"true"}, cwd: "/tmp"},
		{name: "a cwd not in the tree", argv: []string{"true"}, cwd: "/nope", refusal: "exec: cwd /nope: no such directory in the simulated guest"},
		{name: "a cwd that is a file", argv: []string{"true"}, cwd: "/tmp/f", refusal: "no such directory"},
		{name: "anything else", argv: []string{"sh", "-c", "id"}, refusal: "spawn sh: the test simulates the guest and runs no commands; simulated: echo, stderr, cat"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errs bytes.Buffer
			res, err := dial().Exec(testCtx(t), silkd.Exec{Argv: tc.argv, Cwd: tc.cwd}, silkd.ExecIO{Stdin: strings.NewReader(tc.stdin), Stdout: &out, Stderr: &errs})
			if tc.refusal != "" {
				if !errors.Is(err, silkd.ErrBadRequest) || !strings.Contains(err.Error(), tc.refusal) {
					t.Fatalf("exec %v = %v, want a bad_request with %q", tc.argv, err, tc.refusal)
				}
				return
			}
			if err != nil || res.Code != tc.code || res.Pid == 0 || out.String() != tc.out || errs.String() != tc.errs {
				t.Fatalf("exec %v = %+v, %v, stdout %.40q, stderr %q; want exit %d, %.40q, %q", tc.argv, res, err, out.String(), errs.String(), tc.code, tc.out, tc.errs)
			}
		})
	}
}

// yes runs until it is killed, over another connection.
func TestSimYesUntilKilled(t *testing.T) {
	_, dial := simServer(t)
	pid := make(chan uint32, 1)
	done := make(chan silkd.ExecResult, 1)
	var out bytes.Buffer
	go func() {
		r, err := dial().Exec(testCtx(t), silkd.Exec{Argv: []string{"yes", "hi"}}, silkd.ExecIO{Stdout: &out, Started: func(p uint32) { pid <- p }})
		if err != nil {
			t.Error(err)
		}
		done <- r
	}()
	p := <-pid
	time.Sleep(20 * time.Millisecond)
	if err := dial().Kill(testCtx(t), p, nil); err != nil {
		t.Fatal(err)
	}
	if r := <-done; r.Code != -1 || !strings.HasPrefix(out.String(), "hi\nhi\n") {
		t.Fatalf("killed yes = %+v, %.20q", r, out.String())
	}
}

// The simulated processes take the default dispositions: SIGKILL, SIGTERM,
// SIGINT and SIGHUP end one (exit -1), the others are ignored, and a
// signal after the exit is ESRCH.
func TestSimSignals(t *testing.T) {
	for _, tc := range []struct {
		sig  syscall.Signal
		ends bool
	}{
		{syscall.SIGKILL, true},
		{syscall.SIGTERM, true},
		{syscall.SIGINT, true},
		{syscall.SIGHUP, true},
		{syscall.SIGUSR1, false},
		{syscall.SIGCHLD, false},
		{syscall.SIGPIPE, false},
	} {
		t.Run(tc.sig.String(), func(t *testing.T) {
			for _, argv := range [][]string{{"sleep", "60"}, {"cat"}, {"yes"}} {
				p, err := (&SimSpawner{Name: "test", FS: NewMemFS(nil)}).Spawn(&silkd.Exec{Argv: argv})
				if err != nil {
					t.Fatal(err)
				}
				go func() { _, _ = io.Copy(io.Discard, p.Stdout()) }()
				exited := make(chan int32, 1)
				go func() { exited <- p.Wait() }()
				// ESRCH only if a fatal signal ended it before Signal returned.
				if err := p.Signal(tc.sig); err != nil && !(tc.ends && errors.Is(err, syscall.ESRCH)) {
					t.Fatalf("%v: Signal(%v) = %v", argv, tc.sig, err)
				}
				if !tc.ends {
					select {
					case code := <-exited:
						t.Fatalf("%v: %v ended it (exit %d), want it ignored", argv, tc.sig, code)
					case <-time.After(50 * time.Millisecond):
					}
					_ = p.Signal(syscall.SIGKILL)
				}
				select {
				case code := <-exited:
					if code != -1 {
						t.Fatalf("%v: exit %d after a fatal signal, want -1", argv, code)
					}
				case <-time.After(10 * time.Second):
					t.Fatalf("%v: still running after a fatal signal", argv)
				}
				if err := p.Signal(tc.sig); !errors.Is(err, syscall.ESRCH) {
					t.Fatalf("%v: Signal after the exit = %v, want ESRCH", argv, err)
				}
			}
		})
	}
}

// port_forward reaches the echo server on SimEchoPort, half-close passed
// on; every other port is refused (not_found).
func TestSimDial(t *testing.T) {
	_, dial := simServer(t)
	pc, err := dial().PortForward(testCtx(t), SimEchoPort)
	if err != nil {
		t.Fatal(err)
	}
	msg := randomBytes(300<<10, 7)
	go func() {
		_, _ = pc.Write(msg)
		_ = pc.CloseWrite()
	}()
	if got, err := io.ReadAll(pc); err != nil || !bytes.Equal(got, msg) {
		t.Fatalf("echo: %d of %d bytes back, %v", len(got), len(msg), err)
	}
	if _, err := dial().PortForward(testCtx(t), 8080); !errors.Is(err, silkd.ErrNotFound) || !strings.Contains(err.Error(), "nothing listens on port 8080") {
		t.Fatalf("port_forward to 8080 = %v, want not_found", err)
	}
}
