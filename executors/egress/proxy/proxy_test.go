package proxy

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"errors"
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
	"sync/atomic"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/sbxlog/sbxlog/executors/egress/netnstest"
	"github.com/sbxlog/sbxlog/executors/egress/nft"
	"github.com/sbxlog/sbxlog/executors/guest/agent"
	"github.com/sbxlog/sbxlog/executors/netguard"
	"github.com/sbxlog/sbxlog/fsm/egress"
)

const (
	testVM      = "vm-0000000000000001"
	testSandbox = "sb_0000000000000001"
	testSecret  = "s3cr3t-h0st-only-value"
)

// The test's "internet": an upstream on a public-looking address on the host
// namespace's loopback; names resolve through a fixed table.
var (
	upstreamIP = netip.MustParseAddr("93.184.0.10")
	// upstream6 is a public-looking IPv6 upstream, on the host namespace's
	// loopback for the tests that add it; hostGlobal6 a global address
	// of the host's own (the guard knows it).
	upstream6   = netip.MustParseAddr("2606:4700::10")
	hostGlobal6 = netip.MustParseAddr("2a01:4f8::1")
	names       = map[string][]netip.Addr{
		"api.example.test":      {upstreamIP},
		"evil.example.test":     {upstreamIP},
		"late.example.test":     {upstreamIP},
		"secret.example.test":   {upstreamIP},
		"plain.example.test":    {upstreamIP},
		"rebind.example.test":   {netip.MustParseAddr("10.0.0.7")},
		"mixed.example.test":    {netip.MustParseAddr("10.0.0.8"), upstreamIP},
		"metadata.example.test": {netip.MustParseAddr("169.254.169.254")},
	}
)

// upstream is the destination server: it answers "hello <host>" and
// remembers the headers each request arrived with.
type upstream struct {
	mu   sync.Mutex
	seen []http.Header
	ca   *CA
}

func (u *upstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	u.mu.Lock()
	u.seen = append(u.seen, r.Header.Clone())
	u.mu.Unlock()
	fmt.Fprintf(w, "hello %s", r.Host)
}

func (u *upstream) last() http.Header {
	u.mu.Lock()
	defer u.mu.Unlock()
	if len(u.seen) == 0 {
		return nil
	}
	return u.seen[len(u.seen)-1]
}

type env struct {
	lane   *netnstest.Lane
	guest  *netnstest.Guest
	door   netip.AddrPort
	pol    *fakePolicies
	meter  *fakeMeter
	srv    *Server
	ca     *CA
	up     *upstream
	roots  *x509.CertPool // the guest's trust: the upstream's CA and the node CA
	apiURL string         // a host service the guest must not reach (the API port)
}

func newEnv(t *testing.T) *env {
	t.Helper()
	e := &env{lane: netnstest.NewLane(t), pol: newFakePolicies(), meter: newFakeMeter()}
	e.guest = e.lane.AddGuest(t, 1, "sbxtestproxy01", net.HardwareAddr{0x02, 1, 2, 3, 4, 5})
	e.door = netip.AddrPortFrom(e.lane.HostAddr, 20001)
	// The guard knows the host's own addresses: the bridge's and another.
	guard, err := netguard.New(nil, []netip.Addr{e.lane.HostAddr, upstreamIP.Next(), hostGlobal6})
	if err != nil {
		t.Fatal(err)
	}
	e.pol.sandboxOf[testVM] = testSandbox
	e.pol.secrets["gh"] = [2]string{"Authorization", "Bearer " + testSecret}

	// The upstream, plain and TLS.
	e.lane.Host.MustDo(t, func() error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		return netlink.AddrAdd(lo, &netlink.Addr{IPNet: &net.IPNet{IP: upstreamIP.AsSlice(), Mask: net.CIDRMask(32, 32)}})
	})
	upCA, err := NewCA("test upstream CA")
	if err != nil {
		t.Fatal(err)
	}
	e.up = &upstream{ca: upCA}
	serve := func(addr string, tlsOn bool) {
		ln, err := e.lane.Host.Listen("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		if tlsOn {
			ln = tls.NewListener(ln, &tls.Config{GetCertificate: func(h *tls.ClientHelloInfo) (*tls.Certificate, error) { return upCA.Leaf(h.ServerName) }})
		}
		hs := &http.Server{Handler: e.up}
		go hs.Serve(ln)
		t.Cleanup(func() { hs.Close() })
	}
	serve(upstreamIP.String()+":80", false)
	serve(upstreamIP.String()+":443", true)
	// A host service on the bridge address: the API port stand-in.
	serve(e.lane.HostAddr.String()+":8080", false)
	e.apiURL = "http://" + e.lane.HostAddr.String() + ":8080/"

	// The node: CA, proxy, the tap's lock.
	if e.ca, err = NewCA("test node CA"); err != nil {
		t.Fatal(err)
	}
	e.srv = New(Config{
		Policies: e.pol, Meter: e.meter, Guard: guard, CA: e.ca, RootCAs: upCA.Pool(), DialIn: e.lane.Host.Do, Timeout: 3 * time.Second,
		Lookup: func(_ context.Context, host string) ([]netip.Addr, error) {
			if a, ok := names[host]; ok {
				return a, nil
			}
			return nil, errors.New("no such host")
		},
	})
	t.Cleanup(e.srv.Close)
	e.lane.Host.MustDo(t, func() error { return e.srv.Open(testVM, Doors{TCP: e.door}) })
	lock := nft.Lock{Tap: e.guest.Tap, GuestMAC: e.guest.MAC, GuestIP: e.guest.Addr, Door: e.door, DoorMAC: e.lane.BridgeMAC(t)}
	e.lane.Host.MustDo(t, func() error { return nft.OwnerOf("i-proxytest").Install(lock) })

	e.roots = upCA.Pool()
	e.roots.AddCert(e.ca.cert)
	return e
}

// recorder keeps every byte the guest received.
type recorder struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

type recConn struct {
	net.Conn
	r *recorder
}

func (c recConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.r.mu.Lock()
	c.r.buf.Write(p[:n])
	c.r.mu.Unlock()
	return n, err
}

// client is the guest's HTTP client through its door; rec, when set,
// records what it receives.
func (e *env) client(rec *recorder) *http.Client {
	proxyURL, _ := url.Parse("http://" + e.door.String())
	return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		Proxy: http.ProxyURL(proxyURL),
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := e.guest.DialContext(ctx, network, addr)
			if err == nil && rec != nil {
				c = recConn{c, rec}
			}
			return c, err
		},
		TLSClientConfig:   &tls.Config{RootCAs: e.roots},
		DisableKeepAlives: true,
	}}
}

func get(t *testing.T, c *http.Client, u string) (int, string) {
	t.Helper()
	resp, err := c.Get(u)
	if err != nil {
		t.Fatalf("GET %s: %v", u, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func (e *env) dropped(t *testing.T) uint64 {
	t.Helper()
	var st nft.State
	e.lane.Host.MustDo(t, func() error {
		var err error
		st, err = nft.OwnerOf("i-proxytest").Inspect(e.guest.Tap)
		return err
	})
	if !st.OK {
		t.Fatalf("lock not OK: %s", st.Problem)
	}
	return st.Counters.Dropped().Packets
}

// TestGuestEgress is acceptance 1 from a client in the guest's namespace:
// the allowed host through the proxy, the documented refusals, and direct
// traffic dropped by the tap's lock with its counter moving.
func TestGuestEgress(t *testing.T) {
	e := newEnv(t)
	e.pol.setRules(testSandbox,
		rule{host: "api.example.test"}, rule{host: "rebind.example.test"}, rule{host: "mixed.example.test"},
		rule{host: "metadata.example.test"}, rule{host: "10.1.2.3"}, rule{host: "169.254.169.254"},
		rule{host: e.lane.HostAddr.String()})
	c := e.client(nil)

	if st, body := get(t, c, "http://api.example.test/x"); st != 200 || body != "hello api.example.test" {
		t.Fatalf("allowed host: %d %q", st, body)
	}
	if st, body := get(t, c, "https://api.example.test/x"); st != 200 || body != "hello api.example.test" {
		t.Fatalf("allowed host over CONNECT: %d %q", st, body)
	}
	// A name with an internal and a public address reaches the public one.
	if st, _ := get(t, c, "http://mixed.example.test/"); st != 200 {
		t.Fatalf("mixed-address host: %d", st)
	}
	if st, body := get(t, c, "http://evil.example.test/"); st != 403 || body != "egress denied: evil.example.test\n" {
		t.Fatalf("denied host: %d %q", st, body)
	}
	// Allowed by the policy, refused by the guard: 502 with the reason.
	for _, u := range []string{"http://10.1.2.3/", "http://169.254.169.254/latest/meta-data/", e.apiURL, "http://rebind.example.test/", "http://metadata.example.test/"} {
		st, body := get(t, c, u)
		if st != 502 || !strings.HasPrefix(body, "egress: upstream unreachable: blocked internal address") {
			t.Fatalf("%s: %d %q, want 502 blocked internal address", u, st, body)
		}
	}
	// Not in the policy at all: the policy's 403 comes first.
	e.pol.setRules(testSandbox, rule{host: "api.example.test"})
	for _, u := range []string{"http://10.9.9.9/", "http://169.254.169.254/"} {
		if st, _ := get(t, c, u); st != 403 {
			t.Fatalf("%s without a rule: %d, want 403", u, st)
		}
	}
	// A CONNECT to an internal address is refused the same way.
	e.pol.setRules(testSandbox, rule{host: "*"})
	if _, err := c.Get("https://10.1.2.3/"); err == nil || !strings.Contains(err.Error(), "Bad Gateway") {
		t.Fatalf("CONNECT to an internal address: %v, want 502", err)
	}

	// Direct traffic bypassing the proxy: dropped by nft, counted.
	before := e.dropped(t)
	for _, a := range []string{upstreamIP.String() + ":80", e.lane.HostAddr.String() + ":8080", "169.254.169.254:80"} {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		conn, err := e.guest.DialContext(ctx, "tcp", a)
		cancel()
		if err == nil {
			conn.Close()
			t.Fatalf("direct connection to %s succeeded", a)
		}
	}
	if after := e.dropped(t); after <= before {
		t.Fatalf("drop counter %d -> %d: the bypass attempts did not move it", before, after)
	}

	counts := map[string]uint64{}
	for _, c := range e.srv.Counts() {
		counts[c.Door+" "+c.Outcome] = c.N
	}
	if counts["http allow"] == 0 || counts["http no_rule"] == 0 || counts["http internal"] == 0 || counts["connect allow"] == 0 || counts["connect internal"] == 0 {
		t.Fatalf("decision counts %v", counts)
	}
}

// TestPolicyChangeNextConnection: acceptance 3's proxy half: a change of the
// sandbox's policy applies to the next connection, well within 1 s.
func TestPolicyChangeNextConnection(t *testing.T) {
	e := newEnv(t)
	c := e.client(nil)
	e.pol.setRules(testSandbox, rule{host: "api.example.test"})
	if st, _ := get(t, c, "http://late.example.test/"); st != 403 {
		t.Fatalf("before: %d", st)
	}
	e.pol.setRules(testSandbox, rule{host: "api.example.test"}, rule{host: "late.example.test"})
	changed := time.Now()
	for {
		st, _ := get(t, c, "http://late.example.test/")
		if st == 200 {
			break
		}
		if time.Since(changed) > time.Second {
			t.Fatalf("policy change not applied within 1 s (last %d)", st)
		}
		time.Sleep(10 * time.Millisecond)
	}
	e.pol.setRules(testSandbox)
	if st, _ := get(t, c, "http://late.example.test/"); st != 403 {
		t.Fatalf("after removal: %d", st)
	}
	// A VM that serves no sandbox (warm) is refused.
	e.pol.mu.Lock()
	delete(e.pol.sandboxOf, testVM)
	e.pol.mu.Unlock()
	if st, _ := get(t, c, "http://api.example.test/"); st != 403 {
		t.Fatalf("warm VM: %d", st)
	}
	// Its refusal is counted, but the meter hears of no sandbox "".
	e.meter.mu.Lock()
	defer e.meter.mu.Unlock()
	for _, d := range e.meter.decisions {
		if !strings.HasPrefix(d, testSandbox+" ") {
			t.Fatalf("meter decisions %v", e.meter.decisions)
		}
	}
	counts := map[string]uint64{}
	for _, c := range e.srv.Counts() {
		counts[c.Door+" "+c.Outcome] = c.N
	}
	if counts["http no_policy"] != 1 {
		t.Fatalf("decision counts %v", counts)
	}
}

// TestSecretInjection is acceptance 4's proxy half: the host-held secret
// reaches the upstream as the rule's header, over plain forward and an
// intercepted CONNECT, and is nowhere in what the guest receives.
func TestSecretInjection(t *testing.T) {
	e := newEnv(t)
	e.pol.setRules(testSandbox,
		rule{host: "plain.example.test", secret: "gh"},
		rule{host: "secret.example.test", secret: "gh", intercept: egress.InterceptAlways},
		rule{host: "api.example.test", secret: "gh"})
	rec := &recorder{}
	c := e.client(rec)
	want := "Bearer " + testSecret
	for _, u := range []string{"http://plain.example.test/", "https://secret.example.test/"} {
		req, _ := http.NewRequest("GET", u, nil)
		req.Header.Set("Authorization", "guest-supplied")
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var seen bytes.Buffer
		_ = resp.Header.Write(&seen)
		io.Copy(&seen, resp.Body)
		resp.Body.Close()
		if bytes.Contains(seen.Bytes(), []byte(testSecret)) {
			t.Fatalf("%s: the secret is in the answer the guest decoded", u)
		}
		if resp.StatusCode != 200 {
			t.Fatalf("%s: %d", u, resp.StatusCode)
		}
		if got := e.up.last().Get("Authorization"); got != want {
			t.Fatalf("%s: upstream got Authorization %q, want the secret", u, got)
		}
		if resp.TLS != nil && resp.TLS.PeerCertificates[0].Issuer.CommonName != "test node CA" {
			t.Fatalf("%s: intercepted with a leaf of %q", u, resp.TLS.PeerCertificates[0].Issuer.CommonName)
		}
	}
	// A spliced tunnel injects nothing (the rule's secret needs intercept).
	if st, _ := get(t, c, "https://api.example.test/"); st != 200 || e.up.last().Get("Authorization") != "" {
		t.Fatalf("spliced tunnel: %d, upstream Authorization %q", st, e.up.last().Get("Authorization"))
	}
	// The guest saw plaintext responses and TLS it could decrypt only with
	// the node CA's leaf; check what it decrypted too.
	rec.mu.Lock()
	raw := rec.buf.Bytes()
	rec.mu.Unlock()
	if bytes.Contains(raw, []byte(testSecret)) {
		t.Fatal("the secret reached the guest")
	}
	if len(raw) == 0 {
		t.Fatal("recorded nothing")
	}
}

// TestClaimCredentials: an "inject" rule splices a host for a claim
// without a credential for it and intercepts it for a claim with one,
// whose header credential then reaches the upstream (one with a
// placeholder only where the guest sent the placeholder; none over the
// rule's secret's header); the guest receives neither value.
func TestClaimCredentials(t *testing.T) {
	e := newEnv(t)
	e.pol.setRules(testSandbox,
		rule{host: "api.example.test", intercept: egress.InterceptInject},
		rule{host: "secret.example.test", secret: "gh", intercept: egress.InterceptAlways})
	const cred, other = "claim-cred-4f1d9a", "claim-cred-placeholder-77c2"
	rec := &recorder{}
	c := e.client(rec)
	do := func(u string, hdr map[string]string) *http.Response {
		t.Helper()
		req, _ := http.NewRequest("GET", u, nil)
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatalf("GET %s: %v", u, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp
	}
	// No credential: the inject rule splices (the upstream's own leaf).
	if resp := do("https://api.example.test/", nil); resp.StatusCode != 200 || resp.TLS.PeerCertificates[0].Issuer.CommonName != "test upstream CA" {
		t.Fatalf("without a credential: %d, issuer %q", resp.StatusCode, resp.TLS.PeerCertificates[0].Issuer.CommonName)
	}
	e.pol.mu.Lock()
	e.pol.creds[testSandbox] = []egress.Credential{
		{Name: "API_KEY", Value: cred, Inject: egress.EnvInject{Hosts: []string{"api.example.test"}, Header: "X-Api-Key"}},
		{Name: "GH_OVER", Value: "must-not-win", Inject: egress.EnvInject{Hosts: []string{"secret.example.test"}, Header: "Authorization"}},
		{Name: "TOKEN", Value: other, Inject: egress.EnvInject{Hosts: []string{"*.example.test"}, Header: "X-Token", Placeholder: "SBX_PLACEHOLDER"}},
	}
	e.pol.mu.Unlock()
	resp := do("https://api.example.test/", map[string]string{"X-Api-Key": "guest-value"})
	if resp.StatusCode != 200 || resp.TLS.PeerCertificates[0].Issuer.CommonName != "test node CA" {
		t.Fatalf("with a credential: %d, issuer %q", resp.StatusCode, resp.TLS.PeerCertificates[0].Issuer.CommonName)
	}
	if got := e.up.last(); got.Get("X-Api-Key") != cred || got.Get("X-Token") != "" {
		t.Fatalf("upstream got X-Api-Key %q X-Token %q, want the credential and no placeholder credential", got.Get("X-Api-Key"), got.Get("X-Token"))
	}
	do("https://api.example.test/", map[string]string{"X-Token": "SBX_PLACEHOLDER"})
	if got := e.up.last().Get("X-Token"); got != other {
		t.Fatalf("placeholder sent: upstream got X-Token %q", got)
	}
	do("https://secret.example.test/", nil)
	if got := e.up.last().Get("Authorization"); got != "Bearer "+testSecret {
		t.Fatalf("the rule's secret's header: upstream got %q", got)
	}
	rec.mu.Lock()
	raw := rec.buf.Bytes()
	rec.mu.Unlock()
	if bytes.Contains(raw, []byte(cred)) || bytes.Contains(raw, []byte(other)) || len(raw) == 0 {
		t.Fatal("a credential reached the guest (or nothing was recorded)")
	}
}

// socks5 connects through a SOCKS5 door to host:port and returns the reply
// code and the connection.
func socks5(t *testing.T, conn net.Conn, host string, port uint16) byte {
	t.Helper()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := conn.Write([]byte{5, 1, 0}); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 2)
	if _, err := io.ReadFull(conn, b); err != nil || b[1] != 0 {
		t.Fatalf("greeting: %v %v", b, err)
	}
	req := []byte{5, 1, 0, 3, byte(len(host))}
	req = append(req, host...)
	req = binary.BigEndian.AppendUint16(req, port)
	if _, err := conn.Write(req); err != nil {
		t.Fatal(err)
	}
	rep := make([]byte, 10)
	if _, err := io.ReadFull(conn, rep); err != nil {
		t.Fatalf("reply: %v", err)
	}
	_ = conn.SetDeadline(time.Time{})
	return rep[1]
}

// TestSocks: the TCP door speaks SOCKS5 when the policy opts in (0x02
// otherwise), refuses internal destinations with 0x04 and denied hosts
// with 0x02; the vsock doors of a none-lane VM serve HTTP and SOCKS5.
func TestSocks(t *testing.T) {
	e := newEnv(t)
	e.pol.setRules(testSandbox, rule{host: "api.example.test"}, rule{host: "rebind.example.test"})
	dial := func() net.Conn {
		c, err := e.guest.DialContext(context.Background(), "tcp", e.door.String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	if code := socks5(t, dial(), "api.example.test", 80); code != socksNotAllowed {
		t.Fatalf("without the opt-in: reply %d", code)
	}
	e.pol.mu.Lock()
	e.pol.socks[testSandbox] = true
	e.pol.mu.Unlock()
	c := dial()
	if code := socks5(t, c, "api.example.test", 80); code != socksOK {
		t.Fatalf("opted in: reply %d", code)
	}
	fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: api.example.test\r\nConnection: close\r\n\r\n")
	b, _ := io.ReadAll(c)
	if !bytes.Contains(b, []byte("hello api.example.test")) {
		t.Fatalf("through SOCKS5: %q", b)
	}
	if code := socks5(t, dial(), "rebind.example.test", 80); code != socksUnreachable {
		t.Fatalf("internal: reply %d", code)
	}
	if code := socks5(t, dial(), "evil.example.test", 80); code != socksNotAllowed {
		t.Fatalf("denied: reply %d", code)
	}

	// A none-lane VM: its doors are the vsock unix sockets.
	const vm2, sb2 = "vm-0000000000000002", "sb_0000000000000002"
	e.pol.mu.Lock()
	e.pol.sandboxOf[vm2] = sb2
	e.pol.socks[sb2] = true
	e.pol.mu.Unlock()
	e.pol.setRules(sb2, rule{host: "api.example.test"})
	vs := filepath.Join(t.TempDir(), "vsock.sock")
	if err := e.srv.Open(vm2, VsockDoors(vs)); err != nil {
		t.Fatal(err)
	}
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		Proxy: http.ProxyURL(&url.URL{Scheme: "http", Host: "door"}),
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", vs+"_2049")
		},
	}}
	if st, body := get(t, hc, "http://api.example.test/"); st != 200 || body != "hello api.example.test" {
		t.Fatalf("vsock HTTP door: %d %q", st, body)
	}
	if st, _ := get(t, hc, "http://evil.example.test/"); st != 403 {
		t.Fatalf("vsock HTTP door, denied: %d", st)
	}
	sc, err := net.Dial("unix", vs+"_2050")
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	if code := socks5(t, sc, "api.example.test", 80); code != socksOK {
		t.Fatalf("vsock SOCKS5 door: reply %d", code)
	}
	e.srv.CloseDoors(vm2)
	if _, err := net.Dial("unix", vs+"_2049"); err == nil {
		t.Fatal("door still open after CloseDoors")
	}
}

// TestMeterAggregates: decisions reach the meter with their doors; bytes
// reach it as totals per sandbox (a few Transfer calls, not one per read),
// and closing the doors of a released sandbox closes its record.
func TestMeterAggregates(t *testing.T) {
	e := newEnv(t)
	e.pol.setRules(testSandbox, rule{host: "api.example.test"})
	c := e.client(nil)
	for range 5 {
		if st, _ := get(t, c, "http://api.example.test/"); st != 200 {
			t.Fatal(st)
		}
	}
	get(t, c, "http://evil.example.test/")
	e.pol.mu.Lock()
	delete(e.pol.sandboxOf, testVM) // released
	e.pol.mu.Unlock()
	e.srv.CloseDoors(testVM)
	m := e.meter
	m.mu.Lock()
	defer m.mu.Unlock()
	var allows, denies int
	for _, d := range m.decisions {
		switch d {
		case testSandbox + " http allow":
			allows++
		case testSandbox + " http no_rule":
			denies++
		}
	}
	if allows != 5 || denies != 1 {
		t.Fatalf("decisions %v", m.decisions)
	}
	if want := int64(5 * len("hello api.example.test")); m.rx[testSandbox] != want {
		t.Fatalf("rx %d, want %d", m.rx[testSandbox], want)
	}
	if m.transfers > 5 {
		t.Fatalf("%d transfers for 5 requests", m.transfers)
	}
	if len(m.closed) != 1 || m.closed[0] != testSandbox {
		t.Fatalf("closed %v", m.closed)
	}
}

// TestGuestEnv: the guest learns its door and the node CA, nothing secret.
func TestGuestEnv(t *testing.T) {
	ca, err := NewCA("node")
	if err != nil {
		t.Fatal(err)
	}
	s := New(Config{CA: ca})
	t.Cleanup(s.Close)
	if env := s.GuestEnv("vm"); env != nil {
		t.Fatalf("env of a VM without doors: %v", env)
	}
	vs := filepath.Join(t.TempDir(), "v.sock")
	if err := s.Open("vm", VsockDoors(vs)); err != nil {
		t.Fatal(err)
	}
	env := s.GuestEnv("vm")
	if env["http_proxy"] != "http://127.0.0.1:3128" || env["HTTPS_PROXY"] != "http://127.0.0.1:3128" || env["SBX_EGRESS_CA_PEM"] != string(ca.PEM()) || env["SBX_EGRESS_CA_FILE"] != agent.GuestCAFile {
		t.Fatalf("vsock guest env %v", env)
	}
	if d, ok := s.OpenDoors("vm"); !ok || d.HTTPSocket != vs+"_2049" || d.SocksSocket != vs+"_2050" {
		t.Fatalf("doors %+v %v", d, ok)
	}
	// Opening the same doors again is a no-op; CloseDoors removes the sockets.
	if err := s.Open("vm", VsockDoors(vs)); err != nil {
		t.Fatal(err)
	}
	s.CloseDoors("vm")
	if _, err := os.Stat(vs + "_2049"); !os.IsNotExist(err) {
		t.Fatalf("door socket left: %v", err)
	}
}

// TestCAPersists: the node CA is made once and loaded back; its leaves
// verify against it for the host they name.
func TestCAPersists(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ca")
	a, err := LoadOrCreateCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	b, err := LoadOrCreateCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a.PEM(), b.PEM()) {
		t.Fatal("a second load made another CA")
	}
	if fi, err := os.Stat(filepath.Join(dir, CAKeyFile)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file %v %v", fi, err)
	}
	if fi, err := os.Stat(filepath.Join(dir, CACertFile)); err != nil || fi.Mode().Perm() != 0o644 {
		t.Fatalf("certificate file %v %v", fi, err)
	}
	if ents, err := os.ReadDir(dir); err != nil || len(ents) != 2 {
		t.Fatalf("the CA dir holds %v (%v), want the two files only", ents, err)
	}
	leaf, err := b.Leaf("api.example.test")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := leaf.Leaf.Verify(x509.VerifyOptions{DNSName: "api.example.test", Roots: a.Pool()}); err != nil {
		t.Fatal(err)
	}
	if again, _ := b.Leaf("api.example.test"); again != leaf {
		t.Fatal("leaf not cached")
	}
}

// hostAddr gives the host namespace's loopback one more address.
func (e *env) hostAddr(t *testing.T, ip netip.Addr) {
	t.Helper()
	e.lane.Host.MustDo(t, func() error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		// No duplicate address detection, so the address can be bound at
		// once; its local route still comes from the kernel's address
		// work queue, so wait for it.
		if err := netlink.AddrAdd(lo, &netlink.Addr{IPNet: &net.IPNet{IP: ip.AsSlice(), Mask: net.CIDRMask(ip.BitLen(), ip.BitLen())}, Flags: unix.IFA_F_NODAD}); err != nil {
			return err
		}
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
			if rs, err := netlink.RouteGet(ip.AsSlice()); err == nil && len(rs) > 0 && rs[0].Type == unix.RTN_LOCAL {
				return nil
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("no local route to %s", ip)
			}
		}
	})
}

// canary is a listener in the host namespace that counts what reaches it.
func (e *env) canary(t *testing.T, addr string) *atomic.Int64 {
	t.Helper()
	ln, err := e.lane.Host.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	var n atomic.Int64
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			n.Add(1)
			c.Close()
		}
	}()
	return &n
}

// raw sends one request as the guest wrote it to its door and returns the
// answer's status and body (none for a 200 to a CONNECT).
func (e *env) raw(t *testing.T, req string) (int, string) {
	t.Helper()
	c, err := e.guest.DialContext(context.Background(), "tcp", e.door.String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("%q: %v", req, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode == 200 && strings.HasPrefix(req, "CONNECT ") {
		return 200, ""
	}
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestZonedHosts: a host with an IPv6 zone never reaches anything, whatever
// the policy allows: not loopback through "::%x" (Linux connects :: to
// loopback), not an internal address through a zoned NAT64 one, not the
// host's own global address with a zone. CONNECT answers 403 and a
// forward request 400 (a bad authority), SOCKS5 0x04 (the guard), and the
// dialer refuses them itself.
func TestZonedHosts(t *testing.T) {
	e := newEnv(t)
	e.pol.setRules(testSandbox, rule{host: "*"})
	e.pol.mu.Lock()
	e.pol.socks[testSandbox] = true
	e.pol.mu.Unlock()
	e.hostAddr(t, hostGlobal6)
	loop := e.canary(t, "[::1]:20901")
	own := e.canary(t, "["+hostGlobal6.String()+"]:20902")
	// Without a zone the host's own address is the guard's 502.
	if st, body := e.raw(t, "CONNECT ["+hostGlobal6.String()+"]:20902 HTTP/1.1\r\nHost: ["+hostGlobal6.String()+"]:20902\r\n\r\n"); st != 502 || !strings.Contains(body, "blocked internal address") {
		t.Fatalf("CONNECT to the host's own address: %d %q", st, body)
	}
	for _, tc := range []struct {
		authority string
		port      uint16
	}{
		{"[::%25x]:20901", 20901},
		{"[::1%25lo]:20901", 20901},
		{"[64:ff9b::a00:1%25x]:80", 80},     // 10.0.0.1
		{"[64:ff9b::a4d:1%25x]:8080", 8080}, // 10.77.0.1, the bridge
		{"[" + hostGlobal6.String() + "%25lo]:20902", 20902},
		{"[" + upstream6.String() + "%25eth0]:443", 443},
	} {
		if st, body := e.raw(t, "CONNECT "+tc.authority+" HTTP/1.1\r\nHost: "+tc.authority+"\r\n\r\n"); st != 403 {
			t.Errorf("CONNECT %s: %d %q, want 403", tc.authority, st, body)
		}
		if st, body := e.raw(t, "GET http://"+tc.authority+"/ HTTP/1.1\r\nHost: "+tc.authority+"\r\n\r\n"); st != 400 {
			t.Errorf("GET http://%s/: %d %q, want 400", tc.authority, st, body)
		}
	}
	for _, host := range []string{"::%x", "::1%lo", "64:ff9b::a00:1%x", hostGlobal6.String() + "%lo"} {
		c, err := e.guest.DialContext(context.Background(), "tcp", e.door.String())
		if err != nil {
			t.Fatal(err)
		}
		if code := socks5(t, c, host, 20901); code != socksUnreachable {
			t.Errorf("SOCKS5 to %s: reply %d, want %d", host, code, socksUnreachable)
		}
		c.Close()
		if _, err := e.srv.dial(context.Background(), host, 20901); !isBlocked(err) {
			t.Errorf("dial %s: %v, want blocked", host, err)
		}
	}
	if n, m := loop.Load(), own.Load(); n != 0 || m != 0 {
		t.Fatalf("a zoned host reached loopback %d times, the host's own address %d times", n, m)
	}
	counts := map[string]uint64{}
	for _, c := range e.srv.Counts() {
		counts[c.Door+" "+c.Outcome] = c.N
	}
	if counts["http bad_request"] != 6 || counts["connect bad_request"] != 6 {
		t.Fatalf("decision counts %v", counts)
	}
}

// TestInterceptIPv6Literal: an intercepted tunnel to an IPv6 literal on
// 443 reaches that address and port (the URL toward it is bracketed).
func TestInterceptIPv6Literal(t *testing.T) {
	e := newEnv(t)
	e.hostAddr(t, upstream6)
	ln, err := e.lane.Host.Listen("tcp", netip.AddrPortFrom(upstream6, 443).String())
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := e.up.ca.Leaf(upstream6.String())
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: e.up}
	go hs.Serve(tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{*leaf}}))
	t.Cleanup(func() { hs.Close() })
	e.pol.setRules(testSandbox, rule{host: upstream6.String(), secret: "gh", intercept: egress.InterceptAlways})
	resp, err := e.client(nil).Get("https://[" + upstream6.String() + "]/v6")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(b) != "hello ["+upstream6.String()+"]" {
		t.Fatalf("intercepted IPv6 literal: %d %q", resp.StatusCode, b)
	}
	if resp.TLS.PeerCertificates[0].Issuer.CommonName != "test node CA" {
		t.Fatalf("not intercepted: issuer %q", resp.TLS.PeerCertificates[0].Issuer.CommonName)
	}
	if got := e.up.last().Get("Authorization"); got != "Bearer "+testSecret {
		t.Fatalf("upstream got Authorization %q", got)
	}
}

// TestDoorOnlyFromTheBridge: a TCP door serves only what crosses the
// bridge: a LAN neighbour routing the bridge's address through the
// host's uplink does not reach it (the listener is bound to the bridge),
// a host-local process connects but is closed unserved (the kernel
// delivers it as if from the bridge; its source is the host's), while a
// plain service on the same address serves both and the guest is still
// served by its door.
func TestDoorOnlyFromTheBridge(t *testing.T) {
	e := newEnv(t)
	e.pol.setRules(testSandbox, rule{host: "api.example.test"})
	lan := netnstest.New(t, "lan")
	netnstest.Veth(t, e.lane.Host, "uplink0", lan, "eth0")
	e.lane.Host.AddrAdd(t, "uplink0", netip.MustParsePrefix("198.51.100.1/24"))
	lan.AddrAdd(t, "eth0", netip.MustParsePrefix("198.51.100.2/24"))
	lan.RouteDefault(t, netip.MustParseAddr("198.51.100.1"))
	// served sends a proxy request to addr from ns: the status, or the
	// error of the connect or of the read.
	served := func(ns *netnstest.NS, addr string, local netip.Addr) (int, error) {
		// A refused SYN from a host address other than the door's is
		// dropped, not reset: the connect times out.
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		defer cancel()
		var c net.Conn
		err := ns.Do(func() error {
			d := net.Dialer{}
			if local.IsValid() {
				d.LocalAddr = &net.TCPAddr{IP: local.AsSlice()}
			}
			var err error
			c, err = d.DialContext(ctx, "tcp", addr)
			return err
		})
		if err != nil {
			return 0, err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(2 * time.Second))
		if _, err := io.WriteString(c, "GET http://api.example.test/ HTTP/1.1\r\nHost: api.example.test\r\n\r\n"); err != nil {
			return 0, err
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			return 0, err
		}
		resp.Body.Close()
		return resp.StatusCode, nil
	}
	svc := netip.AddrPortFrom(e.lane.HostAddr, 8080).String() // the API stand-in, on the bridge's address
	for _, tc := range []struct {
		ns    *netnstest.NS
		local netip.Addr
	}{
		{e.lane.Host, netip.Addr{}},
		{e.lane.Host, netip.MustParseAddr("127.0.0.1")},
		{e.lane.Host, netip.MustParseAddr("198.51.100.1")},
		{lan, netip.Addr{}},
	} {
		if _, err := served(tc.ns, svc, tc.local); err != nil {
			t.Fatalf("%s from %v: the bridge's address serves nothing at all (%v): the test proves nothing", tc.ns.Name, tc.local, err)
		}
		if st, err := served(tc.ns, e.door.String(), tc.local); err == nil {
			t.Errorf("%s from %v: the door %s answered %d", tc.ns.Name, tc.local, e.door, st)
		}
	}
	if st, body := get(t, e.client(nil), "http://api.example.test/"); st != 200 || body != "hello api.example.test" {
		t.Fatalf("the guest through its door: %d %q", st, body)
	}
}

// TestSecretEcho: TRACE and TRACK, whose answers echo the request with its
// headers, are refused (403, secret_echo) wherever a rule's secret or a
// claim credential would be injected, forward and intercepted, and never
// reach the upstream; with nothing to inject they pass.
func TestSecretEcho(t *testing.T) {
	e := newEnv(t)
	e.pol.setRules(testSandbox,
		rule{host: "plain.example.test", secret: "gh"},
		rule{host: "secret.example.test", secret: "gh", intercept: egress.InterceptAlways},
		rule{host: "api.example.test", intercept: egress.InterceptInject},
		rule{host: "late.example.test"})
	e.pol.mu.Lock()
	e.pol.creds[testSandbox] = []egress.Credential{{Name: "API_KEY", Value: "claim-cred-echo", Inject: egress.EnvInject{Hosts: []string{"api.example.test"}, Header: "X-Api-Key"}}}
	e.pol.mu.Unlock()
	c := e.client(nil)
	seen := func() int {
		e.up.mu.Lock()
		defer e.up.mu.Unlock()
		return len(e.up.seen)
	}
	do := func(method, u string) int {
		t.Helper()
		req, _ := http.NewRequest(method, u, nil)
		resp, err := c.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, u, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, m := range []string{"TRACE", "TRACK", "trace"} {
		for _, u := range []string{"http://plain.example.test/", "https://secret.example.test/", "https://api.example.test/"} {
			before := seen()
			if st := do(m, u); st != 403 || seen() != before {
				t.Errorf("%s %s: %d, the upstream got %d requests; want 403 and none", m, u, st, seen()-before)
			}
		}
		if st := do(m, "http://late.example.test/"); st != 200 {
			t.Errorf("%s without a secret: %d", m, st)
		}
	}
	// The same hosts serve other methods with the injection.
	if st := do("GET", "https://api.example.test/"); st != 200 || e.up.last().Get("X-Api-Key") != "claim-cred-echo" {
		t.Fatalf("GET with the credential: %d", st)
	}
	counts := map[string]uint64{}
	for _, c := range e.srv.Counts() {
		counts[c.Door+" "+c.Outcome] = c.N
	}
	if counts["http secret_echo"] != 3 || counts["inner secret_echo"] != 6 {
		t.Fatalf("decision counts %v", counts)
	}
}

// TestMeterFinalOnlyAtRelease: doors closed while the VM still serves its
// sandbox (a hibernate) leave its accounting open, across doors opened
// again (the wake); the doors' close after the release closes it, once,
// and so does the destroy of a VM released while its doors were closed
// (a hibernated claim released). A process stop closes nothing.
func TestMeterFinalOnlyAtRelease(t *testing.T) {
	pol, met := newFakePolicies(), newFakeMeter()
	s := New(Config{Policies: pol, Meter: met})
	t.Cleanup(s.Close)
	const vm2, sb2 = "vm-0000000000000002", "sb_0000000000000002"
	pol.sandboxOf[testVM], pol.sandboxOf[vm2] = testSandbox, sb2
	pol.setRules(testSandbox)
	pol.setRules(sb2)
	dir := t.TempDir()
	serve := func(vm string) {
		t.Helper()
		vs := filepath.Join(dir, vm)
		if err := s.Open(vm, VsockDoors(vs)); err != nil {
			t.Fatal(err)
		}
		hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
			Proxy: http.ProxyURL(&url.URL{Scheme: "http", Host: "door"}),
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				return (&net.Dialer{}).DialContext(ctx, "unix", vs+"_2049")
			},
		}}
		if st, _ := get(t, hc, "http://api.example.test/"); st != 403 {
			t.Fatalf("%s: %d", vm, st)
		}
	}
	closed := func() []string {
		met.mu.Lock()
		defer met.mu.Unlock()
		return append([]string(nil), met.closed...)
	}
	release := func(vm string) {
		pol.mu.Lock()
		delete(pol.sandboxOf, vm)
		pol.mu.Unlock()
	}
	serve(testVM)
	serve(vm2)
	s.CloseDoors(testVM) // hibernate
	s.CloseDoors(vm2)
	if got := closed(); len(got) != 0 {
		t.Fatalf("hibernate closed %v", got)
	}
	serve(testVM) // wake
	release(testVM)
	s.CloseDoors(testVM)
	if got := closed(); len(got) != 1 || got[0] != testSandbox {
		t.Fatalf("after the release: closed %v", got)
	}
	release(vm2) // released while hibernated: its doors stay closed
	s.CloseDoors(vm2)
	s.CloseDoors(testVM)
	if got := closed(); len(got) != 2 || got[1] != sb2 {
		t.Fatalf("after the hibernated release: closed %v", got)
	}
	// A process stop leaves the accounting of a live sandbox open.
	const vm3, sb3 = "vm-0000000000000003", "sb_0000000000000003"
	pol.mu.Lock()
	pol.sandboxOf[vm3] = sb3
	pol.mu.Unlock()
	pol.setRules(sb3)
	serve(vm3)
	s.Close()
	if got := closed(); len(got) != 2 {
		t.Fatalf("a process stop closed %v", got)
	}
}
