package campaign

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sbxlog/sbxlog/executors/egress/netnstest"
	"github.com/sbxlog/sbxlog/executors/egress/nft"
	"github.com/sbxlog/sbxlog/executors/tap"
	"github.com/sbxlog/sbxlog/fsm/egress"
	"github.com/sbxlog/sbxlog/projections/api"
)

// Egress traffic under crashes. chsim VMs send no packets, so a guest of
// the egress pool is played by a network namespace: for the campaign's own
// probe claim (a claim of the egress pool the workload never touches),
// netnstest.Lane.AttachGuest carries the namespace's NIC frames to and from
// the VM's real tap (made, locked and bridged by the daemon; chsim does not
// hold it), with the MAC and address the node pinned the VM to. What the
// guest sends therefore meets exactly the VM's lock, bridge port and door.
//
// The "internet" is the upstream: an HTTP server on two addresses of a
// namespace beyond the lane's host (startUpstream), upAllowed, which the
// egress pool's policy allows, and upDenied, which it does not but which would answer if
// anything let a request through. The upstream itself watches for leaks:
// any connection or request to upDenied, and any connection from a lane
// address other than the host's own (the proxy dials from the host), is a
// violation.
//
// Probes, four kinds (probeKinds):
//   - allowed: GET http://<upAllowed>/ through the VM's door (the forward
//     proxy) answers 200 with the upstream's body;
//   - denied: GET http://<upDenied>/ through the door answers 403;
//   - direct: a TCP connection straight to the upstream, bypassing the
//     proxy, never connects, and the tap's drop counters move;
//   - spoofed: a connection to the door from another lane address (a
//     second address on the guest's NIC) never connects, and the drop
//     counters move.
//
// A round of all four runs right after every restart (as soon as the new
// incarnation answers, after its lock check) and at the end. Its failures
// of the positive kind (no 200, no 403, counters still) count only if the
// probe claim still runs on the same VM in the same incarnation when the
// round ends: faults may take the VM's VMM away meanwhile. Leaks count
// always.
//
// Through every incarnation and across the kill that ends it (a SIGKILL
// or an armed crash), a loop in the same guest sends all four kinds, from
// the end of the round after the start until at least one pass ran while
// sandboxd was down. Whatever the phase, no leak: a denied host never
// answers 200, an allowed answer is the allowed upstream's, direct and
// spoofed connections never connect. While down (an attempt that started
// and ended after the process was reaped, before the next start), the
// door's listener is gone with the process, so requests through the door
// fail closed: no HTTP answer at all (the host refuses the connection).

var (
	upAllowed = netip.MustParseAddr("93.184.0.10")
	upDenied  = netip.MustParseAddr("93.184.0.11")
)

// egressPolicy is the egress pool's policy: the allowed upstream alone.
var egressPolicy = &api.PolicyJSON{Allow: []egress.Rule{{Host: upAllowed.String()}}}

// The probe kinds.
const (
	probeAllowed = "allowed"
	probeDenied  = "denied"
	probeDirect  = "direct"
	probeSpoofed = "spoofed"
)

var probeKinds = []string{probeAllowed, probeDenied, probeDirect, probeSpoofed}

const (
	// probeHTTPTimeout bounds a request through the door.
	probeHTTPTimeout = 5 * time.Second
	// probeDialTimeout bounds a direct or spoofed connection: on the
	// lane's veths a handshake that is let through completes in far less.
	probeDialTimeout = 200 * time.Millisecond
	// passWait bounds the wait for a pass of the across-kill loop.
	passWait = 15 * time.Second
)

// upstreamBody is what the upstream answers on addr.
func upstreamBody(addr netip.Addr) string { return "chaos upstream " + addr.String() }

// attempt is one probe and what it saw.
type attempt struct {
	kind string
	// down: it started and ended while sandboxd was down.
	down bool
	// strict: a round's probe, sent while the probe claim was verified
	// running; it must get the positive answer too.
	strict    bool
	status    int // HTTP status; 0 when there was no answer
	body      string
	err       error
	connected bool // direct, spoofed: the connection was established
	moved     bool // direct, spoofed (strict): the drop counters moved
}

// problem says what is wrong with a: leak is true for what must never
// happen whatever the VM's or the daemon's state; "" is none.
func (a attempt) problem() (msg string, leak bool) {
	switch a.kind {
	case probeAllowed, probeDenied:
		target := upAllowed
		if a.kind == probeDenied {
			target = upDenied
		}
		switch {
		case a.kind == probeDenied && a.status == http.StatusOK:
			return fmt.Sprintf("the denied host %s answered 200 through the proxy (%q)", target, a.body), true
		case a.status == http.StatusOK && a.body != upstreamBody(target):
			return fmt.Sprintf("the allowed host %s answered 200 with %q, not the upstream's body", target, a.body), true
		case a.down && a.status != 0:
			return fmt.Sprintf("%s host %s answered %d through the door while sandboxd was down (want no answer: the door's listener died with it)", a.kind, target, a.status), true
		case a.down && a.err == nil:
			return fmt.Sprintf("%s host %s: the request through the door did not fail while sandboxd was down", a.kind, target), true
		case a.strict && a.kind == probeAllowed && a.status != http.StatusOK:
			return fmt.Sprintf("the allowed host %s through the proxy: status %d %q, err %v (want 200)", target, a.status, a.body, a.err), false
		case a.strict && a.kind == probeDenied && a.status != http.StatusForbidden:
			return fmt.Sprintf("the denied host %s through the proxy: status %d %q, err %v (want 403)", target, a.status, a.body, a.err), false
		}
	case probeDirect, probeSpoofed:
		switch {
		case a.connected:
			return fmt.Sprintf("a %s connection from the guest was established (want dropped at the tap)", a.kind), true
		case a.strict && !a.moved:
			return fmt.Sprintf("a %s connection attempt did not move the tap's drop counters", a.kind), false
		}
	}
	return "", false
}

// upstream is the lane's "internet": it answers upstreamBody on each
// address and records every connection that shows a leak.
type upstream struct {
	subnet netip.Prefix
	host   netip.Addr // the lane's host address: the proxy's source
	srv    *http.Server
	mu     sync.Mutex
	leaks  []string
}

// saw judges one accepted connection.
func (u *upstream) saw(local, remote netip.Addr) {
	var leak string
	switch {
	case local == upDenied:
		leak = fmt.Sprintf("the denied upstream %s was reached (a connection from %s)", local, remote)
	case u.subnet.Contains(remote) && remote != u.host:
		leak = fmt.Sprintf("a connection from the lane address %s reached the upstream %s past the proxy", remote, local)
	default:
		return
	}
	u.mu.Lock()
	u.leaks = append(u.leaks, leak)
	u.mu.Unlock()
}

// asked judges one request: any the denied upstream gets is a leak.
func (u *upstream) asked(local netip.Addr, host string) {
	if local != upDenied {
		return
	}
	u.mu.Lock()
	u.leaks = append(u.leaks, fmt.Sprintf("the denied upstream %s was asked for %s", local, host))
	u.mu.Unlock()
}

// takeLeaks returns the leaks seen since the last call.
func (u *upstream) takeLeaks() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	l := u.leaks
	u.leaks = nil
	return l
}

// watched is a listener whose accepted connections the upstream judges.
type watched struct {
	net.Listener
	u     *upstream
	local netip.Addr
}

func (w watched) Accept() (net.Conn, error) {
	c, err := w.Listener.Accept()
	if err == nil {
		if ap, perr := netip.ParseAddrPort(c.RemoteAddr().String()); perr == nil {
			w.u.saw(w.local, ap.Addr().Unmap())
		}
	}
	return c, err
}

// The upstream's world, as in cmd/e2e's acceptance tests: an "internet"
// namespace on a veth from the lane's host namespace (wanHost there), the
// upstream's addresses on its end, routed back via the host. The host
// namespace forwards, so a direct connection from a guest routed via the
// bridge would reach the upstream: only the lock stops it. (The proxy's
// guard refuses the host's own addresses, so the upstream cannot live on
// the host namespace's loopback.)
var wanHost = netip.MustParsePrefix("93.184.0.1/24")

// startUpstream makes the internet namespace and serves the upstream on
// both addresses, until stop.
func startUpstream(lane *netnstest.Lane) (u *upstream, stop func(), err error) {
	u = &upstream{subnet: lane.Subnet, host: lane.HostAddr}
	u.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		local, _ := r.Context().Value(http.LocalAddrContextKey).(net.Addr)
		ap, _ := netip.ParseAddrPort(fmt.Sprint(local))
		// Per request too: the proxy may carry several over one
		// connection to the upstream.
		u.asked(ap.Addr().Unmap(), r.Host)
		_, _ = io.WriteString(w, upstreamBody(ap.Addr().Unmap()))
	})}
	release, err := held(func(r *netnstest.Runner) {
		inet := lane.Internet(r, wanHost, netip.PrefixFrom(upAllowed, wanHost.Bits()), netip.PrefixFrom(upDenied, wanHost.Bits()))
		inet.RouteDefault(r, wanHost.Addr())
		lane.Host.MustDo(r, func() error { return os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1\n"), 0o644) })
		for _, a := range []netip.Addr{upAllowed, upDenied} {
			ln, err := inet.Listen("tcp", netip.AddrPortFrom(a, 80).String())
			if err != nil {
				r.Fatalf("upstream %s: %v", a, err)
			}
			go func() { _ = u.srv.Serve(watched{ln, u, a}) }()
		}
	})
	if err != nil {
		return nil, nil, err
	}
	return u, func() { u.srv.Close(); release() }, nil
}

// held runs setup in a netnstest scope (namespaces, links) that lasts
// until release is called; a setup that fails ends it at once.
func held(setup func(r *netnstest.Runner)) (release func(), err error) {
	ready := make(chan error, 1)
	rel := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		err := netnstest.Run(func(r *netnstest.Runner) error {
			setup(r)
			ready <- nil
			<-rel
			return nil
		})
		if err != nil {
			ready <- err
		}
	}()
	if err := <-ready; err != nil {
		<-done
		return nil, err
	}
	return func() { close(rel); <-done }, nil
}

// probeGuest is the namespace playing the probe claim's guest, attached to
// its VM's tap for as long as the VM serves the claim.
type probeGuest struct {
	vm      string
	lock    nft.Lock
	g       *netnstest.Guest
	spoof   netip.Addr
	hc      *http.Client
	release func()
}

// spoofAddr is a lane address that is not the guest's.
func spoofAddr(guest netip.Addr) netip.Addr {
	a := netip.MustParseAddr("10.77.0.250")
	if a == guest {
		a = a.Next()
	}
	return a
}

// attachGuest attaches a guest namespace to the VM's tap, with its lock's
// identity and a second (spoofed) address, in a scope that lasts until
// release is called.
func attachGuest(lane *netnstest.Lane, vm, tapName string, lock nft.Lock) (*probeGuest, error) {
	pg := &probeGuest{vm: vm, lock: lock, spoof: spoofAddr(lock.GuestIP)}
	release, err := held(func(r *netnstest.Runner) {
		pg.g = lane.AttachGuest(r, "probe-"+vm, tapName, lock.GuestMAC, lock.GuestIP)
		pg.g.AddrAdd(r, "eth0", netip.PrefixFrom(pg.spoof, 32))
	})
	if err != nil {
		return nil, err
	}
	pg.release = release
	door, _ := url.Parse("http://" + lock.Door.String())
	pg.hc = &http.Client{Timeout: probeHTTPTimeout, Transport: &http.Transport{
		Proxy:             http.ProxyURL(door),
		DialContext:       pg.g.DialContext,
		DisableKeepAlives: true, // each probe is a new connection to the door
	}}
	return pg, nil
}

// get sends GET http://<target>/ through the door.
func (pg *probeGuest) get(ctx context.Context, target netip.Addr) attempt {
	a := attempt{kind: probeAllowed}
	if target == upDenied {
		a.kind = probeDenied
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+target.String()+"/", nil)
	if err != nil {
		a.err = err
		return a
	}
	resp, err := pg.hc.Do(req)
	if err != nil {
		a.err = err
		return a
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 4096))
	a.status, a.body, a.err = resp.StatusCode, strings.TrimSpace(string(b)), err
	return a
}

// dial tries a connection from src (invalid: the guest's own address) to
// dst and reports whether it was established.
func (pg *probeGuest) dial(ctx context.Context, src netip.Addr, dst netip.AddrPort) bool {
	var c net.Conn
	_ = pg.g.Do(func() error {
		d := net.Dialer{Timeout: probeDialTimeout}
		if src.IsValid() {
			d.LocalAddr = &net.TCPAddr{IP: src.AsSlice()}
		}
		var err error
		c, err = d.DialContext(ctx, "tcp", dst.String())
		return err
	})
	if c != nil {
		c.Close()
		return true
	}
	return false
}

// probe sends one probe of kind.
func (pg *probeGuest) probe(ctx context.Context, kind string) attempt {
	switch kind {
	case probeAllowed:
		return pg.get(ctx, upAllowed)
	case probeDenied:
		return pg.get(ctx, upDenied)
	case probeDirect:
		return attempt{kind: kind, connected: pg.dial(ctx, netip.Addr{}, netip.AddrPortFrom(upAllowed, 80))}
	default:
		return attempt{kind: kind, connected: pg.dial(ctx, pg.spoof, pg.lock.Door)}
	}
}

// prober is the campaign's egress traffic: the upstream, the probe claim
// and its guest.
type prober struct {
	up     *upstream
	stopUp func()
	// claim is the probe claim's id ("" when it has none) and guest its
	// attached guest (nil when none).
	claim string
	guest *probeGuest
}

// startProber starts the upstream in the lane.
func (c *campaign) startProber() error {
	up, stop, err := startUpstream(c.lane)
	if err != nil {
		return err
	}
	c.probes = &prober{up: up, stopUp: stop}
	return nil
}

// stopProber detaches the guest and stops the upstream.
func (c *campaign) stopProber() {
	if c.probes == nil {
		return
	}
	c.dropGuest()
	c.probes.stopUp()
}

func (c *campaign) dropGuest() {
	if g := c.probes.guest; g != nil {
		g.release()
		c.probes.guest = nil
	}
}

// leaks turns what the upstream saw into violations.
func (c *campaign) leaks(when string) {
	for _, l := range c.probes.up.takeLeaks() {
		c.violate("%s: egress leak: %s", when, l)
	}
}

// probeClaim returns the running probe claim and its VM, claiming one from
// the egress pool when there is none (ok false: none now). The claim joins
// the workload's model (so the end checks hold it to its acknowledged
// state too) marked busy forever, so the workload never touches it.
func (c *campaign) probeClaim(ctx context.Context) (id, vm string, ok bool) {
	cl := c.a.Client(10 * time.Second)
	if id = c.probes.claim; id != "" {
		sb, err := cl.Sandbox(ctx, id)
		switch {
		case err != nil:
			return "", "", false
		case sb.State == "running":
			return id, sb.VM, true
		case sb.State == "pending" || sb.State == "waking" || sb.State == "hibernating":
			return "", "", false
		}
		// Gone (failed with its VMM, or expired): the model checks it at
		// the end like any other claim; a new one takes its place.
		c.mu.Lock()
		if x := c.claims[id]; x != nil {
			x.observed = sb.State
		}
		c.mu.Unlock()
		c.probes.claim = ""
		c.dropGuest()
	}
	cr, err := cl.Claim(ctx, api.ClaimRequest{Template: poolEgress.Template, Net: poolEgress.Net, Size: poolEgress.Size, TTLSeconds: 3600})
	out := outcomeOf(err)
	c.count("probe-claim", out)
	if out != outAcked {
		if m := claimIDRE.FindString(fmt.Sprint(err)); m != "" {
			c.addPhantom(m, "")
		}
		return "", "", false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	x, seen := c.claims[cr.ID]
	if seen && x.busy {
		// A listing found it before this answer and a worker is on it
		// (releasing a phantom): let it.
		x.acked, x.vm, x.deadlines = true, cr.VM, []string{cr.Deadline}
		x.ops = append([]lifeOp{{"claim", outAcked}}, x.ops...)
		return "", "", false
	}
	if !seen {
		x = &claim{id: cr.ID, observed: "running"}
		c.claims[cr.ID] = x
		c.order = append(c.order, cr.ID)
	}
	x.acked, x.vm, x.deadlines, x.busy = true, cr.VM, []string{cr.Deadline}, true
	x.ops = append([]lifeOp{{"claim", outAcked}}, x.ops...)
	c.probes.claim = cr.ID
	return cr.ID, cr.VM, true
}

// lockOf reads the lock of vm's tap in the lane's host namespace (ok false:
// none, or not a whole lock).
func (c *campaign) lockOf(vm string) (nft.State, bool) {
	var st nft.State
	err := c.lane.Host.Do(func() error {
		var err error
		st, err = nft.OwnerOf(c.instance()).Inspect(tap.Name(c.instance(), vm))
		return err
	})
	return st, err == nil && st.OK
}

// dropped is the drop counters' packets of vm's lock (ok false: unreadable).
func (c *campaign) dropped(vm string) (uint64, bool) {
	st, ok := c.lockOf(vm)
	return st.Counters.Dropped().Packets, ok
}

// probeRound runs the four probes once from the probe claim's guest, with
// sandboxd up (right after a restart, or at the end).
func (c *campaign) probeRound(ctx context.Context, when string) {
	if c.probes == nil || !c.a.Running() {
		return
	}
	defer c.leaks(when)
	pid := c.a.Pid()
	id, vm, ok := c.probeClaim(ctx)
	if !ok {
		c.checked("egress probe rounds without a running probe claim", 1)
		return
	}
	st, ok := c.lockOf(vm)
	if !ok {
		// The lock check reports a running egress VM without its lock.
		c.checked("egress probe rounds void (probe VM changing)", 1)
		return
	}
	if g := c.probes.guest; g != nil && (g.vm != vm || !g.lock.Equal(st.Lock)) {
		c.dropGuest()
	}
	if c.probes.guest == nil {
		g, err := attachGuest(c.lane, vm, st.Tap, st.Lock)
		if err != nil {
			c.violate("%s: attach a guest namespace to the probe VM %s's tap: %v", when, vm, err)
			return
		}
		c.probes.guest = g
	}
	g := c.probes.guest
	var got []attempt
	for _, k := range probeKinds {
		before, _ := c.dropped(vm)
		a := g.probe(ctx, k)
		a.strict = true
		if k == probeDirect || k == probeSpoofed {
			after, _ := c.dropped(vm)
			a.moved = after > before
		}
		got = append(got, a)
	}
	// Positive failures count only if nothing changed under the probes.
	still := func() bool {
		if c.a.Pid() != pid {
			return false
		}
		sb, err := c.a.Client(10*time.Second).Sandbox(ctx, id)
		if err != nil || sb.State != "running" || sb.VM != vm {
			return false
		}
		now, ok := c.lockOf(vm)
		return ok && now.Lock.Equal(st.Lock) && c.vmClaimed(ctx, vm)
	}
	var voided bool
	for _, a := range got {
		msg, leak := a.problem()
		switch {
		case msg == "":
			c.checked(roundCheck[a.kind], 1)
		case leak:
			c.violate("%s: probe VM %s: %s", when, vm, msg)
		case !voided && !still():
			voided = true
		case !voided:
			c.violate("%s: probe VM %s (claim %s): %s", when, vm, id, msg)
		}
	}
	if voided {
		c.checked("egress probe rounds void (probe VM changing)", 1)
		c.dropGuest()
	}
}

// roundCheck names what a round's probe of each kind confirmed.
var roundCheck = map[string]string{
	probeAllowed: "egress probes: allowed host 200 through the proxy",
	probeDenied:  "egress probes: denied host 403",
	probeDirect:  "egress probes: direct connection dropped, counter moved",
	probeSpoofed: "egress probes: spoofed source dropped, counter moved",
}

// vmClaimed reports whether the VM view has vm claimed (not restarting
// after its VMM died).
func (c *campaign) vmClaimed(ctx context.Context, vm string) bool {
	vms, err := vmView(ctx, c.a.Client(10*time.Second))
	if err != nil {
		return false
	}
	for _, v := range vms {
		if v.Name == vm {
			return v.State == "claimed"
		}
	}
	return false
}

// Phases of the daemon during the across-kill loop.
const (
	phaseUp      int32 = iota // the incarnation runs (the kill may land)
	phaseKilling              // SIGKILL sent, not yet reaped
	phaseDown                 // reaped (or crashed); the next start not begun
)

// across is the loop probing from the probe guest across one kill.
type across struct {
	c     *campaign
	g     *probeGuest
	phase atomic.Int32
	stop  chan struct{}
	done  chan struct{}
	mu    sync.Mutex
	got   []attempt
	// downPasses counts the loop's whole passes (all kinds) that started
	// and ended while the daemon was down.
	downPasses int
	cond       *sync.Cond
}

// startAcross starts the loop in the probe guest (nil without one), for
// the rest of the incarnation: the kill that ends it lands on traffic in
// flight.
func (c *campaign) startAcross(ctx context.Context) *across {
	if c.probes == nil || c.probes.guest == nil {
		return nil
	}
	x := &across{c: c, g: c.probes.guest, stop: make(chan struct{}), done: make(chan struct{})}
	x.cond = sync.NewCond(&x.mu)
	started := make(chan struct{})
	go x.loop(ctx, started)
	<-started
	return x
}

func (x *across) loop(ctx context.Context, started chan<- struct{}) {
	defer close(x.done)
	close(started)
	for {
		select {
		case <-x.stop:
			return
		default:
		}
		passFrom := x.phase.Load()
		for _, k := range probeKinds {
			from := x.phase.Load()
			a := x.g.probe(ctx, k)
			a.down = from == phaseDown && x.phase.Load() == phaseDown
			x.mu.Lock()
			x.got = append(x.got, a)
			x.mu.Unlock()
		}
		to := x.phase.Load()
		x.mu.Lock()
		if passFrom == phaseDown && to == phaseDown {
			x.downPasses++
		}
		x.cond.Broadcast()
		x.mu.Unlock()
	}
}

// awaitDown waits for a whole pass while the daemon is down (bounded: a
// pass that hangs is the probes' timeouts, not a reason to stall the
// campaign).
func (x *across) awaitDown() {
	deadline := time.AfterFunc(passWait, func() { x.mu.Lock(); x.cond.Broadcast(); x.mu.Unlock() })
	defer deadline.Stop()
	start := time.Now()
	x.mu.Lock()
	defer x.mu.Unlock()
	for n := x.downPasses; x.downPasses == n && time.Since(start) < passWait; {
		x.cond.Wait()
	}
}

// killing marks the SIGKILL about to be sent.
func (x *across) killing() {
	if x != nil {
		x.phase.Store(phaseKilling)
	}
}

// finish marks the daemon down, waits for a pass while it is, stops the
// loop and judges every attempt.
func (x *across) finish(when string) {
	if x == nil {
		return
	}
	x.phase.Store(phaseDown)
	x.awaitDown()
	x.end(when)
}

// end stops the loop and judges every attempt.
func (x *across) end(when string) {
	if x == nil {
		return
	}
	close(x.stop)
	<-x.done
	down, all := 0, 0
	for _, a := range x.got {
		if msg, _ := a.problem(); msg != "" {
			x.c.violate("%s: probe VM %s across the kill: %s", when, x.g.vm, msg)
			continue
		}
		all++
		if a.down {
			down++
		}
	}
	x.c.checked("egress probes while up and across a kill (no leak)", all)
	x.c.checked("egress probes while down (failed closed)", down)
	x.c.leaks(when)
}
