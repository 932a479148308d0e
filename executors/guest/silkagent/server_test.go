package silkagent

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sbxlog/sbxlog/executors/guest/silkd"
)

// osServer is the guest's configuration: real processes, files and ports
// of the machine the test runs on (the agent runs where it is started).
func osServer() *Server {
	return &Server{Version: "test", Agent: "sbx-agent", Procs: OSProcs{}, FS: OSFS{}, Dial: DialTCP}
}

// serve runs s on a unix socket and returns a dialer for it.
func serve(t *testing.T, s *Server) func() net.Conn {
	t.Helper()
	dir, err := os.MkdirTemp("", "silkagent")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "a.sock")
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close(); os.RemoveAll(dir) })
	go func() { _ = s.Serve(l) }()
	return func() net.Conn {
		c, err := net.Dial("unix", path)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
}

func client(t *testing.T, dial func() net.Conn) *silkd.Conn {
	return silkd.NewConn(dial())
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// raw is a connection spoken frame by frame.
type raw struct {
	t *testing.T
	c net.Conn
	r *silkd.Reader
	w *silkd.Writer
}

func newRaw(t *testing.T, dial func() net.Conn) *raw {
	c := dial()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	return &raw{t: t, c: c, r: silkd.NewReader(c), w: silkd.NewWriter(c)}
}

func (r *raw) send(reqs ...silkd.Request) {
	r.t.Helper()
	if err := r.w.WriteRequests(reqs...); err != nil {
		r.t.Fatal(err)
	}
}

// expect reads the next frame and checks its type (and value, if want is a
// full frame rather than just a type name).
func (r *raw) expect(want any) silkd.Response {
	r.t.Helper()
	got, err := r.r.ReadResponse()
	if err != nil {
		r.t.Fatalf("reading (want %v): %v", want, err)
	}
	switch w := want.(type) {
	case string:
		if got.Type() != w {
			r.t.Fatalf("got %#v, want a %s frame", got, w)
		}
	default:
		if !reflect.DeepEqual(got, w) {
			r.t.Fatalf("got %#v, want %#v", got, w)
		}
	}
	return got
}

func (r *raw) expectError(kind silkd.ErrorKind, msg string) {
	r.t.Helper()
	e, ok := r.expect(silkd.TypeError).(*silkd.Error)
	if !ok || e.Kind != kind || !strings.Contains(e.Message, msg) {
		r.t.Fatalf("error frame %#v, want %s containing %q", e, kind, msg)
	}
}

func TestInfo(t *testing.T) {
	c := client(t, serve(t, &Server{Version: "v9", Agent: "chsim simulated guest", Simulated: true}))
	info, err := c.Info(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	if info.Proto != silkd.ProtoKeepAlive || info.Version != "v9" || !info.Simulated || info.Agent != "chsim simulated guest" {
		t.Fatalf("info %+v", info)
	}
	// With no backends every other op is unimplemented, and the connection
	// carries on.
	for _, call := range []func() error{
		func() error {
			_, err := c.Exec(testCtx(t), silkd.Exec{Argv: []string{"true"}}, silkd.ExecIO{})
			return err
		},
		func() error { _, err := c.Stat(testCtx(t), "/"); return err },
		func() error { _, err := c.PortForward(testCtx(t), 80); return err },
		func() error { return c.Kill(testCtx(t), 1, nil) },
	} {
		if err := call(); !errors.Is(err, silkd.ErrUnimplemented) {
			t.Fatalf("got %v, want unimplemented", err)
		}
	}
}

// The acceptance command: stdout, stderr and the exit code.
func TestExec(t *testing.T) {
	c := client(t, serve(t, osServer()))
	var out, errb bytes.Buffer
	res, err := c.Exec(testCtx(t), silkd.Exec{Argv: []string{"sh", "-c", "echo $((6*7)); echo err >&2; exit 3"}},
		silkd.ExecIO{Stdout: &out, Stderr: &errb})
	if err != nil || res.Code != 3 || out.String() != "42\n" || errb.String() != "err\n" || res.Pid == 0 {
		t.Fatalf("exec = %+v, %v, stdout %q, stderr %q", res, err, out.String(), errb.String())
	}
}

func TestExecEnvCwdStdin(t *testing.T) {
	t.Setenv("SECRET_OF_THE_AGENT", "x")
	t.Setenv("TERM", "dumb")
	dir := t.TempDir()
	c := client(t, serve(t, osServer()))
	var out bytes.Buffer
	_, err := c.Exec(testCtx(t), silkd.Exec{Argv: []string{"sh", "-c", "pwd; env | sort"}, Cwd: dir, Env: map[string]string{"A": "1"}},
		silkd.ExecIO{Stdout: &out})
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if lines[0] != dir {
		t.Fatalf("pwd %q, want %q", lines[0], dir)
	}
	env := strings.Join(lines[1:], "\n")
	for _, want := range []string{"A=1", "PATH=" + DefaultPath, "TERM=dumb"} {
		if !strings.Contains(env, want) {
			t.Errorf("env lacks %s:\n%s", want, env)
		}
	}
	if strings.Contains(env, "SECRET_OF_THE_AGENT") || strings.Contains(env, "HOME=") {
		t.Errorf("env carries the agent's own variables:\n%s", env)
	}
	in := randomBytes(3<<20, 3)
	out.Reset()
	res, err := c.Exec(testCtx(t), silkd.Exec{Argv: []string{"cat"}}, silkd.ExecIO{Stdin: bytes.NewReader(in), Stdout: &out})
	if err != nil || res.Code != 0 || !bytes.Equal(out.Bytes(), in) {
		t.Fatalf("cat = %+v, %v, %d bytes back", res, err, out.Len())
	}
}

func TestExecRefusals(t *testing.T) {
	c := client(t, serve(t, osServer()))
	notExec := filepath.Join(t.TempDir(), "script")
	if err := os.WriteFile(notExec, []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		req  silkd.Exec
		kind *silkd.Error
		msg  string
	}{
		{silkd.Exec{}, silkd.ErrBadRequest, "argv must not be empty"},
		{silkd.Exec{Argv: []string{"no-such-binary-here"}}, silkd.ErrBadRequest, "no-such-binary-here"},
		{silkd.Exec{Argv: []string{"/no/such/binary"}}, silkd.ErrBadRequest, "no such file"},
		{silkd.Exec{Argv: []string{"true"}, Cwd: "/no/such/dir"}, silkd.ErrBadRequest, "/no/such/dir"},
		{silkd.Exec{Argv: []string{notExec}}, silkd.ErrBadRequest, "permission denied"},
		{silkd.Exec{Argv: []string{"true"}, Session: "s1"}, silkd.ErrNotFound, "no such session"},
		{silkd.Exec{Argv: []string{"true"}, Session: "s1", Detach: true}, silkd.ErrBadRequest, "detach is not supported with session"},
		{silkd.Exec{Argv: []string{"true"}, User: "no-such-user-x"}, silkd.ErrBadRequest, "no-such-user-x"},
	}
	for _, tc := range tests {
		_, err := c.Exec(testCtx(t), tc.req, silkd.ExecIO{})
		if !errors.Is(err, tc.kind) || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("exec %+v = %v, want %v containing %q", tc.req, err, tc.kind, tc.msg)
		}
	}
	// Every refusal ended its RPC cleanly: the connection still serves.
	if _, err := c.Info(testCtx(t)); err != nil {
		t.Fatal(err)
	}
}

func TestDetachAndKill(t *testing.T) {
	dial := serve(t, osServer())
	c := client(t, dial)
	res, err := c.Exec(testCtx(t), silkd.Exec{Argv: []string{"sleep", "30"}, Detach: true}, silkd.ExecIO{})
	if err != nil || res.Pid == 0 {
		t.Fatalf("detach = %+v, %v", res, err)
	}
	info, _ := c.Info(testCtx(t))
	if info.Procs != 1 {
		t.Fatalf("info.procs %d with one detached sleep", info.Procs)
	}
	if err := c.Kill(testCtx(t), res.Pid, nil); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the killed process to exit", func() bool { i, _ := c.Info(testCtx(t)); return i.Procs == 0 })
	// Killing an exited process answers done and signals nothing.
	if err := c.Kill(testCtx(t), res.Pid, nil); err != nil {
		t.Fatal(err)
	}
	if err := c.Kill(testCtx(t), 999999, nil); !errors.Is(err, silkd.ErrNotFound) {
		t.Fatalf("kill of an unknown pid = %v", err)
	}

	// A foreground exec killed from another connection exits -1.
	pid := make(chan uint32, 1)
	done := make(chan silkd.ExecResult, 1)
	go func() {
		r, err := client(t, dial).Exec(testCtx(t), silkd.Exec{Argv: []string{"sleep", "30"}}, silkd.ExecIO{Started: func(p uint32) { pid <- p }})
		if err != nil {
			t.Error(err)
		}
		done <- r
	}()
	term := int32(syscall.SIGTERM)
	if err := c.Kill(testCtx(t), <-pid, &term); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-done:
		if r.Code != -1 {
			t.Fatalf("killed exec exit %d, want -1", r.Code)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("killed exec did not exit")
	}
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// The connection rules of proto 2, frame by frame.
func TestConnectionRules(t *testing.T) {
	dial := serve(t, osServer())
	t.Run("late stdin after exit is dropped", func(t *testing.T) {
		r := newRaw(t, dial)
		r.send(silkd.Exec{Argv: []string{"true"}}, silkd.StdinClose{})
		r.expect(silkd.TypeStarted)
		r.expect(&silkd.Exit{Code: 0})
		r.send(silkd.Stdin{Data: []byte("late")}, silkd.StdinClose{}, silkd.Info{})
		r.expect(silkd.TypeInfo)
	})
	t.Run("a leading input frame is bad_request and the connection stays", func(t *testing.T) {
		r := newRaw(t, dial)
		r.send(silkd.Data{Data: []byte("x")})
		r.expectError(silkd.KindBadRequest, "stray data")
		r.send(silkd.Info{})
		r.expect(silkd.TypeInfo)
	})
	t.Run("a request during exec ends its stdin and runs after it", func(t *testing.T) {
		r := newRaw(t, dial)
		r.send(silkd.Exec{Argv: []string{"cat"}})
		r.expect(silkd.TypeStarted)
		r.send(silkd.Info{})
		r.expect(&silkd.Exit{Code: 0})
		r.expect(silkd.TypeInfo)
	})
	t.Run("parse errors and unknown ops keep the connection", func(t *testing.T) {
		r := newRaw(t, dial)
		if _, err := io.WriteString(r.c, "{not json\n{\"v\":1,\"op\":\"exec\",\"argv\":\"ls\"}\n"); err != nil {
			t.Fatal(err)
		}
		r.expectError(silkd.KindBadRequest, "parse: ")
		r.expectError(silkd.KindBadRequest, "parse: ")
		for _, op := range []string{silkd.OpGitStatus, silkd.OpLspStart, "teleport"} {
			if _, err := io.WriteString(r.c, `{"v":1,"op":"`+op+`"}`+"\n"); err != nil {
				t.Fatal(err)
			}
			r.expectError(silkd.KindUnimplemented, op)
		}
		r.send(silkd.Info{})
		r.expect(silkd.TypeInfo)
	})
	t.Run("a frame over the cap ends the connection", func(t *testing.T) {
		r := newRaw(t, dial)
		go func() {
			_, _ = io.WriteString(r.c, `{"v":1,"op":"data","data":"`+strings.Repeat("A", silkd.MaxFrame)+"\"}\n")
		}()
		r.expectError(silkd.KindBadRequest, "cap")
		// Closed while the rest of the line was still coming: EOF or a reset.
		if _, err := r.r.ReadResponse(); !errors.Is(err, io.EOF) && !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("after an oversized frame: %v, want the connection closed", err)
		}
	})
	t.Run("rpcs back to back", func(t *testing.T) {
		c := client(t, dial)
		dir := t.TempDir()
		for range 3 {
			if _, err := c.Info(testCtx(t)); err != nil {
				t.Fatal(err)
			}
			if err := c.WriteFile(testCtx(t), silkd.FsWrite{Path: dir + "/f"}, strings.NewReader("hello")); err != nil {
				t.Fatal(err)
			}
			if st, err := c.Stat(testCtx(t), dir+"/f"); err != nil || st.Size != 5 {
				t.Fatalf("stat %+v, %v", st, err)
			}
			if res, err := c.Exec(testCtx(t), silkd.Exec{Argv: []string{"true"}}, silkd.ExecIO{}); err != nil || res.Code != 0 {
				t.Fatal(err)
			}
		}
	})
}

// A client that goes away while its command writes output gets the command
// killed; a silent command runs to completion.
func TestClientGoneKillsTalkingChild(t *testing.T) {
	s := osServer()
	dial := serve(t, s)
	r := newRaw(t, dial)
	r.send(silkd.Exec{Argv: []string{"sh", "-c", "while :; do echo spam; done"}}, silkd.StdinClose{})
	r.expect(silkd.TypeStarted)
	r.expect(silkd.TypeStdout)
	r.c.Close()
	c := client(t, dial)
	waitUntil(t, "the talking child to be killed", func() bool { i, _ := c.Info(testCtx(t)); return i.Procs == 0 })

	dir := t.TempDir()
	r2 := newRaw(t, dial)
	r2.send(silkd.Exec{Argv: []string{"sh", "-c", "sleep 0.3; touch " + dir + "/ran"}}, silkd.StdinClose{})
	r2.expect(silkd.TypeStarted)
	r2.c.Close()
	waitUntil(t, "the silent child to finish", func() bool { _, err := os.Stat(dir + "/ran"); return err == nil })
}

// Output a grandchild keeps flowing is cut PostExitDrain after the child
// exits; exit still comes.
func TestPostExitDrain(t *testing.T) {
	if testing.Short() {
		t.Skip("waits PostExitDrain")
	}
	c := client(t, serve(t, osServer()))
	start := time.Now()
	res, err := c.Exec(testCtx(t), silkd.Exec{Argv: []string{"sh", "-c", "(sleep 20; echo late) & echo early"}}, silkd.ExecIO{})
	if err != nil || res.Code != 0 {
		t.Fatal(res, err)
	}
	if d := time.Since(start); d < PostExitDrain || d > PostExitDrain+5*time.Second {
		t.Fatalf("exit after %v, want about %v", d, PostExitDrain)
	}
}

func TestPortForward(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() { // echo, then half-close when the client's side ends
				defer c.Close()
				_, _ = io.Copy(c, c)
				_ = c.(*net.TCPConn).CloseWrite()
			}()
		}
	}()
	port := uint16(l.Addr().(*net.TCPAddr).Port)
	dial := serve(t, osServer())
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p, err := client(t, dial).PortForward(testCtx(t), port)
			if err != nil {
				t.Error(err)
				return
			}
			defer p.Close()
			msg := randomBytes(1<<20, uint64(i))
			go func() {
				_, _ = p.Write(msg)
				_ = p.CloseWrite()
			}()
			got, err := io.ReadAll(p)
			if err != nil || !bytes.Equal(got, msg) {
				t.Errorf("echo %d: %d bytes, %v", i, len(got), err)
			}
		}()
	}
	wg.Wait()

	// Nothing listens: not_found.
	l2, _ := net.Listen("tcp", "127.0.0.1:0")
	free := uint16(l2.Addr().(*net.TCPAddr).Port)
	l2.Close()
	c := client(t, dial)
	if _, err := c.PortForward(testCtx(t), free); !errors.Is(err, silkd.ErrNotFound) {
		t.Fatalf("port_forward to a closed port = %v", err)
	}
	if _, err := c.PortForward(testCtx(t), 0); !errors.Is(err, silkd.ErrBadRequest) {
		t.Fatalf("port_forward 0 = %v", err)
	}
}

// The guest may close its side first; the client's side stays writable
// and the RPC ends once both sides have.
func TestPortForwardGuestClosesFirst(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	got := make(chan []byte, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		_, _ = io.WriteString(c, "hello")
		_ = c.(*net.TCPConn).CloseWrite()
		b, _ := io.ReadAll(c)
		got <- b
	}()
	dial := serve(t, osServer())
	r := newRaw(t, dial)
	r.send(silkd.PortForward{Port: uint16(l.Addr().(*net.TCPAddr).Port)})
	r.expect(silkd.TypeReady)
	r.expect(&silkd.DataReply{Data: []byte("hello")})
	r.expect(silkd.TypeDone)
	r.send(silkd.Data{Data: []byte("after your eof")}, silkd.DataEnd{})
	if b := <-got; string(b) != "after your eof" {
		t.Fatalf("guest got %q", b)
	}
	r.send(silkd.Info{})
	r.expect(silkd.TypeInfo)
}

// randomBytes returns n deterministic pseudo-random bytes.
func randomBytes(n int, seed uint64) []byte {
	b := make([]byte, n)
	_, _ = rand.NewChaCha8([32]byte{byte(seed)}).Read(b)
	return b
}
