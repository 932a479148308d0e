package proxy

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// door is one VM's set of doors and everything open through them.
type door struct {
	s    *Server
	vm   string
	spec Doors

	lns       []net.Listener
	httpConns *chanListener
	srv       *http.Server
	transport *http.Transport // forward requests and intercepted tunnels
	sem       chan struct{}
	nl        *netlink.Handle // a TCP door's: the Server's, for hostPeer's route lookups

	mu        sync.Mutex
	closed    bool
	conns     map[net.Conn]struct{} // hijacked and SOCKS5 connections
	flows     map[*flow]struct{}
	sandboxes map[string]bool // every sandbox served, for the Server's settle
	wg        sync.WaitGroup
	sniffing  sync.WaitGroup // TCP connections still in hostPeer (the Server's netlink handle)
	stop      chan struct{}
}

func (s *Server) openDoor(vm string, spec Doors) (*door, error) {
	d := &door{
		s: s, vm: vm, spec: spec, sem: make(chan struct{}, s.cfg.MaxConns),
		conns: map[net.Conn]struct{}{}, flows: map[*flow]struct{}{}, sandboxes: map[string]bool{},
		stop: make(chan struct{}),
	}
	d.transport = &http.Transport{
		DialContext:           d.dialContext,
		TLSClientConfig:       &tls.Config{RootCAs: s.cfg.RootCAs, MinVersion: tls.VersionTLS12},
		TLSHandshakeTimeout:   s.cfg.Timeout,
		MaxIdleConns:          64,
		MaxIdleConnsPerHost:   8,
		IdleConnTimeout:       90 * time.Second,
		ResponseHeaderTimeout: 0,
	}
	d.httpConns = newChanListener()
	d.srv = &http.Server{Handler: d, ReadHeaderTimeout: s.cfg.Timeout, IdleTimeout: 90 * time.Second, ErrorLog: nil}
	type bind struct {
		network, addr string
		socks, sniff  bool
	}
	var binds []bind
	if spec.TCP.IsValid() {
		nl, err := s.routes()
		if err != nil {
			return nil, fmt.Errorf("door %s: netlink: %w", spec.TCP, err)
		}
		d.nl = nl
		binds = append(binds, bind{"tcp", spec.TCP.String(), false, true})
	}
	if spec.HTTPSocket != "" {
		binds = append(binds, bind{"unix", spec.HTTPSocket, false, false})
	}
	if spec.SocksSocket != "" {
		binds = append(binds, bind{"unix", spec.SocksSocket, true, false})
	}
	for _, b := range binds {
		ln, err := listenDoor(b.network, b.addr, d.nl)
		if err != nil {
			for _, l := range d.lns {
				l.Close()
			}
			return nil, err
		}
		d.lns = append(d.lns, ln)
		d.wg.Add(1)
		go d.accept(ln, b.socks, b.sniff)
	}
	d.wg.Add(2)
	go func() { defer d.wg.Done(); _ = d.srv.Serve(d.httpConns) }()
	go func() { defer d.wg.Done(); d.tick() }()
	return d, nil
}

// accept takes a door's connections, at most MaxConns at a time.
func (d *door) accept(ln net.Listener, socks, sniff bool) {
	defer d.wg.Done()
	for {
		select {
		case d.sem <- struct{}{}:
		case <-d.stop:
			return
		}
		c, err := ln.Accept()
		if err != nil {
			<-d.sem
			if errors.Is(err, net.ErrClosed) {
				return
			}
			d.s.log.Warn().Err(err).Str("vm", d.vm).Msg("door accept")
			select {
			case <-time.After(50 * time.Millisecond):
			case <-d.stop:
				return
			}
			continue
		}
		tc := &trackedConn{Conn: c, release: func() { <-d.sem }}
		switch {
		case socks:
			go d.serveSocks(tc)
		case sniff:
			d.sniffing.Add(1)
			go d.sniff(tc)
		default:
			d.httpConns.push(tc)
		}
	}
}

// sniff sends a TCP door's connection to SOCKS5 (first byte 5) or HTTP;
// one from the host itself is closed unread.
func (d *door) sniff(c *trackedConn) {
	local := d.hostPeer(c.Conn)
	d.sniffing.Done()
	if local {
		c.Close()
		return
	}
	_ = c.SetReadDeadline(time.Now().Add(d.s.cfg.Timeout))
	br := bufio.NewReader(c.Conn)
	b, err := br.Peek(1)
	if err != nil {
		c.Close()
		return
	}
	_ = c.SetReadDeadline(time.Time{})
	c.r = br
	if b[0] == socksVersion {
		d.serveSocks(c)
		return
	}
	d.httpConns.push(c)
}

// hostPeer reports whether a TCP door's connection comes from the host
// itself: its peer address is local (or cannot be told). The listener's
// device binding keeps out what arrives on another interface, but the
// kernel delivers a host-local connection to the bridge's address as if
// it came in on the bridge; its source, though, is one of the host's own
// addresses, never a guest's.
func (d *door) hostPeer(c net.Conn) bool {
	ta, ok := c.RemoteAddr().(*net.TCPAddr)
	if !ok {
		return true
	}
	rs, err := d.nl.RouteGet(ta.IP)
	if err != nil || len(rs) == 0 {
		d.s.log.Warn().Err(err).Str("vm", d.vm).Str("peer", ta.IP.String()).Msg("door: cannot tell where a connection comes from; closed")
		return true
	}
	return rs[0].Type == unix.RTN_LOCAL
}

// track registers a connection that the HTTP server no longer owns
// (hijacked, SOCKS5), so close ends it. False: the door is closing.
func (d *door) track(c net.Conn) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return false
	}
	d.conns[c] = struct{}{}
	return true
}

func (d *door) untrack(c net.Conn) {
	d.mu.Lock()
	delete(d.conns, c)
	d.mu.Unlock()
}

// served notes a sandbox this door served, for the Server's settle.
func (d *door) served(sandbox string) {
	d.mu.Lock()
	d.sandboxes[sandbox] = true
	d.mu.Unlock()
}

// close ends the doors: listeners, the HTTP server and its connections,
// every tunnel; the flows' last bytes are reported. It returns every
// sandbox the doors served (nil when already closed), whose accounting
// the Server settles.
func (d *door) close() map[string]bool {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil
	}
	d.closed = true
	conns := make([]net.Conn, 0, len(d.conns))
	for c := range d.conns {
		conns = append(conns, c)
	}
	d.mu.Unlock()
	close(d.stop)
	for _, ln := range d.lns {
		ln.Close()
	}
	d.httpConns.Close()
	_ = d.srv.Close()
	for _, c := range conns {
		c.Close()
	}
	d.transport.CloseIdleConnections()
	d.wg.Wait()
	// No accept loop runs now, so no sniff starts; the ones started are
	// past their route lookup before the Server may close its handle.
	d.sniffing.Wait()
	d.mu.Lock()
	flows := make([]*flow, 0, len(d.flows))
	for f := range d.flows {
		flows = append(flows, f)
	}
	sbs := d.sandboxes
	d.mu.Unlock()
	for _, f := range flows {
		d.report(f)
	}
	return sbs
}

// flow counts the payload bytes of one request or tunnel.
type flow struct {
	sandbox      string
	tx, rx       atomic.Int64
	repTx, repRx int64 // reported so far (door.mu)
}

func (d *door) newFlow(sandbox string) *flow {
	f := &flow{sandbox: sandbox}
	d.mu.Lock()
	d.flows[f] = struct{}{}
	d.mu.Unlock()
	return f
}

// endFlow reports what f has not reported yet and forgets it.
func (d *door) endFlow(f *flow) {
	d.report(f)
	d.mu.Lock()
	delete(d.flows, f)
	d.mu.Unlock()
}

func (d *door) report(f *flow) {
	d.mu.Lock()
	tx, rx := f.tx.Load(), f.rx.Load()
	dtx, drx := tx-f.repTx, rx-f.repRx
	f.repTx, f.repRx = tx, rx
	d.mu.Unlock()
	if (dtx != 0 || drx != 0) && f.sandbox != "" {
		d.s.met.Transfer(f.sandbox, dtx, drx)
	}
}

// tick reports long tunnels' bytes every meterInterval.
func (d *door) tick() {
	t := time.NewTicker(meterInterval)
	defer t.Stop()
	for {
		select {
		case <-d.stop:
			return
		case <-t.C:
		}
		d.mu.Lock()
		flows := make([]*flow, 0, len(d.flows))
		for f := range d.flows {
			flows = append(flows, f)
		}
		d.mu.Unlock()
		for _, f := range flows {
			d.report(f)
		}
	}
}

// dialContext is the transport's dial: guarded (dial.go).
func (d *door) dialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	host, port, err := splitHostPort(addr, 0)
	if err != nil {
		return nil, err
	}
	return d.s.dial(ctx, host, port)
}

// trackedConn releases its door slot once, when closed; r, when set, holds
// bytes read ahead (the sniffed first byte).
type trackedConn struct {
	net.Conn
	r       *bufio.Reader
	once    sync.Once
	release func()
}

func (c *trackedConn) Read(p []byte) (int, error) {
	if c.r != nil {
		return c.r.Read(p)
	}
	return c.Conn.Read(p)
}

func (c *trackedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}

// CloseWrite half-closes when the connection can.
func (c *trackedConn) CloseWrite() error { return closeWrite(c.Conn) }

func closeWrite(c net.Conn) error {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// chanListener hands connections accepted elsewhere to an http.Server.
type chanListener struct {
	ch   chan net.Conn
	done chan struct{}
	once sync.Once
}

func newChanListener() *chanListener {
	return &chanListener{ch: make(chan net.Conn), done: make(chan struct{})}
}

func (l *chanListener) push(c net.Conn) {
	select {
	case l.ch <- c:
	case <-l.done:
		c.Close()
	}
}

func (l *chanListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ch:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *chanListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *chanListener) Addr() net.Addr { return doorAddr{} }

type doorAddr struct{}

func (doorAddr) Network() string { return "door" }
func (doorAddr) String() string  { return "door" }
