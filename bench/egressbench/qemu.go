package egressbench

import (
	"context"
	"errors"
	"fmt"
	"net/http"
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
// the project's guest, and the latency the proxy adds to a request made
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
		"Proxy from inside the guest: one claimed egress VM, through the exec data plane, %d busybox wget runs to a server in the guest itself "+
		"(busybox httpd on 127.0.0.1, NO_PROXY) and %d through the proxy (its environment's http_proxy, the VM's door) to an upstream on the "+
		"host (93.184.0.10, the host namespace's loopback), timed by /proc/uptime in the guest; the added latency is the difference of the "+
		"per-request means (each run pays the same wget start under TCG).", pl.warm, claims, requests, requests)
	return sec, nil
}

// guestRounds claims an egress VM and times, inside its guest, requests
// through the proxy against requests to a server in the guest.
func guestRounds(ctx context.Context, r *netnstest.Runner, c *apiclient.Client, hc *http.Client, lane *netnstest.Lane, addr string, n int, sec *report.Section) error {
	stop, err := serveUpstream(r, lane)
	if err != nil {
		return err
	}
	defer stop()
	resp, err := c.Claim(ctx, api.ClaimRequest{Template: "default", Net: "egress", Size: "small"})
	if err != nil {
		return err
	}
	defer c.Release(context.WithoutCancel(ctx), resp.ID)
	gc, err := apiclient.New(addr, resp.Token, hc)
	if err != nil {
		return err
	}
	script := fmt.Sprintf(`set -e
mkdir -p /tmp/www && echo hello >/tmp/www/small
httpd -p 127.0.0.1:8080 -h /tmp/www
up() { cut -d' ' -f1 /proc/uptime; }
wget -q -O /dev/null http://127.0.0.1:8080/small; wget -q -O /dev/null http://%[1]s/small
a=$(up); i=0; while [ $i -lt %[2]d ]; do wget -q -O /dev/null http://127.0.0.1:8080/small; i=$((i+1)); done
b=$(up); i=0; while [ $i -lt %[2]d ]; do wget -q -O /dev/null http://%[1]s/small; i=$((i+1)); done
c=$(up); echo "$a $b $c"`, upstreamIP, n)
	ectx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	nc, err := gc.DialAgent(ectx, resp.ID)
	if err != nil {
		return err
	}
	defer nc.Close()
	var out, errb strings.Builder
	res, err := silkd.NewConn(nc).Exec(ectx, silkd.Exec{Argv: []string{"sh", "-c", script}}, silkd.ExecIO{Stdout: &out, Stderr: &errb})
	if err != nil || res.Code != 0 {
		return fmt.Errorf("egressqemubench: the guest's rounds: %d %v: %s", res.Code, err, errb.String())
	}
	f := strings.Fields(out.String())
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
	sec.AddRow("request from the guest, mean (busybox wget)", report.Fmt(local)+" (guest-local)", report.Fmt(proxied)+" (proxy)", fmt.Sprintf("%.2fx (%s)", ratio(proxied, local), signed(proxied-local)))
	sec.Notes = append(sec.Notes, fmt.Sprintf("Proxy added latency per request from inside the QEMU guest (TCG): %s (mean of %d).", report.Fmt(proxied-local), n))
	return nil
}
