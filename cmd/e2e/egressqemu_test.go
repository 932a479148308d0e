package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	neturl "net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sbxlog/sbxlog/executors/egress/nft"
	"github.com/sbxlog/sbxlog/executors/guest/agent"
	"github.com/sbxlog/sbxlog/executors/guest/guesttest"
	"github.com/sbxlog/sbxlog/executors/guest/silkd"
)

// qemuGuest is a claimed egress VM's real guest, driven through the exec
// data plane (the agent relay, dialled in the host namespace, where the
// API listens); every byte it printed joins view.
type qemuGuest struct {
	t             *testing.T
	n             *egressNode
	id, token, vm string
	view          bytes.Buffer
}

// dialAgent opens the sandbox's agent relay as apiclient.DialAgent does,
// from inside the host namespace.
func (g *qemuGuest) dialAgent(ctx context.Context) (net.Conn, error) {
	c, err := g.n.lane.Host.DialContext(ctx, "tcp", g.n.apiAddr)
	if err != nil {
		return nil, err
	}
	req := "GET /v1/sandboxes/" + g.id + "/agent HTTP/1.1\r\nHost: " + g.n.apiAddr + "\r\nConnection: Upgrade\r\nUpgrade: silkd\r\nAuthorization: Bearer " + g.token + "\r\n\r\n"
	if _, err := io.WriteString(c, req); err != nil {
		c.Close()
		return nil, err
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		c.Close()
		return nil, fmt.Errorf("agent relay: %v %v", resp, err)
	}
	return &readerConn{Conn: c, r: br}, nil
}

// sh runs script with sh -c in the guest and returns its exit code, stdout
// and stderr.
func (g *qemuGuest) sh(script string) (int, string, string) {
	g.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	nc, err := g.dialAgent(ctx)
	if err != nil {
		g.t.Fatalf("agent of %s: %v", g.id, err)
	}
	defer nc.Close()
	var out, errb bytes.Buffer
	res, err := silkd.NewConn(nc).Exec(ctx, silkd.Exec{Argv: []string{"sh", "-c", script}}, silkd.ExecIO{Stdout: &out, Stderr: &errb})
	if err != nil {
		g.t.Fatalf("exec %q in %s: %v", script, g.id, err)
	}
	g.view.Write(out.Bytes())
	g.view.Write(errb.Bytes())
	return int(res.Code), out.String(), errb.String()
}

// fetch GETs url with curl through the guest's proxy (its environment's,
// verifying TLS with its bundle) and returns the status (0: no answer) and
// the body.
func (g *qemuGuest) fetch(url string, header string) (int, string) {
	g.t.Helper()
	h := ""
	if header != "" {
		h = "-H '" + header + "' "
	}
	_, out, errb := g.sh("curl -sS -m 20 " + h + "-w '\\n%{http_code}' '" + url + "'")
	i := strings.LastIndex(out, "\n")
	var code int
	fmt.Sscan(out[i+1:], &code)
	return code, out[:max(i, 0)] + errb
}

// pipDownload runs `python3 -m pip download` of probePkg from the index at
// indexURL in the guest, through its proxy, and returns pip's exit code and
// output (-vv: with each answer's status). pip takes a plain-HTTP index
// only from a trusted host.
func (g *qemuGuest) pipDownload(indexURL string) (int, string) {
	g.t.Helper()
	u, err := neturl.Parse(indexURL)
	if err != nil {
		g.t.Fatal(err)
	}
	code, out, errb := g.sh("rm -rf /tmp/dl && python3 -m pip download -vv --no-deps --no-cache-dir --disable-pip-version-check --retries 0 --timeout 20" +
		" --trusted-host " + u.Hostname() + " --index-url '" + indexURL + "' " + probePkg + " -d /tmp/dl && ls /tmp/dl")
	return code, out + errb
}

// TestEgressAcceptanceQEMU is issue 22's acceptance 1: TestEgressAcceptance's
// cases with real QEMU guests (TCG) as the clients, on the built sandboxd
// with an egress pool: each guest was given its MAC, address, gateway,
// proxy variables and the node CA over the serial port (its clone holds
// the golden's), reaches an allowed upstream through its proxy (200) and is
// refused a denied one (403), the internal addresses, the metadata address
// and the host's API port (502); its direct connections are dropped at its
// tap, moving the drop counter; a secret the proxy injects reaches the
// upstream and never the guest; a second guest that takes the first's
// address gets nothing, and the first keeps its door; `pip download`
// fetches a wheel from an allowed package index (plain HTTP, and HTTPS
// intercepted with the node CA, which pip trusts through PIP_CERT) and
// fails from a denied one. The guests run the Debian template
// (executors/guest/template.sh default: curl, pip, netcat) as "default".
func TestEgressAcceptanceQEMU(t *testing.T) {
	g := guesttest.RequireDebian(t)
	const claimTok = "claim-egress-token-q7d1e0a4c2"
	t.Setenv("E2E_EGRESS_TOKEN", "node-egress-token-q3b8f6e1d9")
	dir := shortTempDir(t, "egq")
	t.Cleanup(func() { killQEMUs(t, dir) }) // after sandboxd's stop
	rule := func(host string, kv ...any) map[string]any {
		r := map[string]any{"host": host}
		for i := 0; i < len(kv); i += 2 {
			r[kv[i].(string)] = kv[i+1]
		}
		return r
	}
	w := startAcceptanceWorld(t, egressNodeOpts{dir: dir, cfg: map[string]any{
		"hypervisor": "qemu",
		"qemu": map[string]any{"accel": "tcg", "templates": map[string]any{
			"default": map[string]any{"kernel": g.Kernel, "initrd": g.Initrd, "disk": g.Disk},
		}},
		"egress_proxy": map[string]any{"intercept": true},
		"secrets":      []any{map[string]any{"name": "tok", "header": "Authorization", "value_env": "E2E_EGRESS_TOKEN"}},
		"pools": []any{map[string]any{"template": "default", "net": "egress", "size": "small", "warm": 2, "egress": map[string]any{"allow": []any{
			rule("allowed.e2e.test"), rule("secret.e2e.test", "secret", "tok"), rule("mitm.e2e.test", "intercept", true),
			rule("10.1.2.3"), rule("169.254.169.254"), rule("10.77.0.1"),
		}}}},
	}})
	n, up := w.n, w.up
	data := filepath.Join(n.dir, "data")

	claim := func(body string) (id, token, vm string) {
		t.Helper()
		var ca struct{ ID, Token, VM string }
		deadline := time.Now().Add(8 * time.Minute) // the golden boots under TCG
		for {
			req, _ := http.NewRequest("POST", "http://"+n.apiAddr+"/v1/claim", strings.NewReader(body))
			req.Header.Set("Authorization", "Bearer root")
			resp, err := n.hc.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				if err := json.Unmarshal(b, &ca); err != nil || ca.ID == "" {
					t.Fatalf("claim: %s %v", b, err)
				}
				return ca.ID, ca.Token, ca.VM
			}
			if time.Now().After(deadline) {
				t.Fatalf("no egress VM to claim after 8 min: %d %s", resp.StatusCode, b)
			}
			time.Sleep(2 * time.Second)
		}
	}
	guest := func(body string) *qemuGuest {
		id, token, vm := claim(body)
		return &qemuGuest{t: t, n: n, id: id, token: token, vm: vm}
	}
	ga := guest(`{"template":"default","net":"egress","size":"small","env":{"E2E_EGRESS_TOKEN":{"value":"` + claimTok + `","guest":false}}}`)
	gb := guest(`{"template":"default","net":"egress","size":"small"}`)
	lock := func(q *qemuGuest) nft.State {
		st, ok := n.locks(t)[n.tapOf(t, q.vm)]
		if !ok || !st.OK {
			t.Fatalf("the lock of %s: %+v", q.vm, st)
		}
		return st
	}
	la, lb := lock(ga), lock(gb)
	for _, tool := range []string{"command -v curl", "command -v nc", "python3 -m pip --version"} {
		if code, out, errb := ga.sh(tool); code != 0 {
			t.Fatalf("the Debian template fails %q (%d: %s%s): rebuild it with executors/guest/template.sh default", tool, code, out, errb)
		}
	}
	nodeCA, err := os.ReadFile(filepath.Join(data, "egress-ca", "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}

	// What the host gave each guest: the NIC at the egress slot with its
	// lock's MAC and address, the proxy variables, the node CA.
	for _, c := range []struct {
		q  *qemuGuest
		st nft.State
	}{{ga, la}, {gb, lb}} {
		_, out, errb := c.q.sh(`IF=$(ls /sys/bus/pci/devices/0000:00:10.0/virtio*/net); cat /sys/class/net/$IF/address; ip -4 addr show dev $IF; echo "proxy=$HTTP_PROXY"; echo "bundle=$SSL_CERT_FILE"; cat "$SSL_CERT_FILE"`)
		for _, want := range []string{c.st.Lock.GuestMAC.String(), c.st.Lock.GuestIP.String() + "/", "proxy=http://" + c.st.Lock.Door.String(), "bundle=" + agent.GuestBundle, strings.TrimSpace(string(nodeCA))} {
			if !strings.Contains(out, want) {
				t.Fatalf("guest %s lacks %q:\n%s%s", c.q.vm, want, out, errb)
			}
		}
	}

	// The allowed host answers through the proxy; a denied one is 403.
	if st, body := ga.fetch("http://allowed.e2e.test/", ""); st != 200 || !strings.Contains(body, "hello allowed.e2e.test") {
		_, diag, _ := ga.sh(`ip addr; ip route; ip neigh; env | grep -i proxy; cat /proc/net/dev`)
		var host string
		n.lane.Host.MustDo(t, func() error {
			out, _ := exec.Command("sh", "-c", "ip neigh show dev sbxbr0; bridge fdb show br sbxbr0 | grep -v permanent; ip -d link show "+n.tapOf(t, ga.vm)).CombinedOutput()
			host = string(out)
			if st, err := n.owner(t).Inspect(n.tapOf(t, ga.vm)); err == nil {
				host += fmt.Sprintf("\nlock %s ok=%v %s counters %v", st.Lock, st.OK, st.Problem, st.Counters)
			}
			return nil
		})
		t.Fatalf("allowed host from the guest: %d %q\nguest:\n%s\nhost:\n%s", st, body, diag, host)
	}
	if st, body := ga.fetch("http://denied.e2e.test/", ""); st != 403 {
		t.Fatalf("denied host from the guest: %d %q", st, body)
	}
	// Intercepted with the node CA the guest trusts: curl verifies (no -k).
	if st, body := ga.fetch("https://mitm.e2e.test/", ""); st != 200 || !strings.Contains(body, "hello mitm.e2e.test") {
		t.Fatalf("intercepted host with curl: %d %q", st, body)
	}
	// Internal addresses, the metadata address and the host's API port,
	// allowed by the policy: the guard refuses them.
	for _, u := range []string{"http://10.1.2.3/", "http://169.254.169.254/latest/meta-data/", "http://10.77.0.1:7777/healthz"} {
		if st, body := ga.fetch(u, ""); st != 502 {
			t.Fatalf("%s from the guest: %d %q, want 502", u, st, body)
		}
	}
	// Direct connections, bypassing the proxy: dropped at the tap.
	before := lock(ga).Counters.Dropped().Packets
	for _, addr := range []string{"93.184.0.10 80", "10.77.0.1 7777", "169.254.169.254 80"} {
		if code, _, _ := ga.sh("nc -w 2 " + addr + " </dev/null"); code == 0 {
			t.Fatalf("a direct connection from the guest to %s succeeded", addr)
		}
	}
	if after := lock(ga).Counters.Dropped().Packets; after <= before {
		t.Fatalf("the tap's drop counter did not move (%d -> %d)", before, after)
	}
	// The claim's host-only value is injected upstream, never shown the guest.
	if st, _ := ga.fetch("http://secret.e2e.test/", "Authorization: guest-supplied"); st != 200 {
		t.Fatalf("secret host: %d", st)
	}
	if h, _ := up.last("secret.e2e.test"); h.Get("Authorization") != claimTok {
		t.Fatalf("upstream got Authorization %q, want the claim's host-only value", h.Get("Authorization"))
	}

	// pip: an allowed index over HTTP and, intercepted, over HTTPS; a
	// denied one refused (403) with nothing downloaded.
	for _, idx := range []string{"http://allowed.e2e.test/simple/", "https://mitm.e2e.test/simple/"} {
		if code, out := ga.pipDownload(idx); code != 0 || !strings.Contains(out, probeWheel) {
			t.Fatalf("pip download from %s: %d\n%s", idx, code, out)
		}
	}
	if code, out := ga.pipDownload("http://denied.e2e.test/simple/"); code == 0 || strings.Contains(out, probeWheel) || !strings.Contains(out, "403 Client Error") {
		t.Fatalf("pip download from a denied index: %d\n%s", code, out)
	}
	if _, ok := up.last("denied.e2e.test"); ok {
		t.Fatal("a request for the denied host reached the upstream")
	}

	// B takes A's address: it reaches nothing, A keeps its door.
	pinned := func() net.HardwareAddr {
		var m net.HardwareAddr
		n.lane.Host.MustDo(t, func() error {
			p, err := nft.Pins(n.lane.Bridge)
			m = p[la.Lock.GuestIP]
			return err
		})
		return m
	}
	if got := pinned(); !slices.Equal(got, la.Lock.GuestMAC) {
		t.Fatalf("A's address pinned to %s, want %s", got, la.Lock.GuestMAC)
	}
	beforeB := lock(gb).Counters.Dropped().Packets
	spoof := netip.PrefixFrom(la.Lock.GuestIP, n.lane.Subnet.Bits())
	if code, out, errb := gb.sh(`IF=$(ls /sys/bus/pci/devices/0000:00:10.0/virtio*/net); ip addr flush dev $IF && ip addr add ` + spoof.String() +
		` dev $IF && ip route replace default via ` + n.lane.HostAddr.String() + ` && (arping -c 2 -U -I $IF -s ` + la.Lock.GuestIP.String() + ` ` + n.lane.HostAddr.String() + ` || true)`); code != 0 {
		t.Fatalf("B taking A's address: %d %s %s", code, out, errb)
	}
	if st, body := gb.fetch("http://allowed.e2e.test/", ""); st != 0 {
		t.Fatalf("a guest on another's address got an answer: %d %q", st, body)
	}
	if st, _ := gb.fetch("http://"+la.Lock.Door.String()+"/", ""); st != 0 {
		t.Fatalf("a guest on another's address reached that guest's door: %d", st)
	}
	if after := lock(gb).Counters.Dropped().Packets; after <= beforeB {
		t.Fatalf("the spoofer's drop counter did not move (%d -> %d)", beforeB, after)
	}
	if got := pinned(); !slices.Equal(got, la.Lock.GuestMAC) {
		t.Fatalf("after the spoof, A's address points at %s, want %s", got, la.Lock.GuestMAC)
	}
	if st, body := ga.fetch("http://allowed.e2e.test/", ""); st != 200 || !strings.Contains(body, "hello allowed.e2e.test") {
		t.Fatalf("A after B's spoof: %d %q", st, body)
	}

	// The secret is nowhere the guests could read.
	for _, q := range []*qemuGuest{ga, gb} {
		if bytes.Contains(q.view.Bytes(), []byte(claimTok)) || bytes.Contains(q.view.Bytes(), []byte(os.Getenv("E2E_EGRESS_TOKEN"))) {
			t.Errorf("guest %s received a secret", q.vm)
		}
	}
	if ga.view.Len() == 0 {
		t.Fatal("the guest's view recorded nothing")
	}
}
