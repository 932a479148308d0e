package proxy

import (
	"bufio"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sbxlog/sbxlog/fsm/egress"
)

// intercept terminates an allowed CONNECT's TLS with a leaf of the node CA
// for host and serves the tunnel's requests one by one (HTTP/1.1 only),
// each decided by egress.DecideInner and re-originated over verified TLS
// with its rule's secret and the claim's credentials for the host
// injected.
func (d *door) intercept(w http.ResponseWriter, r *http.Request, sb, host string, port uint16, dec egress.Decision) {
	leaf, err := d.s.cfg.CA.Leaf(host)
	if err != nil {
		dec.Allow, dec.Reason = false, egress.ReasonIntercept
		d.s.record(sb, doorConnect, dec)
		http.Error(w, "egress: intercept setup failed", http.StatusInternalServerError)
		return
	}
	d.s.record(sb, doorConnect, dec)
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		http.Error(w, "egress: connection cannot be hijacked", http.StatusInternalServerError)
		return
	}
	if !d.track(conn) {
		conn.Close()
		return
	}
	defer d.untrack(conn)
	defer conn.Close()
	if _, err := io.WriteString(conn, "HTTP/1.1 200 Connection Established\r\n\r\n"); err != nil {
		return
	}
	var raw net.Conn = conn
	if brw.Reader.Buffered() > 0 {
		raw = &readAhead{Conn: conn, r: brw.Reader}
	}
	tc := tls.Server(raw, &tls.Config{
		Certificates: []tls.Certificate{*leaf}, MinVersion: tls.VersionTLS12, NextProtos: []string{"http/1.1"},
	})
	_ = tc.SetDeadline(time.Now().Add(d.s.cfg.Timeout))
	if err := tc.HandshakeContext(r.Context()); err != nil {
		return
	}
	_ = tc.SetDeadline(time.Time{})
	in := &inner{d: d, sb: sb, host: host, port: port, mode: dec.Intercept}
	ln := newOneConn(tc)
	srv := &http.Server{Handler: in, ReadHeaderTimeout: d.s.cfg.Timeout, ConnState: ln.state}
	_ = srv.Serve(ln)
}

// inner serves the requests inside one intercepted tunnel.
type inner struct {
	d    *door
	sb   string
	host string
	port uint16
	mode egress.Intercept
}

func (in *inner) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	d := in.d
	dec := egress.DecideInner(d.s.policy(in.sb, true), in.host, r.Method, in.port, in.mode)
	if !dec.Allow {
		d.s.record(in.sb, doorInner, dec)
		denied(w, in.host)
		return
	}
	out := r.Clone(r.Context())
	out.RequestURI = ""
	out.URL.Scheme = "https"
	// Always host:port, so an IPv6 literal is bracketed: a bare
	// "2001:db8::1:8080" would be read as port 8080 of another address.
	out.URL.Host = net.JoinHostPort(in.host, strconv.Itoa(int(in.port)))
	// The guest's Host stays when it names the tunnel's host (signatures
	// over it survive); anything else is the tunnel's, without the port
	// when it is 443 (as a client writes it).
	if !strings.EqualFold(authorityHost(r.Host), in.host) {
		out.Host = out.URL.Host
		if in.port == 443 {
			out.Host = strings.TrimSuffix(out.URL.Host, ":443")
		}
	}
	stripHop(out.Header)
	set := d.inject(out, in.sb, dec.Secret)
	if n := d.injectCredentials(out, in.sb, in.host, set); (set != "" || n > 0) && echoes(out.Method) {
		d.refuseEcho(w, in.sb, doorInner, in.host, dec)
		return
	}
	d.roundTrip(w, out, in.sb, doorInner, dec)
}

// authorityHost is the host of a Host header: without its port and, for
// an IPv6 literal, its brackets.
func authorityHost(authority string) string {
	if h, _, err := net.SplitHostPort(authority); err == nil {
		return h
	}
	return strings.TrimSuffix(strings.TrimPrefix(authority, "["), "]")
}

// injectCredentials sets the claim's header credentials for host on out,
// in name order (the old daemon's): one with a placeholder only where the
// guest sent exactly the placeholder, and none over a header an earlier
// injection set (secretHeader, the rule's secret; an earlier credential).
// It returns how many it set.
func (d *door) injectCredentials(out *http.Request, sb, host, secretHeader string) int {
	set := map[string]bool{secretHeader: true}
	n := 0
	for _, c := range d.s.credentials(sb, host) {
		if c.Inject.Header == "" {
			continue // a query credential: not injected by this proxy
		}
		k := http.CanonicalHeaderKey(c.Inject.Header)
		if set[k] || (c.Inject.Placeholder != "" && out.Header.Get(k) != c.Inject.Placeholder) {
			continue
		}
		out.Header.Set(k, c.Value)
		set[k] = true
		n++
	}
	return n
}

// readAhead is a connection whose first bytes were read into r.
type readAhead struct {
	net.Conn
	r *bufio.Reader
}

func (c *readAhead) Read(p []byte) (int, error) { return c.r.Read(p) }

// oneConn is a listener of one connection: Accept returns it once, then
// blocks until the server is done with it.
type oneConn struct {
	c    net.Conn
	once sync.Once
	done chan struct{}
	stop sync.Once
}

func newOneConn(c net.Conn) *oneConn { return &oneConn{c: c, done: make(chan struct{})} }

func (l *oneConn) Accept() (net.Conn, error) {
	var c net.Conn
	l.once.Do(func() { c = l.c })
	if c != nil {
		return c, nil
	}
	<-l.done
	return nil, net.ErrClosed
}

func (l *oneConn) state(_ net.Conn, s http.ConnState) {
	if s == http.StateClosed || s == http.StateHijacked {
		l.Close()
	}
}

func (l *oneConn) Close() error {
	l.stop.Do(func() { close(l.done) })
	return nil
}

func (l *oneConn) Addr() net.Addr { return l.c.LocalAddr() }
