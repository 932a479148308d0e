package api_test

import (
	"bufio"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sbxlog/sbxlog/cmd/sandboxd/node"
	"github.com/sbxlog/sbxlog/cmd/sandboxd/node/nodetest"
	"github.com/sbxlog/sbxlog/fsm/engine"
	"github.com/sbxlog/sbxlog/projections/api"
)

// previewNode is a node with a preview listener on a free loopback port.
func previewNode(t *testing.T) *nodetest.Node {
	return newNode(t, 2, func(o *nodetest.Options) {
		o.Tune = func(c *node.Config) { c.PreviewListen = "127.0.0.1:0" }
	})
}

// mintPreview asks for a preview URL of port with token and returns it.
func mintPreview(t *testing.T, n *nodetest.Node, id, token, body string) api.PreviewResponse {
	t.Helper()
	st, b := call(t, n, "POST", "/v1/sandboxes/"+id+"/preview", token, []byte(body))
	var pr api.PreviewResponse
	if st != http.StatusOK || json.Unmarshal(b, &pr) != nil || pr.URL == "" {
		t.Fatalf("preview: %d %s", st, b)
	}
	return pr
}

// getURL GETs u with the given headers and returns status and body.
func getURL(t *testing.T, u string, h map[string]string) (int, string) {
	t.Helper()
	req, err := http.NewRequest("GET", u, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range h {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", u, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// A preview URL reaches the guest's HTTP port (80, silkagent.SimHTTPPort)
// without any other
// credential, strips the preview origin's credentials, is one relay per
// request in the log, and ends with the claim.
func TestPreviewHTTP(t *testing.T) {
	n := previewNode(t)
	c := claimAs(t, n, tokA, "")
	pr := mintPreview(t, n, c.ID, c.Token, `{"port":80}`)
	if !strings.HasPrefix(pr.URL, "http://"+n.PreviewAddr()+"/p/") || !strings.HasSuffix(pr.URL, "/") || pr.ExpiresAt == "" {
		t.Fatalf("preview answer %+v", pr)
	}
	st, body := getURL(t, pr.URL+"a/b%2Fc?x=1", map[string]string{"Cookie": "s=1", "Authorization": "Bearer " + c.Token, "X-Test": "yes"})
	if st != http.StatusOK || !strings.HasPrefix(body, "GET /a/b%2Fc?x=1 HTTP/1.1\n") || !strings.Contains(body, "header: X-Test") {
		t.Fatalf("through the preview: %d %q", st, body)
	}
	if strings.Contains(body, "header: Cookie") || strings.Contains(body, "header: Authorization") {
		t.Fatalf("the preview origin's credentials reached the guest: %q", body)
	}
	waitRelays(t, n, c.ID, 0)
	if got := strings.Join(relayEvents(t, n, c.ID), ","); got != "relay_opened port,relay_closed client" {
		t.Fatalf("relay events %s, want one port relay opened and closed", got)
	}

	// A hibernated sandbox is woken by the next request, which is then
	// served.
	hibernateNow(t, n, c.ID, c.Token)
	if st, body := getURL(t, pr.URL+"after-wake", nil); st != http.StatusOK || !strings.HasPrefix(body, "GET /after-wake HTTP/1.1\n") {
		t.Fatalf("through the preview of a hibernated sandbox: %d %q", st, body)
	}
	waitState(t, n, c.ID, "running")
	waitRelays(t, n, c.ID, 0)

	// The old SDKs' shape: the node's API token in the header, the sandbox
	// token in the body; root may mint for any sandbox.
	mintPreview(t, n, c.ID, tokA, `{"token":"`+c.Token+`","port":80,"ttl_seconds":60}`)
	mintPreview(t, n, c.ID, rootTok, `{"port":80}`)

	for _, tc := range []struct {
		name, token, body string
		want              int
		msg               string
	}{
		{"another tenant", tokB, `{"port":80}`, http.StatusNotFound, "unknown sandbox"},
		{"a wrong sandbox token in the body", tokA, `{"token":"sbt_00","port":80}`, http.StatusNotFound, "unknown sandbox"},
		{"port 0", c.Token, `{"port":0}`, http.StatusBadRequest, "port must be 1-65535"},
		{"port too large", c.Token, `{"port":70000}`, http.StatusBadRequest, "port must be 1-65535"},
		{"negative ttl", c.Token, `{"port":80,"ttl_seconds":-1}`, http.StatusBadRequest, "ttl_seconds"},
		{"unknown field", c.Token, `{"port":80,"host":"x"}`, http.StatusBadRequest, "invalid request body"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, b := call(t, n, "POST", "/v1/sandboxes/"+c.ID+"/preview", tc.token, []byte(tc.body))
			if st != tc.want || !strings.Contains(string(b), tc.msg) {
				t.Fatalf("%d %s, want %d %q", st, b, tc.want, tc.msg)
			}
		})
	}

	// A token that is not the node's, or tampered with, is 403; a port
	// nothing listens on is 502.
	base := "http://" + n.PreviewAddr() + "/p/"
	tok := strings.TrimSuffix(strings.TrimPrefix(pr.URL, base), "/")
	flip := func(i int) string { // tok with its i-th character changed
		b := []byte(tok)
		b[i] = map[bool]byte{true: 'B', false: 'A'}[b[i] == 'A']
		return string(b)
	}
	for _, bad := range []string{"x.y", flip(0), flip(len(tok) - 3), strings.Replace(tok, ".", "", 1)} {
		if st, body := getURL(t, base+bad+"/", nil); st != http.StatusForbidden || !strings.Contains(body, "invalid or expired preview token") {
			t.Fatalf("token %q: %d %s", bad, st, body)
		}
	}
	other := mintPreview(t, n, c.ID, c.Token, `{"port":81}`)
	if st, body := getURL(t, other.URL, nil); st != http.StatusBadGateway || !strings.Contains(body, "preview target unreachable") {
		t.Fatalf("port 81: %d %s", st, body)
	}

	// Released: the URL is 404, as the claim is.
	if st, b := call(t, n, "POST", "/v1/sandboxes/"+c.ID+"/release", c.Token, nil); st != http.StatusNoContent {
		t.Fatalf("release: %d %s", st, b)
	}
	if st, body := getURL(t, pr.URL, nil); st != http.StatusNotFound || !strings.Contains(body, "unknown sandbox") {
		t.Fatalf("after release: %d %s", st, body)
	}
}

// openPreviewWS upgrades a WebSocket through preview URL u of n and returns
// the connection and a reader over it, after the 101.
func openPreviewWS(t *testing.T, n *nodetest.Node, u string) (net.Conn, *bufio.Reader) {
	t.Helper()
	conn, err := net.Dial("tcp", n.PreviewAddr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	// RFC 6455's example key and its accept value.
	if _, err := io.WriteString(conn, "GET "+strings.TrimPrefix(u, "http://"+n.PreviewAddr())+"ws HTTP/1.1\r\nHost: preview\r\n"+
		"Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(conn)
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols || resp.Header.Get("Sec-WebSocket-Accept") != "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=" {
		t.Fatalf("upgrade: %d %v", resp.StatusCode, resp.Header)
	}
	return conn, br
}

// A preview relay through which nothing moves for DataPlane.RelayIdle is
// ended and recorded closed, idle, as a spliced relay is.
func TestPreviewRelayIdle(t *testing.T) {
	n := newNode(t, 1, func(o *nodetest.Options) {
		o.Tune = func(c *node.Config) {
			c.PreviewListen = "127.0.0.1:0"
			c.DataPlane.RelayIdle = 200 * time.Millisecond
		}
	})
	c := claimAs(t, n, tokA, "")
	conn, br := openPreviewWS(t, n, mintPreview(t, n, c.ID, c.Token, `{"port":80}`).URL)
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := br.ReadByte(); !errors.Is(err, io.EOF) {
		t.Fatalf("idle websocket: %v, want EOF", err)
	}
	waitRelays(t, n, c.ID, 0)
	if got := strings.Join(relayEvents(t, n, c.ID), ","); got != "relay_opened port,relay_closed idle" {
		t.Fatalf("relay events %s", got)
	}
}

// A WebSocket goes through the preview: the upgrade reaches the guest, its
// bytes come back, it is one relay open while it lasts, and a release ends
// it (the connection is closed and the relay recorded closed, released).
func TestPreviewWebSocket(t *testing.T) {
	n := previewNode(t)
	c := claimAs(t, n, tokA, "")
	conn, br := openPreviewWS(t, n, mintPreview(t, n, c.ID, c.Token, `{"port":80}`).URL)
	// A masked text frame "hello"; the simulated guest echoes the bytes.
	frame := []byte{0x81, 0x85, 1, 2, 3, 4, 'h' ^ 1, 'e' ^ 2, 'l' ^ 3, 'l' ^ 4, 'o' ^ 1}
	if _, err := conn.Write(frame); err != nil {
		t.Fatal(err)
	}
	back := make([]byte, len(frame))
	if _, err := io.ReadFull(br, back); err != nil || string(back) != string(frame) {
		t.Fatalf("echo %x, %v; want %x", back, err, frame)
	}
	waitRelays(t, n, c.ID, 1)
	if st, b := call(t, n, "POST", "/v1/sandboxes/"+c.ID+"/release", c.Token, nil); st != http.StatusNoContent {
		t.Fatalf("release: %d %s", st, b)
	}
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := br.ReadByte(); !errors.Is(err, io.EOF) {
		t.Fatalf("websocket after release: %v, want EOF", err)
	}
	if got := strings.Join(relayEvents(t, n, c.ID), ","); got != "relay_opened port,relay_closed released" {
		t.Fatalf("relay events %s", got)
	}
}

// Without a preview listener, minting is the old daemon's 501.
func TestPreviewNotConfigured(t *testing.T) {
	n := newNode(t, 1, nil)
	c := claimAs(t, n, rootTok, "")
	st, b := call(t, n, "POST", "/v1/sandboxes/"+c.ID+"/preview", c.Token, []byte(`{"port":80}`))
	if st != http.StatusNotImplemented || !strings.Contains(string(b), "preview not configured") {
		t.Fatalf("%d %s, want 501", st, b)
	}
}

// aheadClock is the system clock moved ahead by a settable offset: the
// node's logic reads it, its timers run on the system's.
type aheadClock struct {
	engine.Clock
	ahead atomic.Int64
}

func (c *aheadClock) Now() time.Time { return c.Clock.Now().Add(time.Duration(c.ahead.Load())) }

// A preview URL stops working at its expiry (403), which ttl_seconds sets
// and the claim's deadline caps.
func TestPreviewExpires(t *testing.T) {
	clock := &aheadClock{Clock: engine.SystemClock()}
	n := newNode(t, 1, func(o *nodetest.Options) {
		o.Tune = func(c *node.Config) {
			c.PreviewListen = "127.0.0.1:0"
			c.Clock = clock
		}
	})
	c := claimAs(t, n, tokA, `,"ttl_seconds":600`)
	short := mintPreview(t, n, c.ID, c.Token, `{"port":80,"ttl_seconds":60}`)
	long := mintPreview(t, n, c.ID, c.Token, `{"port":80,"ttl_seconds":86400}`)
	if lease, exp := c.Deadline, long.ExpiresAt; !strings.HasPrefix(lease, exp[:len(exp)-1]) {
		t.Fatalf("a day's preview expires at %s, want the claim's deadline %s", exp, lease)
	}
	if st, body := getURL(t, short.URL, nil); st != http.StatusOK {
		t.Fatalf("before its expiry: %d %s", st, body)
	}
	clock.ahead.Store(int64(2 * time.Minute))
	if st, body := getURL(t, short.URL, nil); st != http.StatusForbidden || !strings.Contains(body, "invalid or expired preview token") {
		t.Fatalf("after its expiry: %d %s", st, body)
	}
	if st, body := getURL(t, long.URL, nil); st != http.StatusOK {
		t.Fatalf("the longer one: %d %s", st, body)
	}
}
