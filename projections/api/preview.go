package api

import (
	"context"
	"errors"
	"io"
	stdlog "log"
	"net"
	"net/http"
	"net/http/httputil"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sbxlog/sbxlog/fsm"
	"github.com/sbxlog/sbxlog/projections/auth"
	"github.com/sbxlog/sbxlog/projections/relay"
)

// Preview: a URL that reaches an HTTP (or WebSocket) server on a guest port
// without any other credential, as the old daemon's preview had it.
// POST /v1/sandboxes/{id}/preview mints it; the preview listener
// (PreviewHandler, served on its own address) reverse-proxies
// /p/{token}/<path> to the port. The token is signed with the node secret
// and names the sandbox, its token generation, the port and an expiry; it
// is checked on every request against the state, so it ends with the
// claim (released, reaped, failed) and with a token rotation, and never
// outlives the claim's lease as minted. Each request (a WebSocket
// included) reaches the guest over its own connection through the
// agent's port_forward, as GET .../ports/{port} does, and is a relay like
// every data-plane connection: recorded open and closed in the log (kind
// port), waking a hibernated sandbox first, ended by a release.

// PreviewConfig configures preview (DataPlane.Preview).
type PreviewConfig struct {
	// Advertise is the preview listener's address as clients reach it
	// (host:port, or a base URL with a scheme): minted URLs are
	// <Advertise>/p/<token>/. Empty: preview is not configured, and
	// POST .../preview is 501.
	Advertise string
}

// DefaultPreviewTTL is a preview URL's lifetime when the request names none
// (always capped at the claim's lease).
const DefaultPreviewTTL = time.Hour

// The old daemon's texts.
const (
	errPreviewToken       = "invalid or expired preview token"
	errPreviewUnreachable = "preview target unreachable"
	errPreviewOff         = "preview not configured"
)

// PreviewRequest is POST /v1/sandboxes/{id}/preview's body: the old
// daemon's fields. Token, the sandbox token, proves ownership when the
// caller authenticated with the node's API token (the old SDKs send it);
// when given it must be the sandbox's current token.
type PreviewRequest struct {
	Token      string `json:"token,omitempty"`
	Port       int    `json:"port"`
	TTLSeconds int64  `json:"ttl_seconds,omitzero"`
}

// PreviewResponse is its answer.
type PreviewResponse struct {
	URL string `json:"url"`
	// ExpiresAt is when the URL stops working (sbxlog's addition).
	ExpiresAt string `json:"expires_at"`
}

// handlePreview mints a preview URL for a live sandbox's guest port.
func (s *Server) handlePreview(w http.ResponseWriter, r *http.Request, id auth.Identity) error {
	var req PreviewRequest
	if err := decodeBody(r, &req, false); err != nil {
		return err
	}
	if req.Port < 1 || req.Port > 65535 {
		return errorf(http.StatusBadRequest, "port must be 1-65535")
	}
	if req.TTLSeconds < 0 {
		return errorf(http.StatusBadRequest, "ttl_seconds must not be negative")
	}
	c, err := s.visible(r, id)
	if err != nil {
		return err
	}
	gen := tokenGenOf(&c)
	if req.Token != "" && !s.auth.IsSandboxToken(req.Token, c.ID, gen) {
		return errorf(http.StatusNotFound, "%s", errUnknownSandbox)
	}
	if !c.Status.Live() {
		return endedError(&c)
	}
	// Who may ask is answered first: only then whether this node can.
	if s.data.opts.Preview.Advertise == "" {
		return errorf(http.StatusNotImplemented, "%s", errPreviewOff)
	}
	now := s.now()
	ttl := DefaultPreviewTTL
	if req.TTLSeconds > 0 {
		ttl = time.Duration(min(req.TTLSeconds, int64(24*time.Hour/time.Second))) * time.Second
	}
	exp := now.Add(ttl)
	if lease := time.Unix(0, c.Deadline); c.Deadline != 0 && lease.Before(exp) {
		exp = lease // never outlive the claim
	}
	tok := s.auth.PreviewToken(auth.Preview{Sandbox: c.ID, Gen: gen, Port: uint16(req.Port), Expires: exp.Unix()})
	writeJSON(w, http.StatusOK, PreviewResponse{
		URL:       previewBase(s.data.opts.Preview.Advertise) + "/p/" + tok + "/",
		ExpiresAt: exp.UTC().Format(time.RFC3339),
	})
	return nil
}

// previewBase is the URL prefix of Advertise: http:// unless it names a
// scheme, no trailing slash.
func previewBase(adv string) string {
	if !strings.Contains(adv, "://") {
		adv = "http://" + adv
	}
	return strings.TrimRight(adv, "/")
}

// PreviewHandler serves the preview listener: /p/{token}/... proxied to the
// token's guest port, and /healthz. Its requests are bounded like the API's
// (the body guard) and answer errors as {"error": ...}.
func (s *Server) PreviewHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/p/{token}/", s.servePreview)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		_ = s.handleHealthz(w, r, auth.Identity{})
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, errorf(http.StatusNotFound, "no route for %s %s", r.Method, r.URL.Path))
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		guardBody(mux, s.cfg.BodyTimeout, w, r)
	})
}

// servePreview checks the token against the state and proxies the request.
func (s *Server) servePreview(w http.ResponseWriter, r *http.Request) {
	tok := r.PathValue("token")
	p, ok := s.auth.VerifyPreview(tok)
	if !ok || s.now().Unix() > p.Expires {
		writeError(w, errorf(http.StatusForbidden, "%s", errPreviewToken))
		return
	}
	// The token ends with the claim and with its token generation.
	c, found := s.claim(p.Sandbox)
	if !found || !c.Status.Live() || tokenGenOf(&c) != p.Gen {
		writeError(w, errorf(http.StatusNotFound, "%s", errUnknownSandbox))
		return
	}
	prefix := "/p/" + tok
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme, pr.Out.URL.Host = "http", "guest"
			pr.Out.Host = pr.In.Host
			// The path after the token, as the client spelled it.
			pr.Out.URL.Path = "/" + strings.TrimPrefix(strings.TrimPrefix(pr.In.URL.Path, prefix), "/")
			raw := pr.In.URL.EscapedPath()
			if rest, ok := strings.CutPrefix(raw, prefix); ok {
				pr.Out.URL.RawPath = "/" + strings.TrimPrefix(rest, "/")
			} else {
				pr.Out.URL.RawPath = ""
			}
			// The preview origin's credentials are not the guest's.
			pr.Out.Header.Del("Authorization")
			pr.Out.Header.Del("Cookie")
		},
		Transport: s.data.previewTransport(r, p.Sandbox, int(p.Port)),
		// Copy errors mid-answer go to the node's log, not the process's
		// stderr (they never carry the URL, so no token).
		ErrorLog: stdlog.New(s.zl.With().Str("component", "preview").Logger(), "", 0),
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			var ge *guestError
			var oe *net.OpError
			switch {
			case errors.As(err, &ge), errors.As(err, &oe), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
				// Not reached, or it hung up without an answer.
				s.zl.Debug().Err(err).Str("sandbox", p.Sandbox).Msg("api: preview target not reached")
				writeError(w, errorf(http.StatusBadGateway, "%s", errPreviewUnreachable))
			default:
				// Opening the relay failed as a relay's does (unknown
				// sandbox, a wake that failed or timed out, shutdown).
				s.writeErr(w, r, err)
			}
		},
	}
	rp.ServeHTTP(w, r)
}

// previewTransport reaches guest port port of claim for one proxied
// request: one connection per request (no keep-alive: each is a relay the
// log records, and a pooled connection would skip the wake and the
// accounting).
func (d *dataPlane) previewTransport(r *http.Request, claim string, port int) http.RoundTripper {
	return &http.Transport{
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			o, err := d.open(r, claim, fsm.RelayPort, port, false, func(ctx context.Context, vm guestVM) (net.Conn, error) {
				return d.dialPort(ctx, vm, uint16(port))
			})
			if err != nil {
				return nil, err
			}
			rc := &relayConn{Conn: o.guest, d: d, o: o}
			if idle := d.opts.RelayIdle; idle > 0 {
				// As a spliced relay's: nothing moved for that long ends it.
				rc.idle = idle
				rc.timer = time.AfterFunc(idle, func() { rc.stop(relay.ReasonIdle) })
			}
			if reason := o.live.attach(rc.stop); reason != "" {
				rc.stop(reason)
			}
			return rc, nil
		},
	}
}

// relayConn is a preview relay's guest connection: it counts what crosses
// it, ends it after DataPlane.RelayIdle without traffic, and records the
// relay closed, once, when it closes.
type relayConn struct {
	net.Conn
	d       *dataPlane
	o       *opened
	in, out atomic.Int64
	idle    time.Duration
	timer   *time.Timer // nil: no idle limit
	once    sync.Once
	mu      sync.Mutex
	reason  string // set when the log or the node ended it
}

func (c *relayConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.moved(&c.out, n)
	return n, err
}

func (c *relayConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.moved(&c.in, n)
	return n, err
}

// moved counts n bytes in total and restarts the idle clock.
func (c *relayConn) moved(total *atomic.Int64, n int) {
	if n > 0 {
		total.Add(int64(n))
		if c.timer != nil {
			c.timer.Reset(c.idle)
		}
	}
}

// stop ends the relay for reason (a release, a hibernate, a shutdown).
func (c *relayConn) stop(reason string) {
	c.mu.Lock()
	if c.reason == "" {
		c.reason = reason
	}
	c.mu.Unlock()
	_ = c.Close()
}

func (c *relayConn) Close() error {
	if c.timer != nil {
		c.timer.Stop()
	}
	err := c.Conn.Close()
	c.once.Do(func() {
		c.mu.Lock()
		reason := c.reason
		c.mu.Unlock()
		if reason == "" {
			reason = relay.ReasonClient
		}
		c.d.close(c.o, relay.Result{In: c.in.Load(), Out: c.out.Load(), Reason: reason})
	})
	return err
}
