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

	log  *syncBuffer
	done chan struct{}
	err  error
}

// Start runs bin with --api-socket path=socket and extra environment
// variables, and waits until it answers vmm.ping.
func Start(ctx context.Context, bin, socket string, env ...string) (*Process, error) {
	cmd := exec.Command(bin, "--api-socket", "path="+socket)
	cmd.Env = append(os.Environ(), env...)
	buf := &syncBuffer{}
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

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
