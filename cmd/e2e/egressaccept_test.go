package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sbxlog/sbxlog/executors/egress/netnstest"
	"github.com/sbxlog/sbxlog/executors/egress/nft"
	"github.com/sbxlog/sbxlog/executors/egress/proxy"
)

// The acceptance world's "internet": a namespace on a veth from the host
// namespace (93.184.0.1 there, 93.184.0.10 here) with the upstream HTTP and
// HTTPS servers. sandboxd runs in a mount namespace of its own whose
// /etc/hosts names them, so its proxy resolves names as on a real host.
var (
	inetHost     = netip.MustParsePrefix("93.184.0.1/24")
	upstreamAddr = netip.MustParsePrefix("93.184.0.10/24")
)

const acceptHosts = "127.0.0.1 localhost\n" +
	"93.184.0.10 allowed.e2e.test denied.e2e.test later.e2e.test secret.e2e.test mitm.e2e.test cred.e2e.test\n" +
	"10.77.0.1 internal.e2e.test\n" +
	"169.254.169.254 metadata.e2e.test\n"

// seenRequest is what the upstream received.
type seenRequest struct {
	host   string
	header http.Header
}

// origin is the upstream: it serves the package index (servePackageIndex),
// answers "hello <host>" everywhere else (never echoing what it received)
// and remembers every request.
type origin struct {
	mu   sync.Mutex
	seen []seenRequest
}

func (o *origin) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	o.mu.Lock()
	o.seen = append(o.seen, seenRequest{host: r.Host, header: r.Header.Clone()})
	o.mu.Unlock()
	if servePackageIndex(w, r) {
		return
	}
	fmt.Fprintf(w, "hello %s", strings.Split(r.Host, ":")[0])
}

// last is the last request the upstream got for host.
func (o *origin) last(host string) (http.Header, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for i := len(o.seen) - 1; i >= 0; i-- {
		if strings.Split(o.seen[i].host, ":")[0] == host {
			return o.seen[i].header, true
		}
	}
	return nil, false
}

// guestView keeps everything a guest received: the raw bytes of its
// connections and every answer as its client decoded it.
type guestView struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (g *guestView) add(b []byte) {
	g.mu.Lock()
	g.buf.Write(b)
	g.mu.Unlock()
}

func (g *guestView) bytes() []byte {
	g.mu.Lock()
	defer g.mu.Unlock()
	return bytes.Clone(g.buf.Bytes())
}

type viewConn struct {
	net.Conn
	v *guestView
}

func (c viewConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.v.add(p[:n])
	return n, err
}

// egressGuest is a claimed VM's guest: a client in its namespace whose only
// proxy is its door, one connection per request.
type egressGuest struct {
	ns   *netnstest.NS
	lock nft.State
	hc   *http.Client
	view *guestView
}

func newEgressGuest(t *testing.T, n *egressNode, vm string, i byte, roots *x509.CertPool) *egressGuest {
	t.Helper()
	ns, st := n.guest(t, vm, i)
	g := &egressGuest{ns: ns, lock: st, view: &guestView{}}
	door, _ := url.Parse("http://" + st.Lock.Door.String())
	g.hc = &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		Proxy: http.ProxyURL(door),
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := ns.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return viewConn{c, g.view}, nil
		},
		TLSClientConfig:   &tls.Config{RootCAs: roots},
		DisableKeepAlives: true, // every request is a new connection
	}}
	return g
}

// get sends GET u with hdr and returns the status, the body and the
// answer's TLS issuer ("" on plain HTTP); the decoded answer joins the
// guest's view.
func (g *egressGuest) get(t *testing.T, u string, hdr map[string]string) (int, string, string) {
	t.Helper()
	req, err := http.NewRequest("GET", u, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := g.hc.Do(req)
	if err != nil {
		t.Fatalf("GET %s from the guest: %v", u, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var decoded bytes.Buffer
	_ = resp.Header.Write(&decoded)
	decoded.Write(b)
	g.view.add(decoded.Bytes())
	issuer := ""
	if resp.TLS != nil {
		issuer = resp.TLS.PeerCertificates[0].Issuer.CommonName
	}
	return resp.StatusCode, string(b), issuer
}

// connect sends a CONNECT for authority to the door and returns the status.
func (g *egressGuest) connect(t *testing.T, authority string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := g.ns.DialContext(ctx, "tcp", g.lock.Lock.Door.String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", authority, authority)
	resp, err := http.ReadResponse(bufio.NewReader(viewConn{c, g.view}), nil)
	if err != nil {
		t.Fatalf("CONNECT %s: %v", authority, err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// direct tries a connection to addr that bypasses the proxy.
func (g *egressGuest) direct(addr string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	c, err := g.ns.DialContext(ctx, "tcp", addr)
	if err == nil {
		c.Close()
	}
	return err == nil
}

// acceptWorld is the acceptance tests' world: sandboxd (in the host
// namespace, its /etc/hosts naming the upstream) with its egress lane, and
// the "internet" namespace beside it holding the upstream's HTTP and HTTPS
// servers, whose certificates the upstream CA signs (sandboxd trusts it).
type acceptWorld struct {
	n    *egressNode
	up   *origin
	upCA *proxy.CA
}

func startAcceptanceWorld(t *testing.T, o egressNodeOpts) acceptWorld {
	t.Helper()
	netnstest.Require(t)
	dir := t.TempDir()
	hostsFile := filepath.Join(dir, "hosts")
	if err := os.WriteFile(hostsFile, []byte(acceptHosts), 0o644); err != nil {
		t.Fatal(err)
	}
	upCA, err := proxy.NewCA("e2e upstream CA")
	if err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(dir, "upstream-ca.pem")
	if err := os.WriteFile(caFile, upCA.PEM(), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("SSL_CERT_FILE", caFile)
	o.wrap = []string{"unshare", "--mount", "--propagation", "private", "--",
		"sh", "-c", `mount --bind "$0" /etc/hosts && exec "$@"`, hostsFile}
	n := startEgressNodeWith(t, o)
	inet := n.lane.Internet(t, inetHost, upstreamAddr)
	up := &origin{}
	for _, port := range []string{"80", "443"} {
		ln, err := inet.Listen("tcp", net.JoinHostPort(upstreamAddr.Addr().String(), port))
		if err != nil {
			t.Fatal(err)
		}
		if port == "443" {
			ln = tls.NewListener(ln, &tls.Config{GetCertificate: func(h *tls.ClientHelloInfo) (*tls.Certificate, error) { return upCA.Leaf(h.ServerName) }})
		}
		hs := &http.Server{Handler: up}
		go hs.Serve(ln)
		t.Cleanup(func() { hs.Close() })
	}
	return acceptWorld{n: n, up: up, upCA: upCA}
}

// TestEgressAcceptance is issue 18's acceptance 1, 3 and 4 against the
// built sandboxd (chsim, embedded NATS with its journals, the egress
// proxy with the node CA, every egress tap locked by nftables), from
// client namespaces standing for the guests of two claimed egress VMs:
// a root claim (the pool's policy) with host-only env, and a tenant's
// (the pool's policy composed with its egress class).
//
//  1. the allowed host answers through the proxy (HTTP forward, a spliced
//     CONNECT); a denied host is 403 "egress denied: <host>"; 10.0.0.0/8,
//     169.254.169.254, the host's API port and a name resolving to an
//     internal address, all allowed by the policy, are 502 "egress:
//     upstream unreachable: blocked internal address ..."; direct
//     connections that bypass the proxy fail and the tap's drop counter
//     moves;
//  3. PUT /v1/pools (a pool's egress) and PUT /v1/egress/classes/{name}
//     apply to the next connection, within 1 s;
//  4. the claim's host-only value of a registry secret reaches the
//     upstream as the secret's header (forward HTTP, and inside a tunnel
//     intercepted with the node CA), a claim credential as its inject
//     header, the node's value where the claim has none; none of the
//     values is in anything the guests received, in GET env, in the
//     daemon's log or, in the clear, in any file of the data dir; the decisions are counted (/metrics) and the
//     bytes aggregated into a few egress_bytes usage records, not one per
//     request.
func TestEgressAcceptance(t *testing.T) {
	netnstest.Require(t)
	const (
		nodeTok  = "node-egress-token-5c1e8b27d4"
		claimTok = "claim-egress-token-9a0f3d61be"
		credVal  = "claim-credential-e27b45c90a"
		acmeTok  = "e2e-egress-acme-token"
	)
	secrets := map[string]string{"node": nodeTok, "claim": claimTok, "credential": credVal}
	t.Setenv("E2E_EGRESS_TOKEN", nodeTok)
	rule := func(host string, kv ...any) map[string]any {
		r := map[string]any{"host": host}
		for i := 0; i < len(kv); i += 2 {
			r[kv[i].(string)] = kv[i+1]
		}
		return r
	}
	poolAllow := []any{
		rule("allowed.e2e.test"),
		rule("secret.e2e.test", "secret", "tok"),
		rule("mitm.e2e.test", "secret", "tok", "intercept", true),
		rule("cred.e2e.test", "intercept", "inject"),
		rule("internal.e2e.test"), rule("metadata.e2e.test"),
		rule("10.1.2.3"), rule("169.254.169.254"), rule("10.77.0.1"),
	}
	pool := func(allow []any) map[string]any {
		return map[string]any{"template": "default", "net": "egress", "size": "small", "warm": 3, "egress": map[string]any{"allow": allow}}
	}
	w := startAcceptanceWorld(t, egressNodeOpts{cfg: map[string]any{
		"egress_proxy":   map[string]any{"intercept": true},
		"secrets":        []any{map[string]any{"name": "tok", "header": "Authorization", "value_env": "E2E_EGRESS_TOKEN"}},
		"pools":          []any{pool(poolAllow)},
		"egress_classes": []any{map[string]any{"name": "desk", "egress": map[string]any{"allow": []any{rule("allowed.e2e.test")}}}},
		"tenants":        []any{map[string]any{"name": "acme", "token": acmeTok, "egress_class": "desk"}},
		"nats":           nil, // embedded, with the audit and usage journals
	}})
	n, up, upCA := w.n, w.up, w.upCA
	data := filepath.Join(n.dir, "data")

	// The API, as root and as the tenant (from the host namespace).
	call := func(token, method, path, body string, want int) []byte {
		t.Helper()
		return apiCall(t, n.hc, n.apiAddr, token, method, path, body, want)
	}
	type claimAnswer struct {
		ID, Token, VM string
		NetRoute      string `json:"net_route"`
	}
	claim := func(token, body string) claimAnswer {
		t.Helper()
		var ca claimAnswer
		if err := json.Unmarshal(call(token, "POST", "/v1/claim", body, http.StatusOK), &ca); err != nil || ca.ID == "" {
			t.Fatalf("claim: %v", err)
		}
		return ca
	}
	deadline := time.Now().Add(30 * time.Second)
	for len(n.taps(t)) < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("no 3 warm egress VMs after 30 s: taps %v", n.taps(t))
		}
		time.Sleep(50 * time.Millisecond)
	}
	a := claim("root", `{"template":"default","net":"egress","size":"small","env":{`+
		`"E2E_EGRESS_TOKEN":{"value":"`+claimTok+`","guest":false},`+
		`"API_KEY":{"value":"`+credVal+`","guest":false,"inject":{"hosts":["cred.e2e.test"],"header":"X-Api-Key"}},`+
		`"MODE":{"value":"guest-visible"}}}`)
	b := claim(acmeTok, `{"template":"default","net":"egress","size":"small"}`)
	for _, c := range []claimAnswer{a, b} {
		if c.NetRoute != "relay" {
			t.Fatalf("claim %s: net_route %q, want relay (the proxy is its only way out)", c.ID, c.NetRoute)
		}
	}
	nodeCA, err := os.ReadFile(filepath.Join(data, "egress-ca", "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	roots := upCA.Pool()
	if !roots.AppendCertsFromPEM(nodeCA) {
		t.Fatal("the node CA does not parse")
	}
	ga := newEgressGuest(t, n, a.VM, 50, roots)
	gb := newEgressGuest(t, n, b.VM, 51, roots)

	// 1. The allowed host, forward and through a spliced tunnel.
	if st, body, _ := ga.get(t, "http://allowed.e2e.test/", nil); st != 200 || body != "hello allowed.e2e.test" {
		t.Fatalf("allowed host: %d %q", st, body)
	}
	if st, body, issuer := ga.get(t, "https://allowed.e2e.test/", nil); st != 200 || body != "hello allowed.e2e.test" || issuer != "e2e upstream CA" {
		t.Fatalf("allowed host over CONNECT: %d %q (issuer %q)", st, body, issuer)
	}
	// A denied host.
	if st, body, _ := ga.get(t, "http://denied.e2e.test/", nil); st != 403 || strings.TrimSpace(body) != "egress denied: denied.e2e.test" {
		t.Fatalf("denied host: %d %q", st, body)
	}
	if st := ga.connect(t, "denied.e2e.test:443"); st != 403 {
		t.Fatalf("CONNECT to a denied host: %d", st)
	}
	// Internal destinations the policy allows: the guard refuses them.
	for _, c := range []struct{ url, ip string }{
		{"http://10.1.2.3/", "10.1.2.3"},
		{"http://169.254.169.254/latest/meta-data/", "169.254.169.254"},
		{"http://10.77.0.1:7777/healthz", "10.77.0.1"}, // the host's API port
		{"http://internal.e2e.test/", "10.77.0.1"},     // a name resolving to the host
		{"http://metadata.e2e.test/", "169.254.169.254"},
	} {
		st, body, _ := ga.get(t, c.url, nil)
		if want := "egress: upstream unreachable: blocked internal address " + c.ip; st != 502 || strings.TrimSpace(body) != want {
			t.Fatalf("%s: %d %q, want 502 %q", c.url, st, body, want)
		}
	}
	if st := ga.connect(t, "10.77.0.1:7777"); st != 502 {
		t.Fatalf("CONNECT to the host's API port: %d, want 502", st)
	}
	// Direct traffic, bypassing the proxy: dropped at the tap.
	dropped := func() uint64 {
		s, ok := n.locks(t)[n.tapOf(t, a.VM)]
		if !ok || !s.OK {
			t.Fatalf("the lock of %s: %+v", a.VM, s)
		}
		return s.Counters.Dropped().Packets
	}
	before := dropped()
	for _, addr := range []string{"93.184.0.10:80", "93.184.0.10:443", n.apiAddr, "169.254.169.254:80", "10.1.2.3:80"} {
		if ga.direct(addr) {
			t.Fatalf("a direct connection from the guest to %s succeeded", addr)
		}
	}
	if after := dropped(); after <= before {
		t.Fatalf("the tap's drop counter did not move (%d -> %d)", before, after)
	}

	// 3. A pool's egress changed over the API: the next connection.
	if st, _, _ := ga.get(t, "http://later.e2e.test/", nil); st != 403 {
		t.Fatalf("later.e2e.test before the change: %d", st)
	}
	pools, _ := json.Marshal(map[string]any{"pools": []any{pool(append(poolAllow[:len(poolAllow):len(poolAllow)], rule("later.e2e.test")))}})
	t0 := time.Now()
	call("root", "PUT", "/v1/pools", string(pools), http.StatusOK)
	if st, body, _ := ga.get(t, "http://later.e2e.test/", nil); st != 200 || body != "hello later.e2e.test" {
		t.Fatalf("the first connection after PUT /v1/pools: %d %q", st, body)
	}
	if d := time.Since(t0); d > time.Second {
		t.Fatalf("PUT /v1/pools took %s to apply to the next connection, want within 1 s", d)
	}
	// The tenant's class narrows the pool: secret.e2e.test is the pool's,
	// not the class's, until the class names it.
	if st, _, _ := gb.get(t, "http://allowed.e2e.test/", nil); st != 200 {
		t.Fatalf("tenant, allowed by pool and class: %d", st)
	}
	if st, _, _ := gb.get(t, "http://secret.e2e.test/", nil); st != 403 {
		t.Fatalf("tenant, allowed by the pool only: %d, want 403", st)
	}
	t0 = time.Now()
	call("root", "PUT", "/v1/egress/classes/desk", `{"egress":{"allow":[{"host":"allowed.e2e.test"},{"host":"secret.e2e.test"}]}}`, http.StatusNoContent)
	if st, body, _ := gb.get(t, "http://secret.e2e.test/", nil); st != 200 || body != "hello secret.e2e.test" {
		t.Fatalf("the first connection after PUT /v1/egress/classes/desk: %d %q", st, body)
	}
	if d := time.Since(t0); d > time.Second {
		t.Fatalf("PUT /v1/egress/classes took %s to apply to the next connection, want within 1 s", d)
	}
	// The tenant's claim has no value of its own: the node's is injected.
	if h, _ := up.last("secret.e2e.test"); h.Get("Authorization") != nodeTok {
		t.Fatalf("tenant: upstream got Authorization %q, want the node's value", h.Get("Authorization"))
	}
	if st, _, _ := gb.get(t, "http://later.e2e.test/", nil); st != 403 {
		t.Fatalf("tenant, a host its class does not name: %d", st)
	}

	// 4. The claim's host-only value reaches the upstream as the header.
	if st, _, _ := ga.get(t, "http://secret.e2e.test/", map[string]string{"Authorization": "guest-supplied"}); st != 200 {
		t.Fatalf("secret host: %d", st)
	}
	if h, _ := up.last("secret.e2e.test"); h.Get("Authorization") != claimTok {
		t.Fatalf("forward: upstream got Authorization %q, want the claim's host-only value", h.Get("Authorization"))
	}
	if st, _, issuer := ga.get(t, "https://mitm.e2e.test/", nil); st != 200 || issuer != "sbxlog egress CA" {
		t.Fatalf("intercepted host: %d, issuer %q", st, issuer)
	}
	if h, _ := up.last("mitm.e2e.test"); h.Get("Authorization") != claimTok {
		t.Fatalf("intercepted: upstream got Authorization %q, want the claim's host-only value", h.Get("Authorization"))
	}
	if st, _, issuer := ga.get(t, "https://cred.e2e.test/", nil); st != 200 || issuer != "sbxlog egress CA" {
		t.Fatalf("credential host: %d, issuer %q (want intercepted with the node CA)", st, issuer)
	}
	if h, _ := up.last("cred.e2e.test"); h.Get("X-Api-Key") != credVal {
		t.Fatalf("credential: upstream got X-Api-Key %q", h.Get("X-Api-Key"))
	}
	// GET env (an operator's) hides the host-only values.
	env := string(call("root", "GET", "/v1/sandboxes/"+a.ID+"/env", "", http.StatusOK))
	if !strings.Contains(env, `"MODE":{"value":"guest-visible"}`) || !strings.Contains(env, `"E2E_EGRESS_TOKEN":{"value":"","guest":false}`) {
		t.Fatalf("GET env: %s", env)
	}
	// Counted: the decisions by door and reason.
	metrics := string(call("root", "GET", "/metrics", "", http.StatusOK))
	for _, want := range []string{
		`sbx_egress_decisions_total{decision="allow",door="http",reason=""}`,
		`sbx_egress_decisions_total{decision="deny",door="http",reason="no_rule"}`,
		`sbx_egress_decisions_total{decision="deny",door="http",reason="internal"}`,
		`sbx_egress_decisions_total{decision="allow",door="inner",reason=""}`,
		`sbx_egress_decisions_total{decision="deny",door="connect",reason="internal"}`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics has no %s", want)
		}
	}
	// Released: the claim's egress is aggregated in its usage records.
	call("root", "POST", "/v1/sandboxes/"+a.ID+"/release", "", http.StatusNoContent)
	var records []map[string]any
	deadline = time.Now().Add(15 * time.Second)
	for {
		records = records[:0]
		raw, _ := os.ReadFile(filepath.Join(data, "usage.jsonl"))
		final := false
		for _, line := range bytes.Split(raw, []byte("\n")) {
			var r map[string]any
			if json.Unmarshal(line, &r) == nil && r["ev"] == "egress_bytes" && r["id"] == a.ID {
				records = append(records, r)
				final = final || r["final"] == true
			}
		}
		if final {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no final egress_bytes record of %s in usage.jsonl after 15 s: %v", a.ID, records)
		}
		time.Sleep(100 * time.Millisecond)
	}
	var sum [4]float64 // tx, rx, allowed, denied
	for _, r := range records {
		for i, k := range []string{"tx", "rx", "allowed", "denied"} {
			v, _ := r[k].(float64)
			sum[i] += v
		}
	}
	t.Logf("egress_bytes records of the released claim: %v", records)
	if len(records) > 3 || sum[0] == 0 || sum[1] == 0 || sum[2] < 8 || sum[3] < 8 {
		t.Fatalf("egress_bytes records of %s: %v (want a few aggregating every request)", a.ID, records)
	}

	// Nowhere in what the guests received, the daemon's log or the data dir.
	for name, s := range secrets {
		for _, g := range []*egressGuest{ga, gb} {
			if bytes.Contains(g.view.bytes(), []byte(s)) {
				t.Errorf("a guest received the %s secret", name)
			}
		}
		if strings.Contains(env, s) {
			t.Errorf("GET env shows the %s secret", name)
		}
	}
	n.daemon.stop(t)
	grepDataDir(t, data, secrets)
	for name, s := range secrets {
		if strings.Contains(n.daemon.stderr.String(), s) {
			t.Errorf("the daemon's log holds the %s secret", name)
		}
	}
	if len(ga.view.bytes()) == 0 || len(gb.view.bytes()) == 0 {
		t.Fatal("the guests' views recorded nothing")
	}
}
