package chsim_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"io"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sbxlog/sbxlog/executors/ch"
	"github.com/sbxlog/sbxlog/executors/ch/chsim"
	"github.com/sbxlog/sbxlog/executors/guest/silkagent"
	"github.com/sbxlog/sbxlog/executors/guest/silkagent/proctest"
	"github.com/sbxlog/sbxlog/executors/guest/silkd"
	"github.com/sbxlog/sbxlog/executors/hvsock"
)

// simVM boots an in-process simulated VM with a vsock device and returns
// its API client and a dialer for its silkd agent.
func simVM(t *testing.T) (*ch.Client, string, func() *silkd.Conn) {
	t.Helper()
	return simVMWith(t, chsim.DefaultOptions(), 32<<20)
}

// simVMWith is simVM with opts and memBytes of memory.
func simVMWith(t *testing.T, opts chsim.Options, memBytes int64) (*ch.Client, string, func() *silkd.Conn) {
	t.Helper()
	dir := shortDir(t)
	c := inProc(t, dir, opts)
	cfg := vmConfig(t, dir, memBytes)
	sock := filepath.Join(dir, "v.sock")
	cfg.SetVsock(3, sock)
	boot(t, c, cfg)
	return c, dir, func() *silkd.Conn { return silkd.NewConn(dialVsock(t, sock, silkd.Port)) }
}

// dialVsock connects to the guest's port through the VM's vsock socket,
// until the test ends.
func dialVsock(t *testing.T, sock string, port uint32) *net.UnixConn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	nc, err := hvsock.Dial(ctx, sock, port)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	return nc
}

func gctx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// The agent on the silkd port is the real protocol over a simulated guest,
// and says so.
func TestSimulatedAgent(t *testing.T) {
	_, _, dial := simVM(t)
	c := dial()
	ctx := gctx(t)
	info, err := c.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !info.Simulated || info.Agent != chsim.SimAgent || info.Proto != silkd.ProtoKeepAlive {
		t.Fatalf("info %+v: must say it is simulated", info)
	}

	var out, errb bytes.Buffer
	res, err := c.Exec(ctx, silkd.Exec{Argv: []string{"echo", "hello", "guest"}}, silkd.ExecIO{Stdout: &out})
	if err != nil || res.Code != 0 || out.String() != "hello guest\n" || res.Pid == 0 {
		t.Fatalf("echo = %+v, %v, %q", res, err, out.String())
	}
	out.Reset()
	in := strings.Repeat("stdin ", 50000)
	if res, err := c.Exec(ctx, silkd.Exec{Argv: []string{"cat"}}, silkd.ExecIO{Stdin: strings.NewReader(in), Stdout: &out}); err != nil || res.Code != 0 || out.String() != in {
		t.Fatalf("cat = %+v, %v, %d bytes", res, err, out.Len())
	}
	if res, err := c.Exec(ctx, silkd.Exec{Argv: []string{"/bin/false"}}, silkd.ExecIO{}); err != nil || res.Code != 1 {
		t.Fatalf("false = %+v, %v", res, err)
	}
	// Nothing else runs: the refusal names the simulation.
	for _, argv := range [][]string{{"sh", "-c", "echo $((6*7))"}, {"/usr/bin/id"}, {"touch", "/tmp/x"}} {
		_, err := c.Exec(ctx, silkd.Exec{Argv: argv}, silkd.ExecIO{Stdout: &out, Stderr: &errb})
		if !errors.Is(err, silkd.ErrBadRequest) || !strings.Contains(err.Error(), "chsim simulates the guest and runs no commands") {
			t.Fatalf("exec %v = %v, want the simulation's refusal", argv, err)
		}
	}

	// A sleeping command is killed from another connection.
	pid := make(chan uint32, 1)
	done := make(chan silkd.ExecResult, 1)
	go func() {
		r, err := dial().Exec(ctx, silkd.Exec{Argv: []string{"sleep", "60"}}, silkd.ExecIO{Started: func(p uint32) { pid <- p }})
		if err != nil {
			t.Error(err)
		}
		done <- r
	}()
	if err := c.Kill(ctx, <-pid, nil); err != nil {
		t.Fatal(err)
	}
	if r := <-done; r.Code != -1 {
		t.Fatalf("killed sleep exit %d", r.Code)
	}

	// Files: the VM's own tree in memory.
	data := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB
	if err := c.WriteFile(ctx, silkd.FsWrite{Path: "/tmp/f"}, bytes.NewReader(data)); err != nil {
		t.Fatal(err)
	}
	var back bytes.Buffer
	if _, err := c.ReadFile(ctx, "/tmp/f", &back); err != nil || !bytes.Equal(back.Bytes(), data) {
		t.Fatalf("read back %d bytes, %v", back.Len(), err)
	}
	out.Reset()
	if res, err := c.Exec(ctx, silkd.Exec{Argv: []string{"cat", "/tmp/f", "/tmp/nope"}}, silkd.ExecIO{Stdout: &out, Stderr: &errb}); err != nil || res.Code != 1 || !bytes.Equal(out.Bytes(), data) {
		t.Fatalf("cat of a file = %+v, %v, %d bytes", res, err, out.Len())
	}
	if _, err := c.Stat(ctx, "/etc/passwd"); !errors.Is(err, silkd.ErrNotFound) {
		t.Fatalf("the host's files must not show: %v", err)
	}
}

// port_forward reaches the simulated echo server; 24 streams at once, 512
// KiB each way, all intact (kept small: -race slows base64 twentyfold).
func TestSimulatedPortForward(t *testing.T) {
	_, _, dial := simVM(t)
	ctx := gctx(t)
	var wg sync.WaitGroup
	for i := range 24 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p, err := dial().PortForward(ctx, silkagent.SimEchoPort)
			if err != nil {
				t.Error(err)
				return
			}
			msg := bytes.Repeat([]byte{byte(i), byte(i >> 8), 7}, 512<<10/3)
			go func() {
				_, _ = p.Write(msg)
				_ = p.CloseWrite()
			}()
			got, err := io.ReadAll(p)
			if err != nil || sha256.Sum256(got) != sha256.Sum256(msg) {
				t.Errorf("stream %d: %d bytes back, %v", i, len(got), err)
			}
		}()
	}
	wg.Wait()
	if _, err := dial().PortForward(ctx, 8080); !errors.Is(err, silkd.ErrNotFound) {
		t.Fatalf("port_forward to a port nothing listens on = %v", err)
	}
}

// The guest's files are in its memory: they survive a snapshot and
// restore, and a fresh boot starts empty.
func TestSimulatedFilesSurviveSnapshot(t *testing.T) {
	c, dir, dial := simVM(t)
	ctx := gctx(t)
	if err := dial().WriteFile(ctx, silkd.FsWrite{Path: "/root/kept"}, strings.NewReader("across hibernate")); err != nil {
		t.Fatal(err)
	}
	snapshotAndRestore(t, ctx, c, dir)
	var b bytes.Buffer
	if _, err := dial().ReadFile(ctx, "/root/kept", &b); err != nil || b.String() != "across hibernate" {
		t.Fatalf("after restore: %q, %v", b.String(), err)
	}
	if err := c.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.Boot(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := dial().Stat(ctx, "/root/kept"); !errors.Is(err, silkd.ErrNotFound) {
		t.Fatalf("after a fresh boot: %v, want the tmpfs empty", err)
	}
}

// snapshotAndRestore hibernates the VM into dir's "snap" and restores it
// running.
func snapshotAndRestore(t *testing.T, ctx context.Context, c *ch.Client, dir string) {
	t.Helper()
	url := hibernate(t, ctx, c, dir)
	if err := c.Restore(ctx, ch.RestoreConfig{SourceURL: url, MemoryRestoreMode: ch.RestoreCopy, Resume: true}); err != nil {
		t.Fatal(err)
	}
}

// hibernate pauses the VM, snapshots it into dir's "snap" and deletes it;
// it returns the snapshot's URL.
func hibernate(t *testing.T, ctx context.Context, c *ch.Client, dir string) string {
	t.Helper()
	if err := c.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	_, url := snapshotDir(t, dir, "snap")
	if err := c.Snapshot(ctx, url); err != nil {
		t.Fatal(err)
	}
	if err := c.Delete(ctx); err != nil {
		t.Fatal(err)
	}
	return url
}

// Each VM's simulated tmpfs is bounded, by GuestFSBytes and by half the
// VM's memory: a write past it fails as on a full tmpfs (ENOSPC), one that
// fits still succeeds, and a restored VM keeps the bound.
func TestSimulatedFilesBounded(t *testing.T) {
	for _, tc := range []struct {
		name  string
		env   string // SBX_CHSIM_GUEST_FS_BYTES
		mem   int64
		limit int64
	}{
		{"half the memory", "", 8 << 20, 4 << 20},
		{"the option", "1MiB", 32 << 20, 1 << 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts := chsim.DefaultOptions()
			if err := opts.ApplyEnv(func(k string) string {
				if k == chsim.EnvGuestFSBytes {
					return tc.env
				}
				return ""
			}); err != nil {
				t.Fatal(err)
			}
			c, dir, dial := simVMWith(t, opts, tc.mem)
			ctx := gctx(t)
			full := func(what string) {
				t.Helper()
				err := dial().WriteFile(ctx, silkd.FsWrite{Path: "/tmp/big"}, bytes.NewReader(make([]byte, tc.limit)))
				if !errors.Is(err, silkd.ErrInternal) || !strings.Contains(err.Error(), "no space left on device") {
					t.Fatalf("%s: a write of the whole bound = %v, want no space left on device", what, err)
				}
			}
			full("booted")
			if err := dial().WriteFile(ctx, silkd.FsWrite{Path: "/tmp/half"}, bytes.NewReader(make([]byte, tc.limit/2))); err != nil {
				t.Fatalf("a write that fits: %v", err)
			}
			snapshotAndRestore(t, ctx, c, dir)
			full("restored")
			if st, err := dial().Stat(ctx, "/tmp/half"); err != nil || st.Size != uint64(tc.limit/2) {
				t.Fatalf("after restore: %+v, %v", st, err)
			}
		})
	}
}

// Issue 23's process suite on the simulated guest: the process table and
// the simulated shell of sessions, kept through a snapshot and restore;
// pty_open says it is simulated.
func TestSimulatedProcOps(t *testing.T) {
	c, dir, dial := simVM(t)
	proctest.Run(t, proctest.Agent{
		Dial:      func(*testing.T) *silkd.Conn { return dial() },
		Simulated: true,
		Hibernate: func(t *testing.T) { snapshotAndRestore(t, gctx(t), c, dir) },
	})
}
