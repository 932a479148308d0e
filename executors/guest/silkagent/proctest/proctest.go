// Package proctest is the acceptance suite of the agent's process ops
// (issue 23): sessions, terminals and the process table (ps, logs, attach
// of a detached process), spoken through the project's client
// (silkd.Conn). One suite runs against every agent: the engine in-process
// on the host's processes, the real agent in the QEMU guest, and the
// simulated guest of chsim, which serves what is process-table and shell
// logic and says "simulated" where it has no terminals.
package proctest

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sbxlog/sbxlog/executors/guest/silkd"
)

// Agent is the agent under test.
type Agent struct {
	// Dial opens a new connection to it.
	Dial func(t *testing.T) *silkd.Conn
	// Simulated: the simulated guest (no sh, seq or terminals).
	Simulated bool
	// Hibernate, if set, hibernates and wakes the guest (the agent's memory
	// kept): sessions must come through it.
	Hibernate func(t *testing.T)
	// Timeout bounds each step (default 30 s; a guest under TCG is slow).
	Timeout time.Duration
}

func (a Agent) ctx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), cmp.Or(a.Timeout, 30*time.Second))
	t.Cleanup(cancel)
	return ctx
}

// Run runs the whole suite.
func Run(t *testing.T, a Agent) {
	t.Run("session", func(t *testing.T) { Session(t, a) })
	t.Run("detached", func(t *testing.T) { Detached(t, a) })
	t.Run("pty", func(t *testing.T) { Terminal(t, a) })
	t.Run("refusals", func(t *testing.T) { Refusals(t, a) })
}

// sessionOut runs argv in session id and returns its output and code.
func sessionOut(t *testing.T, a Agent, c *silkd.Conn, id string, argv ...string) (string, int32) {
	t.Helper()
	var out bytes.Buffer
	res, err := c.Exec(a.ctx(t), silkd.Exec{Argv: argv, Session: id}, silkd.ExecIO{Stdout: &out, Stderr: &out})
	if err != nil {
		t.Fatalf("exec %q in session %s: %v", argv, id, err)
	}
	return out.String(), res.Code
}

// Session is acceptance 1: cd and export in one call, seen by a second
// call, on a second connection, and after a hibernate and wake.
func Session(t *testing.T, a Agent) {
	c := a.Dial(t)
	id, err := c.CreateSession(a.ctx(t), silkd.SessionCreate{Env: map[string]string{"GREETING": "hello"}})
	if err != nil || !strings.HasPrefix(id, "sess-") {
		t.Fatalf("session_create = %q, %v", id, err)
	}
	if out, code := sessionOut(t, a, c, id, "eval", "cd /tmp && export X=1"); code != 0 || out != "" {
		t.Fatalf("cd and export: %q, exit %d", out, code)
	}
	check := func(c *silkd.Conn, when string) {
		t.Helper()
		if out, code := sessionOut(t, a, c, id, "eval", "pwd; echo $X $GREETING"); code != 0 || out != "/tmp\n1 hello\n" {
			t.Fatalf("%s: pwd; echo $X = %q, exit %d; want /tmp and 1", when, out, code)
		}
	}
	check(c, "a second call")
	check(a.Dial(t), "a second connection")
	// Arguments are words, not shell text; the exit code comes through;
	// stderr is merged.
	if out, code := sessionOut(t, a, c, id, "echo", "a;b", "$X"); code != 0 || out != "a;b $X\n" {
		t.Fatalf("echo 'a;b' '$X' = %q, exit %d", out, code)
	}
	if _, code := sessionOut(t, a, c, id, "false"); code != 1 {
		t.Fatalf("false exits %d", code)
	}
	if !a.Simulated {
		if out, code := sessionOut(t, a, c, id, "sh", "-c", "echo oops >&2; exit 3"); code != 3 || out != "oops\n" {
			t.Fatalf("stderr and exit 3: %q, exit %d", out, code)
		}
		// A forged marker in the output does not end the command early.
		if out, code := sessionOut(t, a, c, id, "printf", "__SBX_0000__ 0\\nafter\\n"); code != 0 || out != "__SBX_0000__ 0\nafter\n" {
			t.Fatalf("forged marker: %q, exit %d", out, code)
		}
	}
	ids, err := c.Sessions(a.ctx(t))
	if err != nil || !slices.Contains(ids, id) {
		t.Fatalf("session_list = %q, %v; want %s in it", ids, err, id)
	}
	if a.Hibernate != nil {
		a.Hibernate(t)
		check(a.Dial(t), "after a hibernate and wake")
		c = a.Dial(t)
	}
	if err := c.RemoveSession(a.ctx(t), id); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Exec(a.ctx(t), silkd.Exec{Argv: []string{"true"}, Session: id}, silkd.ExecIO{}); !errors.Is(err, silkd.ErrNotFound) {
		t.Fatalf("exec in a removed session = %v, want not_found", err)
	}
	if ids, err := c.Sessions(a.ctx(t)); err != nil || slices.Contains(ids, id) {
		t.Fatalf("session_list after session_rm = %q, %v", ids, err)
	}
}

// findProc returns pid's ps line.
func findProc(t *testing.T, a Agent, c *silkd.Conn, pid uint32) silkd.Proc {
	t.Helper()
	ps, err := c.Ps(a.ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range ps {
		if p.Pid == pid {
			return p
		}
	}
	t.Fatalf("ps %+v has no pid %d", ps, pid)
	return silkd.Proc{}
}

// Detached is acceptance 4: ps, logs and attach of a detached process
// that counts to 5 (the simulated guest: one that sleeps, killed while
// attached, and one that echoes).
func Detached(t *testing.T, a Agent) {
	c := a.Dial(t)
	if a.Simulated {
		detachedSim(t, a, c)
		return
	}
	argv := []string{"sh", "-c", "for i in $(seq 5); do echo $i; sleep 1; done; echo bye >&2"}
	res, err := c.Exec(a.ctx(t), silkd.Exec{Argv: argv, Detach: true}, silkd.ExecIO{})
	if err != nil {
		t.Fatal(err)
	}
	p := findProc(t, a, c, res.Pid)
	if p.State != "running" || !p.Detached || !slices.Equal(p.Argv, argv) || p.ExitCode != nil || p.StartedAtEpochSecs == 0 {
		t.Fatalf("ps of the running process: %+v", p)
	}
	// Attach from another connection: what it printed so far, then the rest.
	var out, errb bytes.Buffer
	got, err := a.Dial(t).Attach(a.ctx(t), res.Pid, &out, &errb)
	if err != nil || !got.Exited || got.Code != 0 || out.String() != "1\n2\n3\n4\n5\n" || errb.String() != "bye\n" {
		t.Fatalf("attach = %+v, %v, stdout %q, stderr %q", got, err, out.String(), errb.String())
	}
	out.Reset()
	errb.Reset()
	got, err = c.Logs(a.ctx(t), res.Pid, &out, &errb)
	if err != nil || !got.Exited || got.Code != 0 || out.String() != "1\n2\n3\n4\n5\n" || errb.String() != "bye\n" {
		t.Fatalf("logs = %+v, %v, stdout %q, stderr %q", got, err, out.String(), errb.String())
	}
	if p := findProc(t, a, c, res.Pid); p.State != "exited" || p.ExitCode == nil || *p.ExitCode != 0 {
		t.Fatalf("ps of the exited process: %+v", p)
	}
	// Attach after the exit replays and ends at once; the connection
	// serves on.
	out.Reset()
	if got, err := c.Attach(a.ctx(t), res.Pid, &out, nil); err != nil || got.Code != 0 || out.String() != "1\n2\n3\n4\n5\n" {
		t.Fatalf("attach after exit = %+v, %v, %q", got, err, out.String())
	}
	if _, err := c.Info(a.ctx(t)); err != nil {
		t.Fatal(err)
	}

	// logs of a running process: what it printed so far, no exit.
	res, err = c.Exec(a.ctx(t), silkd.Exec{Argv: []string{"sh", "-c", "echo started; exec sleep 60"}, Detach: true}, silkd.ExecIO{})
	if err != nil {
		t.Fatal(err)
	}
	awaitLogs(t, a, c, res.Pid, "started\n")
	killWhileAttached(t, a, c, res.Pid)
}

// awaitLogs waits until pid's logs are want (the process still running).
func awaitLogs(t *testing.T, a Agent, c *silkd.Conn, pid uint32, want string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		var out bytes.Buffer
		got, err := c.Logs(a.ctx(t), pid, &out, nil)
		if err != nil {
			t.Fatal(err)
		}
		if got.Exited {
			t.Fatalf("logs: the process exited (%d) with %q", got.Code, out.String())
		}
		if out.String() == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("logs = %q, want %q", out.String(), want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// killWhileAttached kills pid from c while another connection is attached:
// the attach ends with exit -1.
func killWhileAttached(t *testing.T, a Agent, c *silkd.Conn, pid uint32) {
	t.Helper()
	type result struct {
		out silkd.ProcOutput
		err error
	}
	done := make(chan result, 1)
	ac := a.Dial(t)
	go func() {
		out, err := ac.Attach(a.ctx(t), pid, io.Discard, io.Discard)
		done <- result{out, err}
	}()
	if err := c.Kill(a.ctx(t), pid, nil); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-done:
		if r.err != nil || !r.out.Exited || r.out.Code != -1 {
			t.Fatalf("attach of a killed process = %+v, %v; want exit -1", r.out, r.err)
		}
	case <-a.ctx(t).Done():
		t.Fatal("attach did not end when its process was killed")
	}
}

func detachedSim(t *testing.T, a Agent, c *silkd.Conn) {
	res, err := c.Exec(a.ctx(t), silkd.Exec{Argv: []string{"echo", "one"}, Detach: true}, silkd.ExecIO{})
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	got, err := a.Dial(t).Attach(a.ctx(t), res.Pid, &out, nil)
	if err != nil || !got.Exited || got.Code != 0 || out.String() != "one\n" {
		t.Fatalf("attach = %+v, %v, %q", got, err, out.String())
	}
	out.Reset()
	if got, err := c.Logs(a.ctx(t), res.Pid, &out, nil); err != nil || !got.Exited || out.String() != "one\n" {
		t.Fatalf("logs = %+v, %v, %q", got, err, out.String())
	}
	if p := findProc(t, a, c, res.Pid); p.State != "exited" || !p.Detached || p.ExitCode == nil || *p.ExitCode != 0 {
		t.Fatalf("ps: %+v", p)
	}
	res, err = c.Exec(a.ctx(t), silkd.Exec{Argv: []string{"sleep", "600"}, Detach: true}, silkd.ExecIO{})
	if err != nil {
		t.Fatal(err)
	}
	if p := findProc(t, a, c, res.Pid); p.State != "running" {
		t.Fatalf("ps: %+v", p)
	}
	killWhileAttached(t, a, c, res.Pid)
}

// Terminal is acceptance 2: a shell on a terminal, whose stty size is what
// pty_resize set, and where Ctrl-C interrupts a sleep. The shell is bash
// where the guest has it, else sh.
func Terminal(t *testing.T, a Agent) {
	c := a.Dial(t)
	p, err := c.OpenPty(a.ctx(t), silkd.PtyOpen{Cols: 80, Rows: 24, Env: map[string]string{"PS1": "$ "}})
	if a.Simulated {
		if !errors.Is(err, silkd.ErrUnimplemented) || !strings.Contains(err.Error(), "simulates") {
			t.Fatalf("pty_open on the simulated guest = %v, want unimplemented saying it simulates", err)
		}
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if pr := findProc(t, a, a.Dial(t), p.Pid); pr.State != "running" || len(pr.Argv) == 0 {
		t.Fatalf("ps of the terminal's shell: %+v", pr)
	}
	screen := newScreen(p)
	if err := a.Dial(t).ResizePty(a.ctx(t), p.Pid, 123, 45); err != nil {
		t.Fatal(err)
	}
	// The marker is typed split by quotes, so the terminal's echo of the
	// line does not match it: only the command's output does.
	type_ := func(s string) {
		t.Helper()
		if _, err := p.Write([]byte(s)); err != nil {
			t.Fatal(err)
		}
	}
	type_("stty size; echo m''1\n")
	if got := screen.await(t, a, "m1\r\n"); !strings.Contains(got, "45 123\r\n") {
		t.Fatalf("stty size after pty_resize 123x45: %q", got)
	}
	// The sleep says when it runs (as the foreground job: the shell made
	// it so before it started); then Ctrl-C, and the status.
	type_("sh -c 'echo s''1; exec sleep 300'\n")
	screen.await(t, a, "s1\r\n")
	type_("\x03")
	type_("echo r''c=$?\n")
	screen.await(t, a, "rc=")
	if rest := screen.await(t, a, "\r\n"); rest != "130\r\n" {
		t.Fatalf("after Ctrl-C: rc=%q, want 130", rest)
	}
	// A job left in the background keeps the terminal open: the exit
	// still comes, PostExitDrain after the shell's.
	type_("sleep 30 &\n")
	type_("exit 7\n")
	start := time.Now()
	if err := screen.eof(t, a); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 20*time.Second {
		t.Fatalf("the terminal ended %v after its shell's exit, with a job in the background", d)
	}
	if p.ExitCode() != 7 {
		t.Fatalf("the shell exited %d, want 7", p.ExitCode())
	}

	// Closing the terminal's connection hangs up: the shell is killed.
	p2, err := a.Dial(t).OpenPty(a.ctx(t), silkd.PtyOpen{Cols: 80, Rows: 24})
	if err != nil {
		t.Fatal(err)
	}
	p2.Close()
	deadline := time.Now().Add(20 * time.Second)
	for c := a.Dial(t); findProc(t, a, c, p2.Pid).State != "exited"; {
		if time.Now().After(deadline) {
			t.Fatal("the shell of a closed terminal still runs")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// screen reads a terminal's output in the background.
type screen struct {
	ch  chan []byte
	err chan error
	buf []byte
}

func newScreen(r io.Reader) *screen {
	s := &screen{ch: make(chan []byte, 64), err: make(chan error, 1)}
	go func() {
		for {
			b := make([]byte, 4096)
			n, err := r.Read(b)
			if n > 0 {
				s.ch <- b[:n]
			}
			if err != nil {
				s.err <- err
				close(s.ch)
				return
			}
		}
	}()
	return s
}

// await reads until want and returns what came up to and including it.
func (s *screen) await(t *testing.T, a Agent, want string) string {
	t.Helper()
	got, ok := s.awaitFor(t, want, cmp.Or(a.Timeout, 30*time.Second))
	if !ok {
		t.Fatalf("no %q on the terminal; it showed %q", want, s.buf)
	}
	return got
}

// awaitFor is await for at most d: false if want did not come.
func (s *screen) awaitFor(t *testing.T, want string, d time.Duration) (string, bool) {
	t.Helper()
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		if i := bytes.Index(s.buf, []byte(want)); i >= 0 {
			got := string(s.buf[:i+len(want)])
			s.buf = s.buf[i+len(want):]
			return got, true
		}
		select {
		case b, ok := <-s.ch:
			if !ok {
				t.Fatalf("the terminal ended (%v) before %q; it showed %q", <-s.err, want, s.buf)
			}
			s.buf = append(s.buf, b...)
		case <-timer.C:
			return "", false
		}
	}
}

// eof waits for the end of the output: nil at a clean end.
func (s *screen) eof(t *testing.T, a Agent) error {
	ctx := a.ctx(t)
	for {
		select {
		case b, ok := <-s.ch:
			s.buf = append(s.buf, b...)
			if !ok {
				if err := <-s.err; !errors.Is(err, io.EOF) {
					return err
				}
				return nil
			}
		case <-ctx.Done():
			return fmt.Errorf("the terminal did not end (%w); it showed %q", ctx.Err(), s.buf)
		}
	}
}

// Refusals: each failure has its error kind, and the connection serves on.
func Refusals(t *testing.T, a Agent) {
	c := a.Dial(t)
	ctx := a.ctx(t)
	const nobody = 0x7ffffff0
	res, err := c.Exec(ctx, silkd.Exec{Argv: []string{"true"}}, silkd.ExecIO{})
	if err != nil {
		t.Fatal(err)
	}
	id, err := c.CreateSession(ctx, silkd.SessionCreate{ID: "proctest-dup"})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = a.Dial(t).RemoveSession(a.ctx(t), id) }()
	for _, tc := range []struct {
		name string
		call func() error
		want error
	}{
		{"logs of an unknown pid", func() error { _, err := c.Logs(ctx, nobody, nil, nil); return err }, silkd.ErrNotFound},
		{"attach of an unknown pid", func() error { _, err := c.Attach(ctx, nobody, nil, nil); return err }, silkd.ErrNotFound},
		{"pty_resize of an unknown pid", func() error { return c.ResizePty(ctx, nobody, 80, 24) }, silkd.ErrNotFound},
		{"session_rm of an unknown session", func() error { return c.RemoveSession(ctx, "proctest-none") }, silkd.ErrNotFound},
		{"exec in an unknown session", func() error {
			_, err := c.Exec(ctx, silkd.Exec{Argv: []string{"true"}, Session: "proctest-none"}, silkd.ExecIO{})
			return err
		}, silkd.ErrNotFound},
		{"a session id taken", func() error {
			_, err := c.CreateSession(ctx, silkd.SessionCreate{ID: id})
			return err
		}, silkd.ErrBadRequest},
		{"a session id with a space", func() error {
			_, err := c.CreateSession(ctx, silkd.SessionCreate{ID: "a b"})
			return err
		}, silkd.ErrBadRequest},
		{"a session in a missing directory", func() error {
			_, err := c.CreateSession(ctx, silkd.SessionCreate{Cwd: "/proctest/none"})
			return err
		}, silkd.ErrBadRequest},
		{"detach with session", func() error {
			_, err := c.Exec(ctx, silkd.Exec{Argv: []string{"true"}, Session: id, Detach: true}, silkd.ExecIO{})
			return err
		}, silkd.ErrBadRequest},
		{"an empty argv in a session", func() error {
			_, err := c.Exec(ctx, silkd.Exec{Argv: []string{}, Session: id}, silkd.ExecIO{})
			return err
		}, silkd.ErrBadRequest},
	} {
		if err := tc.call(); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
	if !a.Simulated {
		if err := c.ResizePty(ctx, res.Pid, 80, 24); !errors.Is(err, silkd.ErrBadRequest) {
			t.Errorf("pty_resize of a plain exec: %v, want bad_request", err)
		}
	}
	if _, err := c.Info(ctx); err != nil {
		t.Fatal(err)
	}
}
