// Package campaign is the kill -9 campaign behind bench/chaos (make chaos)
// and its shortened run in make test: a random workload over HTTP against a
// built sandboxd with chsim on a scratch data dir, while sandboxd is killed
// with SIGKILL at random moments (and, optionally, crashed at named recipe
// steps through the SBX_CRASH_AT seam, its VMMs killed, and chsim faults
// turned on for an incarnation), then checks that nothing was lost.
//
// Checks at the end (each failure is a Violation):
//   - every acknowledged operation is reflected in state: an acked claim
//     exists with its VM; an acked release is released; the final status is
//     the one the last acked lifecycle operation asks for (or one a later
//     operation with an unknown outcome asks for); an acked renew's
//     deadline stands; the last acked PUT /v1/pools is the configuration;
//   - no VM serves two live claims;
//   - no orphan VMM: every live chsim under the data dir belongs to a VM the
//     state says runs (and each such VM answers), and no run dir is left
//     that the state does not know;
//   - VMs of others are untouched: a second sandboxd on its own data dir
//     runs throughout with the same VMM processes and claims, and a VMM
//     planted under another instance id in this data dir's run root lives on
//     with its files unchanged;
//   - every woken sandbox restored exactly what its hibernate stored: the
//     content sums of memory-ranges, state.json and cow.raw in the woken
//     VM's run dir equal those of the snapshot taken at hibernate, the disk
//     holds the data the "guest" wrote before it, and the guest's resume
//     counter is past the snapshot's (it runs the restored memory);
//   - usage records agree with the log (when the daemon writes usage.jsonl:
//     one record per usage event of the log, none twice); otherwise the
//     check is reported as not applicable;
//   - the store recipes (snapshots.go, snapchecks.go): checkpoints (of
//     running and hibernated sandboxes), claims from them and deletes,
//     forks, promotes with claims from the template and its delete, and a
//     pool that archives hibernated claims (woken back by the workload):
//     every acked checkpoint is listed until deleted and claimable, every
//     clone holds its source's data, a fork is all or none, acked
//     templates survive until deleted, after collection the store holds
//     exactly what the state references (no half snapshot), and the
//     archive store one complete archive per archived VM holding what its
//     hibernate stored;
//   - with Options.Egress (an egress pool, the daemon in a network
//     namespace with a bridge): after every restart and at the end, every
//     egress VM whose VMM runs has its tap locked and no lock is left for a
//     VM the state no longer has (egress.go); and a network namespace
//     playing the guest of a probe claim of that pool, on its VM's tap,
//     gets 200 from the allowed upstream and 403 from a denied one through
//     the proxy, while its direct and spoofed connections are dropped at
//     the tap, after every restart and at the end; across every kill its
//     traffic never leaks and fails closed while the daemon is down
//     (egressprobe.go).
package campaign

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/sbxlog/sbxlog/executors/egress/netnstest"
	"github.com/sbxlog/sbxlog/projections/api"
	"github.com/sbxlog/sbxlog/projections/apiclient"
)

// Options shape a campaign.
type Options struct {
	Bins Binaries
	// Dir is the scratch directory (data dirs, configs, logs); it must be
	// short enough for unix socket paths. Default: a new temp dir, removed
	// at the end unless Keep.
	Dir  string
	Keep bool
	// Duration is the least time the workload runs; it goes on until Kills
	// SIGKILLs of sandboxd were done too.
	Duration time.Duration
	Kills    int
	Seed     uint64
	// Workers run the workload concurrently (default 3).
	Workers int
	// VMMKills kills random VMM processes of running claims now and then.
	VMMKills bool
	// Faults turns on chsim faults for some incarnations.
	Faults bool
	// CrashSteps arms SBX_CRASH_AT at a random recipe step for some
	// incarnations (counted apart from the SIGKILLs).
	CrashSteps bool
	// NATS runs the daemon with replication (embedded NATS), which writes
	// the usage journal the end checks compare with the log.
	NATS bool
	// Egress adds an egress pool: the daemon runs in a lane's namespace
	// with a bridge, its taps' locks are checked after every restart and
	// at the end (egress.go), and a probe guest sends egress traffic
	// (egressprobe.go). It needs root (EgressAvailable).
	Egress bool
	// Out receives progress lines (nil: discarded).
	Out io.Writer
}

// Result is what a campaign did and found.
type Result struct {
	Seed      uint64
	Elapsed   time.Duration
	Ops       map[string]map[string]int // op -> outcome -> count
	Kills     int                       // SIGKILLs of sandboxd by the campaign
	CrashAt   map[string]int            // SBX_CRASH_AT step -> crashes that fired
	VMMKills  int
	Faults    map[string]int // fault -> incarnations run with it
	Restarts  []time.Duration
	Checked   map[string]int // what the end checks looked at
	Notes     []string
	Violation []string
}

// Passed reports a campaign without violations.
func (r *Result) Passed() bool { return len(r.Violation) == 0 }

// Print writes the report.
func (r *Result) Print(w io.Writer) {
	fmt.Fprintf(w, "chaos campaign: seed %d, %s\n", r.Seed, r.Elapsed.Round(time.Second))
	fmt.Fprintf(w, "\noperations (outcome: acked = 2xx, rejected = 4xx, unavailable = connection refused, unknown = cut or 5xx):\n")
	for _, op := range sortedKeys(r.Ops) {
		var parts []string
		for _, o := range sortedKeys(r.Ops[op]) {
			parts = append(parts, fmt.Sprintf("%s %d", o, r.Ops[op][o]))
		}
		fmt.Fprintf(w, "  %-12s %s\n", op, strings.Join(parts, ", "))
	}
	var crashes int
	var steps []string
	for _, s := range sortedKeys(r.CrashAt) {
		crashes += r.CrashAt[s]
		steps = append(steps, fmt.Sprintf("%s×%d", s, r.CrashAt[s]))
	}
	fmt.Fprintf(w, "\nkills: %d SIGKILL of sandboxd at random moments, %d crashes at recipe steps (SBX_CRASH_AT) [%s], %d VMM processes killed\n",
		r.Kills, crashes, strings.Join(steps, " "), r.VMMKills)
	if len(r.Restarts) > 0 {
		d := slices.Clone(r.Restarts)
		slices.Sort(d)
		fmt.Fprintf(w, "restarts: %d, start to serving p50 %s, max %s\n", len(d), d[len(d)/2].Round(time.Millisecond), d[len(d)-1].Round(time.Millisecond))
	}
	var faults []string
	for _, f := range sortedKeys(r.Faults) {
		faults = append(faults, fmt.Sprintf("%s×%d", f, r.Faults[f]))
	}
	if len(faults) == 0 {
		faults = []string{"none"}
	}
	fmt.Fprintf(w, "faults (incarnations run with chsim faults): %s\n", strings.Join(faults, " "))
	fmt.Fprintf(w, "\nchecks:\n")
	for _, k := range sortedKeys(r.Checked) {
		fmt.Fprintf(w, "  %-40s %d\n", k, r.Checked[k])
	}
	for _, n := range r.Notes {
		fmt.Fprintf(w, "  note: %s\n", n)
	}
	fmt.Fprintf(w, "\nviolations: %d\n", len(r.Violation))
	for _, v := range r.Violation {
		fmt.Fprintf(w, "  VIOLATION: %s\n", v)
	}
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// Pools of the daemon under test: one refilled from a golden, one that is
// changed (and drained) by the workload.
var (
	poolMain = PoolConf{Template: "default", Net: "none", Size: "small", Warm: 2, WarmMax: 3}
	poolAlt  = PoolConf{Template: "alt", Net: "none", Size: "small", Warm: 1, WarmMax: 2, ArchiveAfterSeconds: archiveAfter}
)

// vmmEnv tunes every chsim: little guest memory data, instant balloon.
var vmmEnv = []string{"SBX_CHSIM_DIRTY_BYTES=256K", "SBX_CHSIM_BALLOON_RATE=0"}

// faultSets are the chsim faults an incarnation may run with.
var faultSets = map[string][]string{
	"latency-15ms":                 {"SBX_CHSIM_LATENCY=15ms"},
	"snapshot-fails-once":          {"SBX_CHSIM_FAIL=vm.snapshot:1:500"},
	"pause-fails-once":             {"SBX_CHSIM_FAIL=vm.pause:1:500"},
	"vmm-dies-mid-snapshot":        {"SBX_CHSIM_SNAPSHOT_EXIT_AFTER=64K"},
	"vmms-die-randomly-within-60s": {"SBX_CHSIM_EXIT_RANDOM=60s"},
	"restore-fails":                {"SBX_CHSIM_FAIL=vm.restore:1:500"},
}

// crashSteps are the SBX_CRASH_AT points an incarnation may die at.
var crashSteps = []string{
	"clone:restore", "clone:resume", "clone:probe", "clone:link_memory",
	"hibernate:snapshot", "hibernate:sync_files", "hibernate:write_meta", "hibernate:rename",
	"hibernate:sync_tree", "hibernate:shutdown", "hibernate:terminate",
	"wake:restore", "wake:resume", "wake:probe",
	"destroy:terminate", "destroy:remove_run", "destroy:remove_snap",
	"restart:boot", "restart:probe",
	// The store recipes (snapshots.go): a checkpoint of a running VM (a
	// fork's too: its children are clones) and of a hibernated one's
	// image, its delete, a promote, a collection, an archive and an
	// unarchive.
	"checkpoint:pause", "checkpoint:snapshot", "checkpoint:clone_disk", "checkpoint:resume",
	"checkpoint:sync_files", "checkpoint:rename", "checkpoint:sync_tree",
	"checkpoint:link_memory", "checkpoint:write_state",
	"checkpoint_delete:remove_snap",
	"promote:pause", "promote:snapshot", "promote:rename", "promote:resume", "promote:digest",
	"collect:discard",
	"archive:put", "archive:remove_local",
	"unarchive:get", "unarchive:rename", "unarchive:delete_archive",
}

// campaign is one run's shared state.
type campaign struct {
	opt  Options
	a, b *Daemon
	out  io.Writer

	mu     sync.Mutex
	rng    *rand.Rand
	res    *Result
	claims map[string]*claim
	order  []string
	pools  poolsModel
	inst   string // daemon a's instance id
	// armed is the SBX_CRASH_AT step of the running incarnation.
	armed string
	// faultWindows are the wall-clock spans of incarnations with faults.
	faultWindows []window

	foreign    VMMProc
	foreignDir string
	// lane is the egress lane daemon a runs in (nil without Options.Egress).
	lane *netnstest.Lane
	// probes is the egress traffic (nil without a lane).
	probes *prober
	// The store recipes' models (snapshots.go): acked checkpoints in the
	// order taken, and promotes.
	ckpts   []*ckptModel
	tmpls   []*tmplModel
	tmplSeq int

	bVMMs   map[int]string
	bClaims []string
	outMu   sync.Mutex // serialises logf's writes to out
}

// logf writes one line to the campaign's output; the workers, the killer
// and the probes all log, and the output need not be safe for concurrent
// writes (a test's bytes.Buffer is not).
func (c *campaign) logf(format string, args ...any) {
	if c.out != nil {
		line := fmt.Sprintf("%s "+format+"\n", append([]any{time.Now().Format("15:04:05.000")}, args...)...)
		c.outMu.Lock()
		defer c.outMu.Unlock()
		_, _ = io.WriteString(c.out, line)
	}
}

func (c *campaign) intn(n int) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.rng.IntN(n)
}

func (c *campaign) count(op, outcome string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.res.Ops[op] == nil {
		c.res.Ops[op] = map[string]int{}
	}
	c.res.Ops[op][outcome]++
}

func (c *campaign) violate(format string, args ...any) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.res.Violation = append(c.res.Violation, fmt.Sprintf(format, args...))
}

func (c *campaign) note(format string, args ...any) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.res.Notes = append(c.res.Notes, fmt.Sprintf(format, args...))
}

func (c *campaign) checked(what string, n int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.res.Checked[what] += n
}

// Run runs a campaign; the error is for a campaign that could not run at
// all (binaries, scratch dir, a daemon that never came up), violations are
// in the Result.
func Run(ctx context.Context, opt Options) (*Result, error) {
	if !opt.Egress {
		return run(ctx, opt, nil)
	}
	if err := EgressAvailable(); err != nil {
		return nil, err
	}
	var res *Result
	var err error
	if lerr := withLane(func(l *netnstest.Lane) error { res, err = run(ctx, opt, l); return nil }); lerr != nil {
		return res, fmt.Errorf("campaign: egress lane: %w", lerr)
	}
	return res, err
}

// run is Run with the egress lane, if any.
func run(ctx context.Context, opt Options, lane *netnstest.Lane) (*Result, error) {
	if opt.Workers <= 0 {
		opt.Workers = 3
	}
	if opt.Seed == 0 {
		opt.Seed = uint64(time.Now().UnixNano())
	}
	res := &Result{Seed: opt.Seed, Ops: map[string]map[string]int{}, CrashAt: map[string]int{}, Faults: map[string]int{}, Checked: map[string]int{}}
	start := time.Now()
	if opt.Dir == "" {
		d, err := os.MkdirTemp("", "chaos")
		if err != nil {
			return nil, err
		}
		opt.Dir = d
		if !opt.Keep {
			defer os.RemoveAll(d)
		}
	}
	c := &campaign{opt: opt, out: opt.Out, rng: rand.New(rand.NewPCG(opt.Seed, opt.Seed^0x9e3779b97f4a7c15)), res: res, claims: map[string]*claim{}, lane: lane}
	defer func() {
		// Leave nothing running: the daemons first, then every VMM
		// under the scratch dir (found by its socket path).
		for _, d := range []*Daemon{c.a, c.b} {
			if d != nil && d.Running() {
				_ = d.Signal(syscall.SIGTERM, 15*time.Second)
				if d.Running() {
					_ = d.Signal(syscall.SIGKILL, 5*time.Second)
				}
			}
		}
		c.stopProber()
		if n := KillVMMsUnder(opt.Dir); n > 0 {
			c.logf("cleanup: killed %d VMM processes under %s", n, opt.Dir)
		}
	}()
	if err := c.setup(ctx); err != nil {
		return res, err
	}
	if err := c.run(ctx); err != nil {
		return res, err
	}
	c.finalChecks(ctx)
	res.Elapsed = time.Since(start)
	return res, nil
}

// setup starts the second instance (B) and the daemon under test (A), and
// plants a foreign instance's VMM in A's run root.
func (c *campaign) setup(ctx context.Context) error {
	var err error
	c.b, err = NewDaemon("b", c.opt.Bins.Sandboxd, filepath.Join(c.opt.Dir, "b"), []PoolConf{{Template: "default", Net: "none", Size: "small", Warm: 1}}, false)
	if err != nil {
		return err
	}
	c.b.Env = vmmEnv
	if _, err := c.b.Start(ctx, nil, time.Minute); err != nil {
		return err
	}
	bc := c.b.Client(30 * time.Second)
	for range 2 {
		cr, err := claimWhenReady(ctx, bc)
		if err != nil {
			return fmt.Errorf("second instance: %w", err)
		}
		c.bClaims = append(c.bClaims, cr.ID)
	}
	if err := waitFor(ctx, time.Minute, func() bool {
		in, err := bc.Info(ctx)
		return err == nil && len(in.Pools) == 1 && in.Pools[0].Warm == 1
	}); err != nil {
		return fmt.Errorf("second instance never refilled: %w", err)
	}
	c.bVMMs = map[int]string{}
	for _, p := range VMMsUnder(c.b.DataDir) {
		c.bVMMs[p.Pid] = p.Socket
	}
	c.logf("second instance b: %d claims, %d VMMs", len(c.bClaims), len(c.bVMMs))

	pools := append([]PoolConf{poolMain, poolAlt}, c.egressPools()...)
	c.a, err = NewDaemon("a", c.opt.Bins.Sandboxd, filepath.Join(c.opt.Dir, "a"), pools, c.opt.NATS)
	if err != nil {
		return err
	}
	// The archive store of the alt pool's archives (snapchecks.go).
	if err := os.MkdirAll(c.archiveDir(), 0o700); err != nil {
		return err
	}
	if err := c.a.Configure(map[string]any{"archive_dir": c.archiveDir()}); err != nil {
		return err
	}
	c.a.Env = vmmEnv
	if c.lane != nil {
		if err := c.inLane(c.a); err != nil {
			return err
		}
		if err := c.startProber(); err != nil {
			return fmt.Errorf("egress upstream: %w", err)
		}
		c.note("egress pool %s/%s/%s on bridge %s in a network namespace; its VMs' tap locks checked after every restart and at the end", poolEgress.Template, poolEgress.Net, poolEgress.Size, c.lane.Bridge)
		c.note("egress traffic: a netns guest on the probe claim's VM tap (its pinned MAC and address), upstream %s allowed, %s denied; probes after every restart, at the end and across every kill", upAllowed, upDenied)
	}
	// Another instance id's VM in the same run root: started by hand, as
	// another daemon would have.
	c.foreignDir = filepath.Join(c.a.DataDir, "run", "i-foreign0", "vm-0f0f0f0f0f0f0f0f")
	if err := os.MkdirAll(c.foreignDir, 0o700); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(c.foreignDir, "cow.raw"), []byte("another instance's disk"), 0o600); err != nil {
		return err
	}
	if c.foreign, err = startDetachedVMM(c.opt.Bins.Chsim, filepath.Join(c.foreignDir, "api.sock")); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(c.foreignDir, "vmm.pid"), fmt.Appendf(nil, "%d\n", c.foreign.Pid), 0o600); err != nil {
		return err
	}
	d, err := c.a.Start(ctx, nil, time.Minute)
	if err != nil {
		return err
	}
	c.res.Restarts = append(c.res.Restarts, d)
	ac := c.a.Client(30 * time.Second)
	if err := waitFor(ctx, 2*time.Minute, func() bool {
		in, err := ac.Info(ctx)
		if err != nil || len(in.Pools) != len(pools) {
			return false
		}
		for _, p := range in.Pools {
			if !p.Golden {
				return false
			}
		}
		return true
	}); err != nil {
		return fmt.Errorf("daemon a: goldens never ready: %w", err)
	}
	c.pools.acked(0, pools)
	c.inst = c.a.Instance("i-foreign0")
	c.logf("daemon a up on %s (instance %s)", c.a.Addr, c.inst)
	c.checkLocks(ctx, "first start")
	c.probeRound(ctx, "first start")
	return nil
}

func claimWhenReady(ctx context.Context, cl *apiclient.Client) (*api.ClaimResponse, error) {
	var cr *api.ClaimResponse
	err := waitFor(ctx, time.Minute, func() bool {
		var err error
		cr, err = cl.Claim(ctx, api.ClaimRequest{Template: "default", TTLSeconds: 3600})
		return err == nil
	})
	return cr, err
}

func waitFor(ctx context.Context, d time.Duration, cond func() bool) error {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("condition not met within %s", d)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return nil
}

// run drives the workload and the killer until Duration and Kills are both
// reached, then stops the workload.
func (c *campaign) run(ctx context.Context) error {
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	var wg sync.WaitGroup
	for i := range c.opt.Workers {
		wg.Add(1)
		go func() { defer wg.Done(); c.worker(wctx, i) }()
	}
	err := c.killer(ctx)
	stop()
	wg.Wait()
	return err
}

// killer kills sandboxd at random moments and restarts it, with faults and
// crash points drawn per incarnation; it also restarts an incarnation that
// crashed at its armed step.
func (c *campaign) killer(ctx context.Context) error {
	start := time.Now()
	mean := c.opt.Duration / time.Duration(max(c.opt.Kills, 1))
	for time.Since(start) < c.opt.Duration || c.res.Kills < c.opt.Kills {
		wait := mean/2 + time.Duration(c.intn(int(mean)+1))
		// The probe guest's traffic runs through the incarnation and
		// across its end (egressprobe.go).
		x := c.startAcross(ctx)
		select {
		case <-ctx.Done():
			x.end("interrupted")
			return ctx.Err()
		case <-time.After(wait):
			if c.a.Running() {
				x.killing()
				if err := c.signalKill(); err != nil {
					x.end("kill")
					return err
				}
			} else if err := c.crashed(); err != nil {
				x.end("exit")
				return err
			}
			x.finish(fmt.Sprintf("kill %d", c.res.Kills))
		case <-c.a.Done():
			if err := c.crashed(); err != nil {
				x.end("exit")
				return err
			}
			x.finish("crash")
		}
		if c.opt.VMMKills && c.intn(4) == 0 {
			c.killRandomVMM()
		}
		if err := c.restart(ctx, true); err != nil {
			return err
		}
	}
	return nil
}

// crashed accounts for an incarnation that exited by itself: at its armed
// step (else an error: the daemon died unasked).
func (c *campaign) crashed() error {
	c.mu.Lock()
	crashed := c.armed
	c.armed = ""
	c.mu.Unlock()
	if crashed == "" {
		return fmt.Errorf("daemon a exited on its own (%s); see %s", c.a.ExitState(), c.a.Log)
	}
	c.mu.Lock()
	c.res.CrashAt[crashed]++
	c.mu.Unlock()
	c.closeWindow()
	c.logf("daemon a crashed at %s as armed (%s)", crashed, c.a.ExitState())
	return nil
}

func (c *campaign) signalKill() error {
	if err := c.a.Signal(syscall.SIGKILL, 10*time.Second); err != nil {
		return err
	}
	c.closeWindow()
	c.mu.Lock()
	c.res.Kills++
	n := c.res.Kills
	armed := c.armed
	c.armed = ""
	c.mu.Unlock()
	c.logf("kill %d: SIGKILL sandboxd (armed step %q did not fire)", n, armed)
	return nil
}

// restart starts a new incarnation; with chaos, its faults and crash point
// are drawn at random.
func (c *campaign) restart(ctx context.Context, chaos bool) error {
	var extra []string
	var desc []string
	if chaos && c.opt.Faults && c.intn(4) == 0 {
		names := sortedKeys(faultSets)
		f := names[c.intn(len(names))]
		extra = append(extra, faultSets[f]...)
		desc = append(desc, "faults "+f)
		c.mu.Lock()
		c.res.Faults[f]++
		c.mu.Unlock()
		c.openWindow()
	}
	if chaos && c.opt.CrashSteps && c.intn(3) == 0 {
		s := crashSteps[c.intn(len(crashSteps))]
		extra = append(extra, "SBX_CRASH_AT="+s)
		desc = append(desc, "crash at "+s)
		c.mu.Lock()
		c.armed = s
		c.mu.Unlock()
	}
	d, err := c.a.Start(ctx, extra, 2*time.Minute)
	if err != nil {
		// An armed crash can fire during start-up (a recipe resumed at
		// once): that is a crash, not a failure to start.
		c.mu.Lock()
		armed := c.armed
		c.mu.Unlock()
		if armed != "" && !c.a.Running() {
			c.closeWindow()
			c.mu.Lock()
			c.res.CrashAt[armed]++
			c.armed = ""
			c.mu.Unlock()
			c.logf("daemon a crashed at %s during start-up", armed)
			return c.restart(ctx, false)
		}
		return err
	}
	c.mu.Lock()
	c.res.Restarts = append(c.res.Restarts, d)
	n := len(c.res.Restarts)
	c.mu.Unlock()
	c.logf("restarted sandboxd in %s %s", d.Round(time.Millisecond), strings.Join(desc, ", "))
	// At once: the new incarnation answers only after its reconcile, so
	// every egress VM it adopted must be locked by now, and its probe
	// guest's traffic must meet the policy.
	c.checkLocks(ctx, fmt.Sprintf("restart %d", n))
	c.probeRound(ctx, fmt.Sprintf("restart %d", n))
	return nil
}

// startDetachedVMM starts chsim in its own session, as another daemon's VM.
func startDetachedVMM(bin, socket string) (VMMProc, error) {
	p, err := os.StartProcess(bin, []string{bin, "--api-socket", "path=" + socket}, &os.ProcAttr{
		Env: append(os.Environ(), vmmEnv...),
		Sys: &syscall.SysProcAttr{Setsid: true},
	})
	if err != nil {
		return VMMProc{}, err
	}
	go func() { _, _ = p.Wait() }()
	if err := waitFor(context.Background(), 10*time.Second, func() bool { _, err := os.Stat(socket); return err == nil }); err != nil {
		return VMMProc{}, fmt.Errorf("planted VMM never bound %s", socket)
	}
	return VMMProc{Pid: p.Pid, Socket: socket}, nil
}
