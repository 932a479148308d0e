// Package chsimbin builds and starts the chsim binary for tests and
// benchmarks, which run the simulator as its own process, as a VMM runs.
//
// Build compiles cmd/chsim with the go tool found on PATH (go test puts its
// own toolchain there), unless SBX_CHSIM_BIN names a prebuilt binary. Start
// runs one instance on a socket and returns once it answers vmm.ping.
package chsimbin

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/sbxlog/sbxlog/executors/ch"
)

// EnvBin names a prebuilt chsim binary to use instead of building one.
const EnvBin = "SBX_CHSIM_BIN"

// Build compiles cmd/chsim into dir and returns the binary's path.
func Build(dir string) (string, error) {
	if p := os.Getenv(EnvBin); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("chsimbin: %s=%s: %w", EnvBin, p, err)
		}
		return p, nil
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		return "", fmt.Errorf("chsimbin: no go tool on PATH to build chsim: %w", err)
	}
	out := filepath.Join(dir, "chsim")
	cmd := exec.Command(goBin, "build", "-o", out, "github.com/sbxlog/sbxlog/cmd/chsim")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("chsimbin: go build chsim: %w\n%s", err, stderr.String())
	}
	return out, nil
}

// Process is a running chsim.
type Process struct {
	Cmd    *exec.Cmd
	Socket string
	Client *ch.Client

	log  *SyncBuffer
	done chan struct{}
	err  error
}

// Start runs bin with --api-socket path=socket and extra environment
// variables, and waits until it answers vmm.ping.
func Start(ctx context.Context, bin, socket string, env ...string) (*Process, error) {
	cmd := exec.Command(bin, "--api-socket", "path="+socket)
	cmd.Env = append(os.Environ(), env...)
	buf := &SyncBuffer{}
	cmd.Stdout, cmd.Stderr = buf, buf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("chsimbin: start: %w", err)
	}
	p := &Process{Cmd: cmd, Socket: socket, Client: ch.New(socket), log: buf, done: make(chan struct{})}
	go func() { p.err = cmd.Wait(); close(p.done) }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		_, err := p.Client.Ping(pctx)
		cancel()
		if err == nil {
			return p, nil
		}
		select {
		case <-p.done:
			return nil, fmt.Errorf("chsimbin: chsim exited before answering: %v\n%s", p.err, buf.String())
		default:
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			p.Kill()
			return nil, fmt.Errorf("chsimbin: chsim did not answer vmm.ping: %w", err)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// Pid is the process id.
func (p *Process) Pid() int { return p.Cmd.Process.Pid }

// Done is closed when the process has exited.
func (p *Process) Done() <-chan struct{} { return p.done }

// ExitErr is the process's exit status once Done is closed.
func (p *Process) ExitErr() error { <-p.done; return p.err }

// Log is what the process wrote to stdout and stderr so far.
func (p *Process) Log() string { return p.log.String() }

// WaitExit waits up to d for the process to exit.
func (p *Process) WaitExit(d time.Duration) error {
	select {
	case <-p.done:
		return nil
	case <-time.After(d):
		return errors.New("chsimbin: chsim still running")
	}
}

// Kill sends SIGKILL and waits for the exit.
func (p *Process) Kill() {
	_ = p.Cmd.Process.Kill()
	<-p.done
}

// SyncBuffer is a bytes.Buffer safe for concurrent writers, for logs.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String returns what was written so far.
func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// RunTests is a TestMain body for packages whose tests run chsim: it builds
// the binary into a temporary directory, stores its path in bin, runs the
// tests and removes the directory. It returns the exit code for os.Exit; a
// failed build fails the whole package rather than skipping it.
func RunTests(m interface{ Run() int }, bin *string) int {
	dir, err := os.MkdirTemp("", "chsim-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	if *bin, err = Build(dir); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return m.Run()
}

// TB is the part of testing.TB the test helpers need.
type TB interface {
	Helper()
	Fatal(args ...any)
	Cleanup(func())
	Failed() bool
	Logf(format string, args ...any)
}

// StartT is Start for a test: the process is killed when the test ends and
// its log is printed if the test failed.
func StartT(t TB, bin, socket string, env ...string) *Process {
	t.Helper()
	p, err := Start(context.Background(), bin, socket, env...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.Kill()
		if t.Failed() {
			t.Logf("chsim log:\n%s", p.Log())
		}
	})
	return p
}

// ShortTempDir is a temporary directory with a short path, removed when the
// test ends: unix socket paths are limited to 108 bytes and t.TempDir embeds
// the test's name.
func ShortTempDir(t TB) string {
	t.Helper()
	d, err := os.MkdirTemp("", "sbx")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}
