package chsim

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sbxlog/sbxlog/executors/ch"
	"github.com/sbxlog/sbxlog/executors/guest/agent"
	"github.com/sbxlog/sbxlog/executors/guest/silkd"
	"github.com/sbxlog/sbxlog/executors/handshake"
)

// vsockServer is the host side of CH's hybrid vsock: a unix socket where a
// host process writes "CONNECT <port>\n" and, once the guest accepts on that
// port, reads "OK <host port>\n" and then talks to the guest. On the silkd
// port (silkd.Port) the simulated guest's agent answers (guest.go), on
// agent.VsockPort its control agent (clock.go); on any other port the guest
// echoes every line back.
type vsockServer struct {
	s    *Server
	ln   *net.UnixListener
	path string

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	port   uint32
}

// maxConnectLine bounds a CONNECT line ("CONNECT " and a 32-bit port,
// with room for stray whitespace).
const maxConnectLine = 64

func (s *Server) listenVsock(path string) (*vsockServer, error) {
	// CH binds without removing what is there: a leftover socket from another
	// VM is an error, which is what catches a clone whose path was not
	// rewritten.
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, err
	}
	ln.SetUnlinkOnClose(false)
	v := &vsockServer{s: s, ln: ln, path: path, conns: map[net.Conn]struct{}{}, port: 1 << 30}
	go v.accept()
	return v, nil
}

func (v *vsockServer) accept() {
	for {
		c, err := v.ln.Accept()
		if err != nil {
			return
		}
		v.mu.Lock()
		if v.closed {
			v.mu.Unlock()
			c.Close()
			return
		}
		v.conns[c] = struct{}{}
		v.port++
		port := v.port
		v.mu.Unlock()
		go v.handle(c, port)
	}
}

func (v *vsockServer) forget(c net.Conn) {
	c.Close()
	v.mu.Lock()
	delete(v.conns, c)
	v.mu.Unlock()
}

// handle runs one hybrid-vsock connection.
func (v *vsockServer) handle(c net.Conn, hostPort uint32) {
	defer v.forget(c)
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
	// Read byte-wise, so the guest side starts at the connection's first
	// byte past the line, as on CH.
	line, err := handshake.ReadLine(c, maxConnectLine)
	if err != nil {
		return
	}
	f := strings.Fields(string(line))
	if len(f) != 2 || f[0] != "CONNECT" {
		return
	}
	port, err := strconv.ParseUint(f[1], 10, 32)
	if err != nil {
		return
	}
	// The guest answers only while it runs; a paused guest leaves the
	// connection waiting, as on a real VM.
	deadline := time.Now().Add(30 * time.Second)
	for {
		ready, alive := v.guestReady()
		if !alive {
			return
		}
		if ready {
			break
		}
		if time.Now().After(deadline) {
			return
		}
		time.Sleep(2 * time.Millisecond)
	}
	if ps := v.s.opts.VsockPorts; len(ps) > 0 && !slices.Contains(ps, uint32(port)) {
		return // nothing listens on that port in the guest: connection reset
	}
	if _, err := fmt.Fprintf(c, "OK %d\n", hostPort); err != nil {
		return
	}
	_ = c.SetReadDeadline(time.Time{})
	switch port {
	case silkd.Port:
		if g := v.guest(); g != nil {
			g.agent.ServeConn(c)
		}
		return
	case agent.VsockPort:
		if g := v.guest(); g != nil {
			_ = g.line.Serve(c, c)
		}
		return
	}
	r := bufio.NewReader(c)
	for {
		l, err := r.ReadString('\n')
		if err != nil {
			return
		}
		if _, err := c.Write([]byte(l)); err != nil {
			return
		}
	}
}

// guest returns the simulated guest of the VM the device belongs to.
func (v *vsockServer) guest() *simGuest {
	v.s.mu.Lock()
	defer v.s.mu.Unlock()
	if vm := v.s.vm; vm != nil && vm.devs != nil && vm.devs.vsock == v {
		return vm.guest
	}
	return nil
}

// guestReady reports whether the guest accepts now and whether the device
// still exists. A guest whose agent has not started yet refuses (closes the
// connection) rather than waiting.
func (v *vsockServer) guestReady() (ready, alive bool) {
	s := v.s
	s.mu.Lock()
	defer s.mu.Unlock()
	v.mu.Lock()
	closed := v.closed
	v.mu.Unlock()
	vm := s.vm
	if closed || vm == nil || vm.devs == nil || vm.devs.vsock != v {
		return false, false
	}
	if vm.state != ch.StateRunning {
		return false, true
	}
	if s.now().Before(vm.agentReadyAt) {
		return false, false
	}
	return true, true
}

func (v *vsockServer) close() {
	v.mu.Lock()
	if v.closed {
		v.mu.Unlock()
		return
	}
	v.closed = true
	conns := v.conns
	v.conns = map[net.Conn]struct{}{}
	v.mu.Unlock()
	v.ln.Close()
	_ = os.Remove(v.path)
	for c := range conns {
		c.Close()
	}
}
