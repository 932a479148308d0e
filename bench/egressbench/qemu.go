package egressbench

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/sbxlog/sbxlog/bench/report"
	"github.com/sbxlog/sbxlog/executors/egress/netnstest"
	"github.com/sbxlog/sbxlog/executors/guest/guesttest"
	"github.com/sbxlog/sbxlog/executors/guest/silkd"
	"github.com/sbxlog/sbxlog/projections/api"
	"github.com/sbxlog/sbxlog/projections/apiclient"
)

// RunQEMU is the egressqemubench section (`make bench BENCH=egressqemubench`):
// the same warm-claim comparison as Run's, on the QEMU driver (TCG) with
// the project's guest, and the time of a request through the proxy made
// from inside a real guest.
func RunQEMU(ctx context.Context, opts report.Options) (*report.Section, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("egressqemubench: needs root (network namespaces, nftables, taps)")
	}
	g, err := guesttest.Build(ctx)
	if err != nil {
		return nil, err
	}
	claims, requests := 10, 40
	if opts.Quick {
		claims, requests = 4, 10
	}
	sec := &report.Section{
		Title:  "Guarded egress on QEMU (TCG): warm claims, egress pool against net none; the proxy from inside a real guest",
		Header: []string{"measure", "direct / none", "proxy / egress", "ratio"},
	}
	pl := pools{
		hv:   fmt.Sprintf(`"hypervisor":"qemu","qemu":{"accel":"tcg","kernel":%q,"initrd":%q}`, g.Kernel, g.Initrd),
		warm: 2, claims: claims, ready: 10 * time.Minute, settle: 3 * time.Minute,
		kill: func(dir string) { killVMMs(dir, "qemu-system-x86_64") },
		after: func(r *netnstest.Runner, c *apiclient.Client, hc *http.Client, lane *netnstest.Lane, addr string) error {
			return guestRounds(ctx, r, c, hc, lane, addr, requests, sec)
		},
	}
	if err := netnstest.Run(func(r *netnstest.Runner) error { return claimRoundsOn(ctx, r, opts.Scratch, sec, pl) }); err != nil {
		return nil, err
	}
	sec.Method = fmt.Sprintf("The built sandboxd on the QEMU driver (accel tcg, the `make guest` image) in a host network namespace with an egress bridge "+
		"(10.77.0.1/24); pools default/none/small and default/egress/small (warm %d each; the egress pool allowing every host, every VM on its own "+
		"locked tap with its address pinned, its guest given its network over the serial port). %d claims per pool alternating, each released "+
		"(untimed) and timed once both pools are full with no refill in flight; only warm-tier claims count, client-side over keep-alive HTTP. "+
		"Proxy from inside the guest: one claimed egress VM, through the exec data plane, %d requests (busybox nc; HTTP/1.0 to the local server, HTTP/1.1 through the proxy) to a server in the guest itself "+
		"(busybox httpd on 127.0.0.1) and %d through the proxy (its environment's http_proxy, the VM's door) to an upstream in a "+
		"namespace beside the host's (93.184.0.10, on a veth), timed by /proc/uptime in the guest; the means are reported side by side (each pays the same nc start under TCG).", pl.warm, claims, requests, requests)
	return sec, nil
}

// guestRounds claims an egress VM and times, inside its guest, requests
// through the proxy against requests to a server in the guest.
func guestRounds(ctx context.Context, r *netnstest.Runner, c *apiclient.Client, hc *http.Client, lane *netnstest.Lane, addr string, n int, sec *report.Section) error {
	// The upstream in a namespace of its own beside the host's: the
	// proxy's guard refuses the host's own addresses.
	inet := lane.Internet(r, netip.MustParsePrefix("93.184.0.1/24"), netip.PrefixFrom(upstreamIP, 24))
	ln, err := inet.Listen("tcp", upstreamIP.String()+":80")
	if err != nil {
		return err
	}
	hs := &http.Server{Handler: http.HandlerFunc(upstream)}
	go hs.Serve(ln)
	defer hs.Close()
	resp, err := c.Claim(ctx, api.ClaimRequest{Template: "default", Net: "egress", Size: "small"})
	if err != nil {
		return err
	}
	defer c.Release(context.WithoutCancel(ctx), resp.ID)
	gc, err := apiclient.New(addr, resp.Token, hc)
	if err != nil {
		return err
	}
	// busybox nc for both legs (the static busybox wget crashes behind a
	// proxy): the same client start either way.
	script := fmt.Sprintf(`exec 2>&1
mkdir -p /tmp/www && echo hello >/tmp/www/small
httpd -p 127.0.0.1:8080 -h /tmp/www || echo "httpd failed"
p=${http_proxy#http://}; p=${p%%/}; ph=${p%%:*}; pp=${p##*:}
up() { cut -d' ' -f1 /proc/uptime; }
loc() { printf 'GET /small HTTP/1.0\r\n\r\n' | nc 127.0.0.1 8080 | grep -q hello; }
prx() { printf 'GET http://%[1]s/small HTTP/1.1\r\nHost: %[1]s\r\nConnection: close\r\n\r\n' | nc $ph $pp | grep -q origin; }
i=0; until loc; do i=$((i+1)); [ $i -lt 50 ] || { echo "the guest-local server does not answer"; exit 1; }; sleep 0.1; done
i=0; until prx; do i=$((i+1)); [ $i -lt 50 ] || { echo "no answer through the proxy $ph:$pp"; exit 1; }; sleep 0.2; done
a=$(up); i=0; while [ $i -lt %[2]d ]; do loc; i=$((i+1)); done
b=$(up); i=0; while [ $i -lt %[2]d ]; do prx; i=$((i+1)); done
c=$(up); echo "$a $b $c"`, upstreamIP, n)
	ectx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	// The API listens in the host namespace: dial from there.
	var nc net.Conn
	if err := lane.Host.Do(func() error {
		var err error
		nc, err = gc.DialAgent(ectx, resp.ID)
		return err
	}); err != nil {
		return err
	}
	defer nc.Close()
	var out, errb strings.Builder
	res, err := silkd.NewConn(nc).Exec(ectx, silkd.Exec{Argv: []string{"sh", "-c", script}}, silkd.ExecIO{Stdout: &out, Stderr: &errb})
	if err != nil || res.Code != 0 {
		return fmt.Errorf("egressqemubench: the guest's rounds: %d %v: %s%s", res.Code, err, out.String(), errb.String())
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	f := strings.Fields(lines[len(lines)-1])
	if len(f) != 3 {
		return fmt.Errorf("egressqemubench: the guest printed %q", out.String())
	}
	var t [3]float64
	for i := range f {
		if t[i], err = strconv.ParseFloat(f[i], 64); err != nil {
			return err
		}
	}
	local := time.Duration((t[1] - t[0]) / float64(n) * float64(time.Second))
	proxied := time.Duration((t[2] - t[1]) / float64(n) * float64(time.Second))
	sec.AddRow("request from the guest, mean (busybox nc)", report.Fmt(local)+" (guest-local httpd)", report.Fmt(proxied)+" (through the proxy)", fmt.Sprintf("%.2fx", ratio(proxied, local)))
	// The guest-local server forks per connection under TCG, so it is no
	// floor to subtract: the figure is the whole request through the proxy
	// as the guest sees it.
	sec.Notes = append(sec.Notes, fmt.Sprintf("A request through the proxy from inside the QEMU guest (TCG) takes %s on average (mean of %d, nc start included); "+
		"the guest-local comparator takes %s because busybox httpd forks per connection under TCG, so it bounds nothing from below: "+
		"the proxy's own cost is egressbench's figure.", report.Fmt(proxied), n, report.Fmt(local)))
	return nil
}
