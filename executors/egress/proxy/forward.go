package proxy

import (
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"net/textproto"
	"strings"
	"sync/atomic"

	"github.com/sbxlog/sbxlog/fsm/egress"
)

// ServeHTTP is a door's HTTP handler: CONNECT tunnels, everything else a
// forward request.
func (d *door) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	sb, ok := d.s.pol.SandboxOfVM(d.vm)
	if ok {
		d.served(sb)
	}
	if r.Method == http.MethodConnect {
		d.connect(w, r, sb, ok)
		return
	}
	d.forward(w, r, sb, ok)
}

// denied is the old daemon's answer to a refused request.
func denied(w http.ResponseWriter, host string) {
	http.Error(w, "egress denied: "+host, http.StatusForbidden)
}

// unreachable answers a dial or transport failure, the guard's included,
// and returns the reason it counts as.
func unreachable(w http.ResponseWriter, err error) egress.Reason {
	why, reason := "upstream unreachable", egress.ReasonUpstream
	var b *blockedError
	if errors.As(err, &b) {
		why, reason = fmt.Sprintf("upstream unreachable: blocked internal address %s", b.addr()), egress.ReasonInternal
	}
	http.Error(w, "egress: "+why, http.StatusBadGateway)
	return reason
}

// hopHeaders are stripped from both directions (RFC 9110 7.6.1), with
// whatever Connection names.
var hopHeaders = []string{
	"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate",
	"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade",
}

func stripHop(h http.Header) {
	for _, v := range h.Values("Connection") {
		for _, f := range strings.Split(v, ",") {
			if f = textproto.TrimString(f); f != "" {
				h.Del(f)
			}
		}
	}
	for _, k := range hopHeaders {
		h.Del(k)
	}
}

// forward serves a forward-proxy request.
func (d *door) forward(w http.ResponseWriter, r *http.Request, sb string, known bool) {
	if !r.URL.IsAbs() || (r.URL.Scheme != "http" && r.URL.Scheme != "https") {
		d.s.record(sb, doorHTTP, egress.Decision{Reason: ReasonBadRequest})
		http.Error(w, "egress: proxy requires an absolute-form request URI", http.StatusBadRequest)
		return
	}
	def := uint16(80)
	if r.URL.Scheme == "https" {
		def = 443
	}
	host, port, err := splitHostPort(r.URL.Host, def)
	if err != nil {
		d.s.record(sb, doorHTTP, egress.Decision{Reason: ReasonBadRequest})
		http.Error(w, "egress: bad authority in the request URI", http.StatusBadRequest)
		return
	}
	dec := egress.Decide(d.s.policy(sb, known), host, r.Method, port)
	if !dec.Allow {
		d.s.record(sb, doorHTTP, dec)
		denied(w, host)
		return
	}
	out := r.Clone(r.Context())
	out.RequestURI = ""
	out.Close = false
	if out.Host != "" && !strings.EqualFold(out.Host, r.URL.Host) {
		out.Host = ""
	}
	stripHop(out.Header)
	if d.inject(out, sb, dec.Secret) != "" && echoes(out.Method) {
		d.refuseEcho(w, sb, doorHTTP, host, dec)
		return
	}
	d.roundTrip(w, out, sb, doorHTTP, dec)
}

// refuseEcho refuses a request that would carry an injected secret or
// credential and whose answer echoes it (TRACE, TRACK): 403, as a policy
// refusal, counted as secret_echo.
func (d *door) refuseEcho(w http.ResponseWriter, sb, doorName, host string, dec egress.Decision) {
	dec.Allow, dec.Reason = false, ReasonEcho
	d.s.record(sb, doorName, dec)
	denied(w, host)
}

// inject sets the rule's secret on the request toward the destination and
// returns the header it set ("": none).
func (d *door) inject(r *http.Request, sb, secret string) string {
	if secret == "" {
		return ""
	}
	h, v, ok := d.s.secret(sb, secret)
	if !ok {
		return ""
	}
	r.Header.Set(h, v)
	return http.CanonicalHeaderKey(h)
}

// roundTrip sends out upstream and streams the answer back, counting the
// payload both ways. The decision is recorded once its outcome is known: a
// policy allow that the guard or the network refuses counts as that.
func (d *door) roundTrip(w http.ResponseWriter, out *http.Request, sb, doorName string, dec egress.Decision) {
	f := d.newFlow(sb)
	defer d.endFlow(f)
	if out.Body != nil && out.Body != http.NoBody {
		out.Body = &countingReader{r: out.Body, n: &f.tx}
	}
	resp, err := d.transport.RoundTrip(out)
	if err != nil {
		dec.Allow, dec.Reason = false, unreachable(w, err)
		d.s.record(sb, doorName, dec)
		return
	}
	defer resp.Body.Close()
	d.s.record(sb, doorName, dec)
	stripHop(resp.Header)
	for k, vs := range resp.Header {
		w.Header()[k] = vs
	}
	w.WriteHeader(resp.StatusCode)
	flush := resp.ContentLength < 0
	if ct, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); ct == "text/event-stream" {
		flush = true
	}
	var dst io.Writer = w
	if flush {
		dst = &flushWriter{w: w, rc: http.NewResponseController(w)}
	}
	n, _ := io.Copy(dst, resp.Body)
	f.rx.Add(n)
}

type countingReader struct {
	r io.ReadCloser
	n *atomic.Int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n.Add(int64(n))
	return n, err
}

func (c *countingReader) Close() error { return c.r.Close() }

type flushWriter struct {
	w  io.Writer
	rc *http.ResponseController
}

func (f *flushWriter) Write(p []byte) (int, error) {
	n, err := f.w.Write(p)
	if err == nil {
		_ = f.rc.Flush()
	}
	return n, err
}

// connect serves a CONNECT: refused, spliced, or intercepted.
func (d *door) connect(w http.ResponseWriter, r *http.Request, sb string, known bool) {
	host, port, err := splitHostPort(r.Host, 443)
	if err != nil {
		d.s.record(sb, doorConnect, egress.Decision{Reason: ReasonBadRequest})
		denied(w, r.Host)
		return
	}
	pol := d.s.policy(sb, known)
	// Only a sandbox whose policy intercepts, on a node with a CA, may have
	// its TLS terminated; a credential turns an "inject" rule on.
	t := egress.Tunnel{CanIntercept: d.s.cfg.CA != nil && pol.Intercepts()}
	if t.CanIntercept {
		t.HasCredential = len(d.s.credentials(sb, host)) > 0
	}
	dec := egress.DecideTunnel(pol, host, port, t)
	if !dec.Allow {
		d.s.record(sb, doorConnect, dec)
		denied(w, host)
		return
	}
	if dec.Intercept != egress.InterceptOff {
		d.intercept(w, r, sb, host, port, dec)
		return
	}
	up, err := d.s.dial(r.Context(), host, port)
	if err != nil {
		dec.Allow, dec.Reason = false, unreachable(w, err)
		d.s.record(sb, doorConnect, dec)
		return
	}
	d.s.record(sb, doorConnect, dec)
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		up.Close()
		http.Error(w, "egress: connection cannot be hijacked", http.StatusInternalServerError)
		return
	}
	if !d.track(conn) || !d.track(up) {
		conn.Close()
		up.Close()
		return
	}
	defer d.untrack(conn)
	defer d.untrack(up)
	if _, err := io.WriteString(conn, "HTTP/1.1 200 Connection Established\r\n\r\n"); err != nil {
		conn.Close()
		up.Close()
		return
	}
	f := d.newFlow(sb)
	defer d.endFlow(f)
	// Bytes the guest sent after its CONNECT are in the server's buffer.
	if n := brw.Reader.Buffered(); n > 0 {
		b, _ := brw.Reader.Peek(n)
		m, err := up.Write(b)
		f.tx.Add(int64(m))
		if err != nil {
			conn.Close()
			up.Close()
			return
		}
	}
	splice(conn, up, f)
}

// splice copies both ways until both halves end (half-closing each way),
// counting into f; it closes both connections. The copies run on the
// door's own connection, not its wrapper, so TCP to TCP moves through the
// kernel (splice(2)) instead of a user-space buffer.
func splice(guest, up net.Conn, f *flow) {
	g := guest
	if tc, ok := guest.(*trackedConn); ok {
		if tc.r != nil {
			if n := tc.r.Buffered(); n > 0 {
				b, _ := tc.r.Peek(n)
				m, err := up.Write(b)
				f.tx.Add(int64(m))
				if err != nil {
					guest.Close()
					up.Close()
					return
				}
				_, _ = tc.r.Discard(n)
			}
		}
		g = tc.Conn
	}
	done := make(chan struct{})
	go func() {
		n, _ := io.Copy(up, g)
		f.tx.Add(n)
		_ = closeWrite(up)
		close(done)
	}()
	n, _ := io.Copy(g, up)
	f.rx.Add(n)
	_ = closeWrite(g)
	<-done
	guest.Close()
	up.Close()
}
