// Package egressbench is guarded egress's benchmark section (`go run ./bench
// -only egressbench`), in network namespaces (root), side by side in one
// run:
//
//   - the proxy against a direct connection: two guests on one bridge in
//     a host namespace, one behind a locked tap and the proxy's TCP door,
//     the other on an unlocked tap reaching the same upstream directly;
//     request latency (keep-alive HTTP GETs, forward proxy) and bulk
//     throughput (one large body, through a CONNECT tunnel), alternating
//     rounds;
//   - the warm claim of an egress pool against a `net: none` claim, on the
//     built sandboxd with chsim in the host namespace (every egress tap
//     locked at refill), alternating claims. Target (issue 18): the egress
//     claim's median within 10% of the none claim's: the claim path
//     touches no netlink. The lock's own cost (nft.Owner.Install, paid at
//     refill) is reported beside it.
package egressbench

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/sbxlog/sbxlog/bench/report"
	"github.com/sbxlog/sbxlog/executors/ch/chsimbin"
	"github.com/sbxlog/sbxlog/executors/egress/netnstest"
	"github.com/sbxlog/sbxlog/executors/egress/nft"
	"github.com/sbxlog/sbxlog/executors/egress/proxy"
	"github.com/sbxlog/sbxlog/fsm/egress"
	"github.com/sbxlog/sbxlog/projections/api"
	"github.com/sbxlog/sbxlog/projections/apiclient"
)

type config struct {
	rounds   int   // alternating latency rounds
	requests int   // requests per round and path
	bulk     int64 // bytes per throughput sample
	bulkRuns int   // throughput samples per path
	claims   int   // claims per pool
	locks    int   // nft.Owner.Install samples
}

func configFor(quick bool) config {
	if quick {
		return config{rounds: 2, requests: 50, bulk: 16 << 20, bulkRuns: 2, claims: 6, locks: 10}
	}
	return config{rounds: 10, requests: 200, bulk: 256 << 20, bulkRuns: 6, claims: 100, locks: 200}
}

var upstreamIP = netip.MustParseAddr("93.184.0.10")

// Run measures the section.
func Run(ctx context.Context, opts report.Options) (*report.Section, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("egressbench: needs root (network namespaces, nftables)")
	}
	cfg := configFor(opts.Quick)
	sec := &report.Section{
		Title:  "Guarded egress: the proxy against a direct connection; warm claims, egress pool against net none",
		Header: []string{"measure", "direct / none", "proxy / egress", "ratio"},
	}
	err := netnstest.Run(func(r *netnstest.Runner) error { return proxyRounds(ctx, r, cfg, sec) })
	if err != nil {
		return nil, err
	}
	err = netnstest.Run(func(r *netnstest.Runner) error { return claimRounds(ctx, r, cfg, opts.Scratch, sec) })
	if err != nil {
		return nil, err
	}
	sec.Method = fmt.Sprintf("Proxy: a host network namespace with a bridge (10.77.0.1/24) and an upstream HTTP server on 93.184.0.10 (its loopback); "+
		"two guest namespaces on veths whose host ends are bridge ports: one locked by nft (the egress tap's ruleset) and served by "+
		"executors/egress/proxy on its TCP door (policy: allow, the internal-address guard on), the other unlocked, reaching the upstream directly. "+
		"Latency: %d alternating rounds of %d keep-alive GETs (22-byte answer) per path, direct to the upstream or as forward-proxy requests to the door. "+
		"Throughput: %d alternating downloads of %d MiB per path, direct or through a CONNECT tunnel (spliced). "+
		"Claims: the built sandboxd with chsim in the host namespace, pools default/none/small and default/egress/small (warm 6 each; the egress "+
		"pool with a policy allowing every host, its claims answering net_route relay; every egress tap locked at refill), %d claims per pool alternating, each released (untimed) and timed only once both pools are full with no refill in flight, plus 100 ms (a claim is timed alone, not against the last release's destroy and refill); only warm-tier claims count, "+
		"client-side over keep-alive HTTP. Lock: %d nft.Install calls on a tap without a table (each after an untimed Remove), the netlink cost a refill pays and a claim does not.",
		cfg.rounds, cfg.requests, cfg.bulkRuns, cfg.bulk>>20, cfg.claims, cfg.locks)
	return sec, nil
}

// allowAll is the bench's egress state: the VM serves one sandbox whose
// policy allows every host (decided by fsm/egress, as on a node); the
// proxy's guard, netguard's fixed table, stays on the measured path.
type allowAll struct{ vm, sb string }

var allowEverything = &egress.Policy{Allow: []egress.Rule{{Host: "*"}}}

func (a allowAll) SandboxOfVM(vm string) (string, bool) { return a.sb, vm == a.vm }
func (allowAll) Policy(string) (egress.Effective, bool) {
	return egress.Effective{Base: allowEverything}, true
}
func (allowAll) SecretsFor(string) (map[string]string, error)    { return nil, nil }
func (allowAll) SecretHeader(string) (string, bool)              { return "", false }
func (allowAll) Credentials(string) ([]egress.Credential, error) { return nil, nil }

// upstream answers /small with 22 bytes and /bulk?n= with n bytes.
func upstream(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/bulk" {
		_, _ = io.WriteString(w, "hello from the origin\n")
		return
	}
	n, _ := strconv.ParseInt(r.URL.Query().Get("n"), 10, 64)
	w.Header().Set("Content-Length", strconv.FormatInt(n, 10))
	buf := make([]byte, 256<<10)
	for n > 0 {
		k := min(n, int64(len(buf)))
		if _, err := w.Write(buf[:k]); err != nil {
			return
		}
		n -= k
	}
}

// serveUpstream serves upstream on 93.184.0.10:80, an address of the host
// namespace's loopback, until stop.
func serveUpstream(r *netnstest.Runner, lane *netnstest.Lane) (stop func(), err error) {
	lane.Host.MustDo(r, func() error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		return netlink.AddrAdd(lo, &netlink.Addr{IPNet: &net.IPNet{IP: upstreamIP.AsSlice(), Mask: net.CIDRMask(32, 32)}})
	})
	ln, err := lane.Host.Listen("tcp", upstreamIP.String()+":80")
	if err != nil {
		return nil, err
	}
	hs := &http.Server{Handler: http.HandlerFunc(upstream)}
	go hs.Serve(ln)
	return func() { hs.Close() }, nil
}

func proxyRounds(ctx context.Context, r *netnstest.Runner, cfg config, sec *report.Section) error {
	lane := netnstest.NewLane(r)
	locked := lane.AddGuest(r, 1, "sbxbenchlock01", net.HardwareAddr{2, 0, 0, 0, 1, 1})
	open := lane.AddGuest(r, 2, "sbxbenchopen01", net.HardwareAddr{2, 0, 0, 0, 1, 2})
	stop, err := serveUpstream(r, lane)
	if err != nil {
		return err
	}
	defer stop()

	door := netip.AddrPortFrom(lane.HostAddr, 20001)
	srv := proxy.New(proxy.Config{Policies: allowAll{vm: "vm-bench", sb: "sb_bench"}, DialIn: lane.Host.Do})
	defer srv.Close()
	lane.Host.MustDo(r, func() error { return srv.Open("vm-bench", proxy.Doors{TCP: door}) })
	lock := nft.Lock{Tap: locked.Tap, GuestMAC: locked.MAC, GuestIP: locked.Addr, Door: door, DoorMAC: lane.BridgeMAC(r)}
	owner := nft.OwnerOf("i-egressbench")
	var lockLat report.Durations
	for range cfg.locks {
		// A refill locks a new tap: no table to replace.
		lane.Host.MustDo(r, func() error { return owner.Remove(lock.Tap) })
		t0 := time.Now()
		lane.Host.MustDo(r, func() error { return owner.Install(lock) })
		lockLat = append(lockLat, time.Since(t0))
	}

	direct := &http.Client{Transport: &http.Transport{DialContext: open.DialContext}}
	proxyURL, _ := url.Parse("http://" + door.String())
	proxied := &http.Client{Transport: &http.Transport{DialContext: locked.DialContext, Proxy: http.ProxyURL(proxyURL)}}
	target := "http://" + upstreamIP.String() + "/small"
	get := func(c *http.Client) (time.Duration, error) {
		t0 := time.Now()
		resp, err := c.Get(target)
		if err != nil {
			return 0, err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			return 0, fmt.Errorf("GET %s: %s", target, resp.Status)
		}
		return time.Since(t0), nil
	}
	// Warm both paths (connections, page cache), untimed.
	for range 20 {
		if _, err := get(direct); err != nil {
			return err
		}
		if _, err := get(proxied); err != nil {
			return err
		}
	}
	var dLat, pLat report.Durations
	for range cfg.rounds {
		for _, p := range []struct {
			c   *http.Client
			out *report.Durations
		}{{direct, &dLat}, {proxied, &pLat}} {
			for range cfg.requests {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				d, err := get(p.c)
				if err != nil {
					return err
				}
				*p.out = append(*p.out, d)
			}
		}
	}
	var dTput, pTput []float64
	for range cfg.bulkRuns {
		d, err := bulk(ctx, open, upstreamIP.String()+":80", "", cfg.bulk)
		if err != nil {
			return fmt.Errorf("direct bulk: %w", err)
		}
		p, err := bulk(ctx, locked, door.String(), upstreamIP.String()+":80", cfg.bulk)
		if err != nil {
			return fmt.Errorf("tunnel bulk: %w", err)
		}
		dTput, pTput = append(dTput, mibps(cfg.bulk, d)), append(pTput, mibps(cfg.bulk, p))
	}
	d50, p50 := dLat.Quantile(0.5), pLat.Quantile(0.5)
	d99, p99 := dLat.Quantile(0.99), pLat.Quantile(0.99)
	sec.AddRow("GET latency p50 (keep-alive)", report.Fmt(d50), report.Fmt(p50), fmt.Sprintf("%.2fx (%s)", ratio(p50, d50), signed(p50-d50)))
	sec.AddRow("GET latency p99 (keep-alive)", report.Fmt(d99), report.Fmt(p99), fmt.Sprintf("%.2fx (%s)", ratio(p99, d99), signed(p99-d99)))
	dm, pm := median(dTput), median(pTput)
	sec.AddRow(fmt.Sprintf("bulk download, %d MiB (median MiB/s)", cfg.bulk>>20), fmt.Sprintf("%.0f", dm), fmt.Sprintf("%.0f (CONNECT)", pm), fmt.Sprintf("%.2fx", pm/dm))
	sec.AddRow("lock install (nft.Install, at refill) p50 / p99", "-", report.Fmt(lockLat.Quantile(0.5))+" / "+report.Fmt(lockLat.Quantile(0.99)), "-")
	sec.Notes = append(sec.Notes, fmt.Sprintf("Proxy added latency at the median: %s per request (forward proxy; one upstream connection kept by the proxy).", report.Fmt(p50-d50)))
	return nil
}

// bulk downloads n bytes from the upstream at addr, through a CONNECT
// tunnel to via's target when via is set, and returns the time taken.
func bulk(ctx context.Context, g *netnstest.Guest, addr, target string, n int64) (time.Duration, error) {
	t0 := time.Now()
	c, err := g.DialContext(ctx, "tcp", addr)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	br := bufio.NewReaderSize(c, 64<<10)
	if target != "" {
		fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target)
		resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
		if err != nil {
			return 0, err
		}
		if resp.StatusCode != 200 {
			return 0, fmt.Errorf("CONNECT: %s", resp.Status)
		}
	}
	fmt.Fprintf(c, "GET /bulk?n=%d HTTP/1.1\r\nHost: origin\r\nConnection: close\r\n\r\n", n)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return 0, err
	}
	got, err := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err != nil || got != n {
		return 0, fmt.Errorf("read %d of %d bytes: %v", got, n, err)
	}
	return time.Since(t0), nil
}

// signed formats a difference with its sign.
func signed(d time.Duration) string {
	if d < 0 {
		return "-" + report.Fmt(-d)
	}
	return "+" + report.Fmt(d)
}

func mibps(n int64, d time.Duration) float64 { return float64(n) / (1 << 20) / d.Seconds() }

func ratio(a, b time.Duration) float64 {
	if b <= 0 {
		return 0
	}
	return float64(a) / float64(b)
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	return s[len(s)/2]
}

// pools is the claim rounds' setup on one hypervisor.
type pools struct {
	// hv is the config's hypervisor keys (a JSON fragment).
	hv string
	// warm VMs per pool, claims per pool.
	warm, claims int
	// ready bounds the wait for full pools, settle a quiet wait.
	ready, settle time.Duration
	// kill stops the VMMs left under the data dir.
	kill func(dir string)
	// after runs with the node up once the claims are measured (nil: none).
	after func(r *netnstest.Runner, c *apiclient.Client, hc *http.Client, lane *netnstest.Lane, addr string) error
}

func claimRounds(ctx context.Context, r *netnstest.Runner, cfg config, scratch string, sec *report.Section) error {
	return claimRoundsOn(ctx, r, scratch, sec, pools{hv: `"hypervisor":"chsim"`, warm: 6, claims: cfg.claims, ready: 2 * time.Minute, settle: 10 * time.Second, kill: killChsims})
}

func claimRoundsOn(ctx context.Context, r *netnstest.Runner, scratch string, sec *report.Section, pl pools) error {
	bin := filepath.Join(scratch, "egressbench-bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		return err
	}
	if _, err := chsimbin.Build(bin); err != nil {
		return err
	}
	sandboxd := filepath.Join(bin, "sandboxd")
	if out, err := exec.CommandContext(ctx, "go", "build", "-o", sandboxd, "github.com/sbxlog/sbxlog/cmd/sandboxd").CombinedOutput(); err != nil {
		return fmt.Errorf("egressbench: build sandboxd: %v: %s", err, out)
	}
	lane := netnstest.NewLane(r)
	// A short data dir: a VM's sockets must fit a unix socket path.
	dir, err := os.MkdirTemp("", "egb")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	addr := lane.HostAddr.String() + ":7777"
	cfgPath := filepath.Join(dir, "sandboxd.json")
	// The egress pool has a policy, so its claims pin one and answer
	// net_route relay (the view's lookup on the claim path).
	poolCfg := fmt.Sprintf(`[{"template":"default","net":"none","size":"small","warm":%d},{"template":"default","net":"egress","size":"small","warm":%d,"egress":{"allow":[{"host":"*"}]}}]`, pl.warm, pl.warm)
	conf := fmt.Sprintf(`{"listen":%q,"data_dir":%q,"node_id":"bench","api_token":"root",%s,"bridge":%q,"egress_proxy":{},"pools":%s,"nats":{"disabled":true},"log_level":"warn"}`,
		addr, filepath.Join(dir, "data"), pl.hv, lane.Bridge, poolCfg)
	if err := os.WriteFile(cfgPath, []byte(conf), 0o600); err != nil {
		return err
	}
	cmd := exec.Command("nsenter", "--net="+lane.Host.Path(), "--", sandboxd, "-config", cfgPath)
	out := &lockedBuffer{}
	cmd.Stderr = out
	if err := cmd.Start(); err != nil {
		return err
	}
	defer func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		pl.kill(filepath.Join(dir, "data"))
	}()
	hc := &http.Client{Transport: &http.Transport{DialContext: lane.Host.DialContext}}
	c, err := apiclient.New(addr, "root", hc)
	if err != nil {
		return err
	}
	// warm reports the warm VMs of each pool, counting a pool with a
	// refill in flight as short (its clone competes with the claim).
	warm := func() (none, egress int, err error) {
		info, err := c.Info(ctx)
		if err != nil {
			return 0, 0, err
		}
		for _, p := range info.Pools {
			w := p.Warm
			if p.Refilling > 0 {
				w = 0
			}
			switch p.Key.Net {
			case "none":
				none = w
			case "egress":
				egress = w
			}
		}
		return none, egress, nil
	}
	// quiet waits until both pools are full and idle, then a little more
	// (the destroy of the last released VM), so a claim is timed alone.
	quiet := func() {
		for w := time.Now().Add(pl.settle); time.Now().Before(w); time.Sleep(20 * time.Millisecond) {
			if n, e, err := warm(); err == nil && n >= pl.warm && e >= pl.warm {
				break
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	deadline := time.Now().Add(pl.ready)
	for {
		n, e, err := warm()
		if err == nil && n >= pl.warm && e >= pl.warm {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("egressbench: pools not warm after %s (%d, %d, %v); sandboxd said: %s", pl.ready, n, e, err, lastLines(out.String(), 2000))
		}
		time.Sleep(100 * time.Millisecond)
	}
	claim := func(netMode string) (time.Duration, bool, error) {
		t0 := time.Now()
		resp, err := c.Claim(ctx, api.ClaimRequest{Template: "default", Net: netMode, Size: "small"})
		d := time.Since(t0)
		if err != nil {
			return 0, false, err
		}
		if err := c.Release(ctx, resp.ID); err != nil {
			return 0, false, err
		}
		if want := map[string]string{"none": "none", "egress": "relay"}[netMode]; resp.Tier == "warm" && resp.NetRoute != want {
			return 0, false, fmt.Errorf("egressbench: a warm %s claim answered net_route %q, want %q", netMode, resp.NetRoute, want)
		}
		return d, resp.Tier == "warm", nil
	}
	// Warm up the API path, untimed.
	for range 3 {
		for _, m := range []string{"none", "egress"} {
			if _, _, err := claim(m); err != nil {
				return err
			}
		}
	}
	var none, egress report.Durations
	for i := 0; len(none) < pl.claims || len(egress) < pl.claims; i++ {
		if i > 4*pl.claims {
			return fmt.Errorf("egressbench: only %d/%d warm claims in %d tries", len(none), len(egress), i)
		}
		// Alternate which pool goes first.
		order := []string{"none", "egress"}
		if i%2 == 1 {
			order = []string{"egress", "none"}
		}
		for _, m := range order {
			quiet()
			d, isWarm, err := claim(m)
			if err != nil {
				return err
			}
			switch {
			case !isWarm:
			case m == "none" && len(none) < pl.claims:
				none = append(none, d)
			case m == "egress" && len(egress) < pl.claims:
				egress = append(egress, d)
			}
		}
	}
	n50, e50 := none.Quantile(0.5), egress.Quantile(0.5)
	sec.AddRow("warm claim p50", report.Fmt(n50), report.Fmt(e50), fmt.Sprintf("%.2fx", ratio(e50, n50)))
	sec.AddRow("warm claim p99", report.Fmt(none.Quantile(0.99)), report.Fmt(egress.Quantile(0.99)), fmt.Sprintf("%.2fx", ratio(egress.Quantile(0.99), none.Quantile(0.99))))
	rt := ratio(e50, n50)
	sec.Verdict(rt <= 1.10, "warm claim of an egress pool p50 %s vs net none %s: %.2fx (target <= 1.10x; the claim path touches no netlink)", report.Fmt(e50), report.Fmt(n50), rt)
	if pl.after != nil {
		quiet()
		return pl.after(r, c, hc, lane, addr)
	}
	return nil
}

// lockedBuffer is sandboxd's stderr, read while it writes.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func lastLines(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// killChsims kills the chsim processes whose command line names dir (VMs
// outlive sandboxd by design).
func killChsims(dir string) { killVMMs(dir, "chsim") }

// killVMMs kills the processes named bin whose command line names dir.
func killVMMs(dir, bin string) {
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		raw, err := os.ReadFile(p)
		if err != nil || !bytes.Contains(raw, []byte(dir)) {
			continue
		}
		if argv0, _, _ := bytes.Cut(raw, []byte{0}); filepath.Base(string(argv0)) != bin {
			continue
		}
		pid, err := strconv.Atoi(filepath.Base(filepath.Dir(p)))
		if err == nil && pid != os.Getpid() {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}
