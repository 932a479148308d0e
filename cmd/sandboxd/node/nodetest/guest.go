package nodetest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/sbxlog/sbxlog/executors"
)

// Agent serves one connection to the guest agent of the fake VM whose run
// dir is runDir: what the guest side of a relay does. It owns conn and
// must close it when done.
type Agent func(conn net.Conn, runDir string)

// EchoAgent sends back every byte it reads and half-closes at its input's
// end: a guest that moves as much as it is sent, for relay tests.
func EchoAgent(conn net.Conn, _ string) {
	defer conn.Close()
	_, _ = io.Copy(conn, conn)
	if cw, ok := conn.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
}

// ErrGuestDown is what DialAgent answers while FailDials is set.
var ErrGuestDown = errors.New("nodetest: guest agent down, as asked")

// guests is the fake's guest side: every DialAgent gets one end of a unix
// socketpair (a raw *net.UnixConn, like hybrid vsock, so relays take the
// splice path) and the agent serves the other: the simulated guest agent
// (simguest.go) unless SetAgent chose another.
type guests struct {
	simGuests
	agent atomic.Pointer[Agent]
	// FailDials makes DialAgent fail (a guest that does not answer).
	FailDials atomic.Bool
	dials     atomic.Int64

	mu    sync.Mutex
	conns map[net.Conn]struct{} // agent ends still served
}

// SetAgent makes fn serve the guest agent's connections from now on (nil:
// the simulated guest agent, the default).
func (g *guests) SetAgent(fn Agent) {
	if fn == nil {
		g.agent.Store(nil)
		return
	}
	g.agent.Store(&fn)
}

// Dials returns how many connections to guest agents were made.
func (g *guests) Dials() int64 { return g.dials.Load() }

// DialAgent implements executors.AgentDialer.
func (g *guests) DialAgent(ctx context.Context, runDir string) (net.Conn, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if g.FailDials.Load() {
		return nil, fmt.Errorf("%w: %w", executors.ErrAgentUnreachable, ErrGuestDown)
	}
	host, guest, err := socketPair()
	if err != nil {
		return nil, err
	}
	g.dials.Add(1)
	serve := Agent(g.SimAgent)
	if p := g.agent.Load(); p != nil {
		serve = *p
	}
	g.mu.Lock()
	if g.conns == nil {
		g.conns = map[net.Conn]struct{}{}
	}
	g.conns[guest] = struct{}{}
	g.mu.Unlock()
	go func() {
		defer func() {
			g.mu.Lock()
			delete(g.conns, guest)
			g.mu.Unlock()
		}()
		serve(guest, runDir)
	}()
	return host, nil
}

// closeGuests ends every agent connection (the fake's VMs stop with it).
func (g *guests) closeGuests() {
	g.mu.Lock()
	defer g.mu.Unlock()
	for c := range g.conns {
		c.Close()
	}
}

// socketPair returns the two ends of a unix stream socketpair.
func socketPair() (net.Conn, net.Conn, error) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("nodetest: socketpair: %w", err)
	}
	var conns [2]net.Conn
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), fmt.Sprintf("agent-%d", i))
		c, err := net.FileConn(f)
		f.Close()
		if err != nil {
			if i == 0 {
				syscall.Close(fds[1])
			} else {
				conns[0].Close()
			}
			return nil, nil, fmt.Errorf("nodetest: socketpair: %w", err)
		}
		conns[i] = c
	}
	return conns[0], conns[1], nil
}
