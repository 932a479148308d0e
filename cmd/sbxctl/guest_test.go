package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sbxlog/sbxlog/executors/guest/silkagent"
	"github.com/sbxlog/sbxlog/executors/guest/silkd"
	"github.com/sbxlog/sbxlog/projections/api"
)

// claimOne claims a sandbox of the default pool as root.
func claimOne(t *testing.T) api.ClaimResponse {
	t.Helper()
	var cl api.ClaimResponse
	mustJSON(t, &cl, "claim", "--template", "default")
	return cl
}

// setStdin makes the commands read s as their standard input.
func setStdin(t *testing.T, s io.Reader) {
	stdin = s
	t.Cleanup(func() { stdin = os.Stdin })
}

func TestExecCommand(t *testing.T) {
	startNode(t, 1)
	cl := claimOne(t)
	for _, tc := range []struct {
		name     string
		args     []string
		in       string
		code     int
		out, err string
	}{
		{"stdout", []string{"exec", cl.ID, "--sandbox-token", cl.Token, "--", "echo", "-n", "42"}, "", 0, "42", ""},
		{"stderr and the exit code", []string{"exec", "--sandbox-token", cl.Token, cl.ID, "--", "stderr", "oops"}, "", 0, "", "oops\n"},
		{"exit code passed on", []string{"exec", cl.ID, "--sandbox-token", cl.Token, "--", "exit", "3"}, "", 3, "", ""},
		{"stdin with -i", []string{"exec", "-i", cl.ID, "--sandbox-token", cl.Token, "--", "cat"}, "from stdin", 0, "from stdin", ""},
		{"the sandbox token as --token", []string{"exec", cl.ID, "--token", cl.Token, "--", "true"}, "", 0, "", ""},
		{"root reads the sandbox's token itself", []string{"exec", cl.ID, "--", "echo", "-n", "as root"}, "", 0, "as root", ""},
		{"a tenant does not see root's sandbox", []string{"exec", cl.ID, "--token", "acme-token", "--", "true"}, "", 1, "", "404"},
		{"no command", []string{"exec", cl.ID, "--sandbox-token", cl.Token}, "", 2, "", "no command"},
		{"another token", []string{"exec", cl.ID, "--sandbox-token", "sbt_00", "--", "true"}, "", 1, "", "404"},
		{"a command the guest does not have: 127, as a shell", []string{"exec", cl.ID, "--sandbox-token", cl.Token, "--", "nope"}, "", 127, "", "sbxctl exec: nope: command not found in the sandbox\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			setStdin(t, strings.NewReader(tc.in))
			code, out, errs := sbx(tc.args...)
			if code != tc.code || out != tc.out || !strings.Contains(errs, tc.err) {
				t.Fatalf("exit %d, stdout %q, stderr %q; want %d, %q, %q", code, out, errs, tc.code, tc.out, tc.err)
			}
		})
	}
}

// Holding root, every data-plane command reaches every sandbox without its
// token, even with $SBX_SANDBOX_TOKEN exported for another one (issue 25
// item 2: that one answered 404 unknown sandbox).
func TestRootNeedsNoSandboxToken(t *testing.T) {
	startNode(t, 2)
	a, b := claimOne(t), claimOne(t)
	t.Setenv(envSandboxToken, a.Token)
	for _, id := range []string{a.ID, b.ID} {
		if out := mustRun(t, "exec", id, "--", "echo", "-n", id); out != id {
			t.Fatalf("exec on %s printed %q", id, out)
		}
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "f")
	if err := os.WriteFile(src, []byte("root copy"), 0o644); err != nil {
		t.Fatal(err)
	}
	mustRun(t, "cp", src, b.ID+":/work/f")
	if out := mustRun(t, "cp", b.ID+":/work/f", "-"); out != "root copy" {
		t.Fatalf("cp back: %q", out)
	}
	// No token of any kind: a usage error naming what is needed.
	t.Setenv(envToken, "")
	t.Setenv(envSandboxToken, "")
	if code, _, errs := sbx("exec", a.ID, "--", "true"); code != 2 || !strings.Contains(errs, "sandbox's own token is needed") {
		t.Fatalf("no token: exit %d, %q", code, errs)
	}
}

func TestCpCommand(t *testing.T) {
	startNode(t, 1)
	cl := claimOne(t)
	t.Setenv(envSandboxToken, cl.Token)
	dir := t.TempDir()
	data := make([]byte, 3<<20+17)
	rand.Read(data)
	src := filepath.Join(dir, "in.bin")
	if err := os.WriteFile(src, data, 0o640); err != nil {
		t.Fatal(err)
	}
	mustRun(t, "cp", src, cl.ID+":/work/in.bin")
	back := filepath.Join(dir, "out.bin")
	mustRun(t, "cp", cl.ID+":/work/in.bin", back)
	got, err := os.ReadFile(back)
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("round trip: %d bytes, %v", len(got), err)
	}
	if st, _ := os.Stat(back); st.Mode().Perm() != 0o640 {
		t.Fatalf("mode %v, want the source's 0640", st.Mode().Perm())
	}
	// Into a directory, and through stdin and stdout.
	mustRun(t, "cp", cl.ID+":/work/in.bin", dir)
	if got, _ := os.ReadFile(src); !bytes.Equal(got, data) {
		t.Fatal("copy into the directory replaced the wrong file")
	}
	setStdin(t, strings.NewReader("piped"))
	mustRun(t, "cp", "-", cl.ID+":/work/piped.txt")
	if out := mustRun(t, "cp", cl.ID+":/work/piped.txt", "-"); out != "piped" {
		t.Fatalf("cp to stdout: %q", out)
	}
	if code, _, errs := sbx("cp", cl.ID+":/work/missing", filepath.Join(dir, "x")); code != 1 || !strings.Contains(errs, "not_found") {
		t.Fatalf("missing file: exit %d, %q", code, errs)
	}
	if code, _, errs := sbx("cp", src, back); code != 2 || !strings.Contains(errs, "exactly one") {
		t.Fatalf("two local paths: exit %d, %q", code, errs)
	}
}

// syncWriter collects output written while the test reads it.
type syncWriter struct{ lines chan string }

func (w syncWriter) Write(p []byte) (int, error) {
	sc := bufio.NewScanner(bytes.NewReader(p))
	for sc.Scan() {
		w.lines <- sc.Text()
	}
	return len(p), nil
}

func TestPortForwardCommand(t *testing.T) {
	startNode(t, 1)
	cl := claimOne(t)
	t.Setenv(envSandboxToken, cl.Token)
	ctx, cancel := context.WithCancel(context.Background())
	baseContext = func() context.Context { return ctx }
	t.Cleanup(func() { baseContext = context.Background })
	out := syncWriter{lines: make(chan string, 16)}
	done := make(chan int, 1)
	go func() {
		done <- dispatch([]string{"port-forward", cl.ID, fmt.Sprintf("0:%d", silkagent.SimEchoPort)}, out, io.Discard)
	}()
	var addr string
	select {
	case line := <-out.lines:
		f := strings.Fields(line)
		if len(f) < 2 || f[0] != "forwarding" {
			t.Fatalf("first line %q", line)
		}
		addr = f[1]
	case code := <-done:
		t.Fatalf("port-forward exited %d", code)
	case <-time.After(10 * time.Second):
		t.Fatal("port-forward printed nothing")
	}
	for range 3 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		data := make([]byte, 256<<10)
		rand.Read(data)
		go func() { c.Write(data); c.(*net.TCPConn).CloseWrite() }()
		back, err := io.ReadAll(c)
		c.Close()
		if err != nil || !bytes.Equal(back, data) {
			t.Fatalf("through the forward: %d bytes, %v", len(back), err)
		}
	}
	cancel()
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("port-forward exited %d", code)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("port-forward did not stop")
	}
}

// The real agent's refusals (silkagent's texts) map to a shell's codes and
// a message without the wire's wording.
func TestNotStarted(t *testing.T) {
	for _, tc := range []struct {
		msg  string
		code int
	}{
		{`exec: nope: exec: "nope": executable file not found in $PATH`, 127},
		{`exec: /bin/nope: no such file or directory`, 127},
		{`exec: fork/exec /etc/passwd: permission denied`, 126},
	} {
		var errb bytes.Buffer
		err := notStarted(&silkd.Error{Kind: silkd.KindBadRequest, Message: tc.msg}, "nope", &errb)
		var ec exitCode
		if !errors.As(err, &ec) || int(ec) != tc.code || strings.Contains(errb.String(), "silkd") || strings.Contains(errb.String(), "$PATH") {
			t.Errorf("%q: %v, stderr %q; want exit %d", tc.msg, err, errb.String(), tc.code)
		}
	}
	cwd := notStarted(&silkd.Error{Kind: silkd.KindBadRequest, Message: "exec: cwd: stat /x: no such file or directory"}, "ls", io.Discard)
	if cwd == nil || strings.Contains(cwd.Error(), "silkd") || !strings.Contains(cwd.Error(), "cwd") {
		t.Errorf("cwd: %v", cwd)
	}
}
