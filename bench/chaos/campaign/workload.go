package campaign

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/sbxlog/sbxlog/executors/ch"
	"github.com/sbxlog/sbxlog/projections/api"
	"github.com/sbxlog/sbxlog/projections/apiclient"
)

// Outcomes of an HTTP operation.
const (
	outAcked       = "acked"       // 2xx: it happened and is durable
	outRejected    = "rejected"    // 4xx: the state refused it, nothing happened
	outUnavailable = "unavailable" // connection refused: nothing happened
	outUnknown     = "unknown"     // cut mid-way or 5xx: it may have happened
)

// outcomeOf classifies an operation's error.
func outcomeOf(err error) string {
	if err == nil {
		return outAcked
	}
	if st := apiclient.StatusOf(err); st >= 400 && st < 500 {
		return outRejected
	}
	if errors.Is(err, syscall.ECONNREFUSED) {
		return outUnavailable
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return outUnavailable
	}
	return outUnknown
}

// window is a wall-clock span (to 0: still open).
type window struct{ from, to time.Time }

func (w window) overlaps(a, b time.Time) bool {
	to := w.to
	if to.IsZero() {
		to = time.Now().Add(time.Hour)
	}
	return !a.After(to) && !b.Before(w.from)
}

// lifeOp is one lifecycle operation on a claim and its outcome.
type lifeOp struct {
	kind    string // claim, hibernate, wake, release
	outcome string
}

// claim is the campaign's model of one sandbox.
type claim struct {
	id, vm string
	// acked: the claim itself was acknowledged (else it is a phantom found
	// by listing, from a claim request whose answer was lost).
	acked bool
	ops   []lifeOp
	// deadlines: from the claim or the last acked renew (the last pair of
	// concurrent ones: the claim ends with one of them).
	deadlines []string
	// renewUnknown: a renew after the last acked one has an unknown
	// outcome, so the deadline may differ.
	renewUnknown bool
	busy         bool
	observed     string // last state seen
	// snap: the sums of its current hibernate snapshot, recorded while
	// hibernated; snapMarker: the disk data they must contain.
	snap       *Sums
	marker     string // the last data written to its disk
	template   string // its pool's template (acked claims)
	markers    int
	verifyWake bool // a wake was acked and its restore is not verified yet
	vmmKills   []time.Time
}

func (cl *claim) live() bool {
	for _, o := range cl.ops {
		if o.kind == "release" && o.outcome == outAcked {
			return false
		}
	}
	return cl.observed != "released" && cl.observed != "failed" && cl.observed != "expired"
}

// poolsModel is the history of PUT /v1/pools.
type poolsModel struct {
	hist []poolsPut
}

type poolsPut struct {
	outcome string
	pools   []PoolConf
}

func (p *poolsModel) acked(_ int, pools []PoolConf) {
	p.hist = append(p.hist, poolsPut{outAcked, pools})
}

// worker runs random operations until ctx ends.
func (c *campaign) worker(ctx context.Context, n int) {
	cl := c.a.Client(30 * time.Second)
	for ctx.Err() == nil {
		switch r := c.intn(100 + storeWeight); {
		case r < 22:
			c.doClaim(ctx, cl)
		case r < 38:
			c.withClaim(ctx, cl, "running", c.doHibernate)
		case r < 54:
			c.withClaim(ctx, cl, "hibernated", c.doWake)
		case r < 64:
			c.withClaim(ctx, cl, "", c.doRelease)
		case r < 74:
			c.withClaim(ctx, cl, "", c.doRenew)
		case r < 86:
			c.withClaim(ctx, cl, "running", c.doWrite)
		case r < 92:
			c.doPools(ctx, cl)
		case r < 99:
			c.sweep(ctx, cl)
		case r < 100:
			// A VMM dying while the daemon runs (its exit watcher), now
			// and then; the killer also kills some while it is down.
			if c.opt.VMMKills && c.intn(2) == 0 {
				c.killRandomVMM()
			}
		default:
			c.storeOp(ctx, cl, r-100)
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Duration(20+c.intn(200)) * time.Millisecond):
		}
	}
}

// liveCount is the number of claims the model thinks are live.
func (c *campaign) liveCount() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, cl := range c.claims {
		if cl.live() {
			n++
		}
	}
	return n
}

func (c *campaign) doClaim(ctx context.Context, cl *apiclient.Client) {
	if c.liveCount() >= maxLive {
		return
	}
	req := api.ClaimRequest{Template: "default", TTLSeconds: 3600}
	switch r := c.intn(12); {
	case r < 4:
		req.Template = poolAlt.Template
	case r < 7 && c.lane != nil:
		req.Template, req.Net = poolEgress.Template, poolEgress.Net
	}
	cr, err := cl.Claim(ctx, req)
	out := outcomeOf(err)
	if ctx.Err() != nil && out != outAcked {
		return
	}
	c.count("claim", out)
	if out == outAcked {
		c.addAcked(cr, "")
		return
	}
	// A claim answered 503 exists, pending or failed: a phantom.
	if m := claimIDRE.FindString(fmt.Sprint(err)); m != "" {
		c.addPhantom(m, "")
	}
}

var claimIDRE = regexp.MustCompile(`sb_[0-9a-f]{16}`)

func (c *campaign) addPhantom(id, vm string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.claims[id]; !ok {
		c.claims[id] = &claim{id: id, vm: vm}
		c.order = append(c.order, id)
	}
}

// withClaim picks an idle claim in state want ("" any live), refreshes its
// state and runs fn on it, the claim marked busy meanwhile.
func (c *campaign) withClaim(ctx context.Context, cl *apiclient.Client, want string, fn func(context.Context, *apiclient.Client, *claim)) {
	c.withClaimWhere(ctx, cl, want, func(*claim) bool { return true }, fn)
}

// withClaimWhere is withClaim among the claims ok accepts (under the
// campaign's lock).
func (c *campaign) withClaimWhere(ctx context.Context, cl *apiclient.Client, want string, ok func(*claim) bool, fn func(context.Context, *apiclient.Client, *claim)) {
	x, done := c.pick(func(x *claim) bool { return stateMatches(x.observed, want) && ok(x) })
	if x == nil {
		return
	}
	defer done()
	sb, err := cl.Sandbox(ctx, x.id)
	if err != nil {
		return
	}
	c.mu.Lock()
	x.observed, x.vm = sb.State, sb.VM
	c.mu.Unlock()
	// Settle what a previous operation left to check.
	if sb.State == "hibernated" && x.snap == nil && x.acked {
		c.recordSnapshot(x)
	}
	if sb.State == "running" && x.verifyWake {
		c.verifyWoken(ctx, x)
	}
	if !stateMatches(sb.State, want) {
		return
	}
	if !x.acked && want != "" {
		return // phantoms are only released
	}
	fn(ctx, cl, x)
}

// pick marks a random idle live claim that ok accepts busy and returns it
// with the function that frees it (nil when there is none). ok runs under
// the campaign's lock.
func (c *campaign) pick(ok func(*claim) bool) (*claim, func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	xs := make([]*claim, 0, len(c.order))
	for _, id := range c.order {
		xs = append(xs, c.claims[id])
	}
	return pickIdle(c, xs, func(x *claim) *bool { return &x.busy }, func(x *claim) bool { return x.live() && ok(x) })
}

// pickIdle marks a random idle item of items that ok accepts busy and
// returns it with the function that frees it (nil, nil when there is
// none). The caller holds the campaign's lock.
func pickIdle[T comparable](c *campaign, items []T, busy func(T) *bool, ok func(T) bool) (T, func()) {
	var cands []T
	for _, x := range items {
		if !*busy(x) && ok(x) {
			cands = append(cands, x)
		}
	}
	if len(cands) == 0 {
		var zero T
		return zero, nil
	}
	x := cands[c.rng.IntN(len(cands))]
	*busy(x) = true
	return x, func() { c.mu.Lock(); *busy(x) = false; c.mu.Unlock() }
}

func (c *campaign) addOp(x *claim, kind, out string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	x.ops = append(x.ops, lifeOp{kind, out})
}

// await polls the claim until its state is one of want, or d passes.
func (c *campaign) await(ctx context.Context, cl *apiclient.Client, x *claim, d time.Duration, want ...string) string {
	var st string
	_ = waitFor(ctx, d, func() bool {
		sb, err := cl.Sandbox(ctx, x.id)
		if err != nil {
			return false
		}
		st = sb.State
		c.mu.Lock()
		x.observed = st
		c.mu.Unlock()
		for _, w := range want {
			if st == w {
				return true
			}
		}
		return false
	})
	return st
}

// duplicates is how many identical requests a lifecycle operation sends at
// once: now and then two, as a client retrying over a slow answer does.
// The second often finds the change applied and its fsync in flight; its
// acknowledgement must not come before that change is durable, which the
// checks after a kill hold it to.
func (c *campaign) duplicates(kind string) int {
	if c.intn(3) == 0 {
		c.count("duplicate", kind)
		return 2
	}
	return 1
}

// concurrently runs n copies of fn at once and returns their errors.
func concurrently(n int, fn func() error) []error {
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range errs {
		wg.Go(func() { errs[i] = fn() })
	}
	wg.Wait()
	return errs
}

// lifecycle sends kind's request (maybe twice at once) and records every
// outcome; it reports whether any may have taken effect.
func (c *campaign) lifecycle(x *claim, kind string, fn func() error) (acked, any bool) {
	for _, err := range concurrently(c.duplicates(kind), fn) {
		out := outcomeOf(err)
		c.count(kind, out)
		if out == outRejected || out == outUnavailable {
			continue
		}
		c.addOp(x, kind, out)
		any = true
		acked = acked || out == outAcked
	}
	return acked, any
}

func (c *campaign) doHibernate(ctx context.Context, cl *apiclient.Client, x *claim) {
	if _, any := c.lifecycle(x, "hibernate", func() error { return cl.Hibernate(ctx, x.id) }); !any {
		return
	}
	if c.await(ctx, cl, x, 60*time.Second, "hibernated", "running", "failed") == "hibernated" {
		c.recordSnapshot(x)
	}
}

// recordSnapshot takes the sums of the claim's hibernate snapshot and checks
// it holds the data last written to the disk.
func (c *campaign) recordSnapshot(x *claim) {
	// The alt pool archives a hibernated claim: its local snapshot may go
	// while it is read, its archive then holding it (checked at the end).
	archivedAway := func() bool {
		if len(c.archivesOf(x.vm)) > 0 {
			c.checked("hibernate snapshots archived before recorded", 1)
			return true
		}
		return false
	}
	dir, err := latestSnapshot(filepath.Join(c.a.DataDir, "store"), x.vm)
	if err != nil {
		if !archivedAway() {
			c.violate("claim %s is hibernated but %v", x.id, err)
		}
		return
	}
	s, err := sumsOf(dir, filepath.Join(dir, diskFile))
	if err != nil {
		if !archivedAway() {
			c.violate("claim %s: snapshot %s unreadable: %v", x.id, dir, err)
		}
		return
	}
	if x.marker != "" {
		if got, err := readMarker(filepath.Join(dir, diskFile)); (err != nil || got != x.marker) && !archivedAway() {
			c.violate("claim %s: the hibernate snapshot's disk holds %q, the guest wrote %q before it (%v)", x.id, got, x.marker, err)
		}
	}
	c.mu.Lock()
	x.snap = &s
	c.mu.Unlock()
	c.checked("hibernate snapshots recorded", 1)
}

func (c *campaign) doWake(ctx context.Context, cl *apiclient.Client, x *claim) {
	if x.snap == nil {
		return
	}
	if _, any := c.lifecycle(x, "wake", func() error { return cl.Wake(ctx, x.id) }); !any {
		return
	}
	c.mu.Lock()
	x.verifyWake = true
	c.mu.Unlock()
	if c.await(ctx, cl, x, 60*time.Second, "running", "hibernated", "failed") == "running" {
		c.verifyWoken(ctx, x)
	}
}

// verifyWoken compares what the woken VM restored from with the sums taken
// at its hibernate.
func (c *campaign) verifyWoken(ctx context.Context, x *claim) {
	c.mu.Lock()
	snap := x.snap
	x.verifyWake = false
	x.snap = nil
	marker := x.marker
	c.mu.Unlock()
	if snap == nil {
		return
	}
	runDir := filepath.Join(c.a.DataDir, "run", c.instance(), x.vm)
	if _, err := os.Stat(filepath.Join(runDir, restoreDir, memoryFile)); err != nil {
		// Restarted (cold, from its disk) since: there is no restored
		// memory to compare any more.
		c.checked("woken VMs not verifiable (restarted first)", 1)
		return
	}
	got, err := sumsOf(filepath.Join(runDir, restoreDir), filepath.Join(runDir, diskFile))
	if err != nil {
		c.violate("claim %s: woken VM's run dir unreadable: %v", x.id, err)
		return
	}
	for _, f := range []struct{ what, got, want string }{{"memory-ranges", got.Memory, snap.Memory}, {"state.json", got.State, snap.State}, {"cow.raw", got.Disk, snap.Disk}} {
		if f.got != f.want {
			c.violate("claim %s (VM %s): woken from %s %s, hibernate stored %s", x.id, x.vm, f.what, f.got[:12], f.want[:12])
		}
	}
	if marker != "" {
		if m, err := readMarker(filepath.Join(runDir, diskFile)); err != nil || m != marker {
			c.violate("claim %s: woken disk holds %q, want %q (%v)", x.id, m, marker, err)
		}
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	counters, err := ch.New(filepath.Join(runDir, "api.sock")).Counters(cctx)
	if err == nil {
		if r := counters["chsim-guest"]["resumes"]; r <= snap.Resumes {
			c.violate("claim %s: woken guest has %d resumes, its snapshot %d: it does not run the restored memory", x.id, r, snap.Resumes)
		}
	}
	c.checked("woken VMs verified (memory, state, disk sums)", 1)
}

func (c *campaign) doRelease(ctx context.Context, cl *apiclient.Client, x *claim) {
	if acked, _ := c.lifecycle(x, "release", func() error { return cl.Release(ctx, x.id) }); acked {
		c.mu.Lock()
		x.observed = "released"
		c.mu.Unlock()
	}
}

func (c *campaign) doRenew(ctx context.Context, cl *apiclient.Client, x *claim) {
	if !x.acked {
		return
	}
	// Duplicates carry different TTLs: each must answer the deadline it
	// set, and the claim ends with one of the acknowledged ones.
	n := c.duplicates("renew")
	ttls := make([]int64, n)
	dls := make([]time.Time, n)
	for i := range ttls {
		ttls[i] = int64(1800 + c.intn(1800))
	}
	var next atomic.Int32
	errs := concurrently(n, func() error {
		i := next.Add(1) - 1
		var err error
		dls[i], err = cl.Renew(ctx, x.id, ttls[i])
		return err
	})
	for _, err := range errs {
		c.count("renew", outcomeOf(err))
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	var acked []string
	for i, err := range errs {
		switch outcomeOf(err) {
		case outAcked:
			acked = append(acked, dls[i].UTC().Format(time.RFC3339Nano))
		case outUnknown:
			x.renewUnknown = true
			return
		}
	}
	if len(acked) > 0 {
		x.deadlines, x.renewUnknown = acked, false
	}
}

// doWrite writes new data into a running claim's disk, as its guest would.
func (c *campaign) doWrite(_ context.Context, _ *apiclient.Client, x *claim) {
	disk := filepath.Join(c.a.DataDir, "run", c.instance(), x.vm, diskFile)
	x.markers++
	m := fmt.Sprintf("%s write %d", x.id, x.markers)
	if err := writeMarker(disk, m); err != nil {
		c.count("disk-write", "failed")
		return
	}
	c.mu.Lock()
	x.marker = m
	c.mu.Unlock()
	c.count("disk-write", "done")
}

func (c *campaign) doPools(ctx context.Context, cl *apiclient.Client) {
	main := poolMain
	main.Warm = 1 + c.intn(3)
	main.WarmMax = main.Warm + 1
	pools := []PoolConf{main}
	if c.intn(4) > 0 {
		alt := poolAlt
		alt.Warm = c.intn(3)
		alt.WarmMax = alt.Warm + 1
		pools = append(pools, alt)
	}
	for _, p := range c.egressPools() {
		p.Warm = c.intn(3)
		p.WarmMax = p.Warm + 1
		pools = append(pools, p)
	}
	req := api.PoolsRequest{}
	for _, p := range pools {
		req.Pools = append(req.Pools, api.PoolSpec{Template: p.Template, Net: p.Net, Size: p.Size, Warm: p.Warm, WarmMax: p.WarmMax, Egress: p.Egress, ArchiveAfterSeconds: p.ArchiveAfterSeconds})
	}
	_, err := cl.SetPools(ctx, req)
	out := outcomeOf(err)
	c.count("pools", out)
	if out == outAcked || out == outUnknown {
		c.mu.Lock()
		c.pools.hist = append(c.pools.hist, poolsPut{out, pools})
		c.mu.Unlock()
	}
}

// sweep lists the live sandboxes: claims the campaign does not know (their
// claim's answer was lost) join the model as phantoms, and one is released.
func (c *campaign) sweep(ctx context.Context, cl *apiclient.Client) {
	sbs, err := cl.Sandboxes(ctx, apiclient.ListOptions{})
	c.count("list", outcomeOf(err))
	if err != nil {
		return
	}
	for _, sb := range sbs {
		c.addPhantom(sb.ID, sb.VM)
	}
	c.withPhantom(ctx, cl)
}

func (c *campaign) withPhantom(ctx context.Context, cl *apiclient.Client) {
	x, done := c.pick(func(x *claim) bool { return !x.acked })
	if x == nil {
		return
	}
	defer done()
	c.doRelease(ctx, cl, x)
}

// instance is daemon a's instance id.
func (c *campaign) instance() string { return c.inst }

// killRandomVMM SIGKILLs the VMM of a running claim (at most twice per
// claim within the restart window, so the restart policy is not spent).
func (c *campaign) killRandomVMM() {
	now := time.Now()
	x, done := c.pick(func(x *claim) bool {
		recent := 0
		for _, t := range x.vmmKills {
			if now.Sub(t) < 10*time.Minute {
				recent++
			}
		}
		return x.acked && x.observed == "running" && !x.verifyWake && recent < 2
	})
	if x == nil {
		return
	}
	defer done()
	runDir := filepath.Join(c.a.DataDir, "run", c.instance(), x.vm)
	for _, p := range VMMsUnder(runDir) {
		if filepath.Dir(p.Socket) != runDir {
			continue
		}
		if syscall.Kill(p.Pid, syscall.SIGKILL) == nil {
			c.mu.Lock()
			x.vmmKills = append(x.vmmKills, time.Now())
			c.res.VMMKills++
			c.mu.Unlock()
			c.logf("killed VMM %d of %s (claim %s)", p.Pid, x.vm, x.id)
		}
	}
}

// expectedStates is what a claim's final state may be, from its operations:
// the state the last acked lifecycle operation asks for, or one a later
// operation of unknown outcome asks for.
func expectedStates(x *claim) map[string]bool {
	stateOf := map[string]string{"claim": "running", "wake": "running", "hibernate": "hibernated", "release": "released"}
	last := -1
	for i, o := range x.ops {
		if o.outcome == outAcked {
			last = i
		}
	}
	out := map[string]bool{}
	if last >= 0 {
		out[stateOf[x.ops[last].kind]] = true
	}
	for _, o := range x.ops[last+1:] {
		if o.outcome == outUnknown {
			out[stateOf[o.kind]] = true
		}
	}
	// The alt pool archives a hibernated claim (snapchecks.go).
	if out["hibernated"] {
		out["archived"] = true
	}
	return out
}

func joinKeys(m map[string]bool) string {
	var s []string
	for _, k := range sortedKeys(m) {
		s = append(s, k)
	}
	return strings.Join(s, "|")
}
