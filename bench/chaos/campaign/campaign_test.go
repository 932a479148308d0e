package campaign

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sbxlog/sbxlog/executors/egress/netnstest"
	"github.com/sbxlog/sbxlog/projections/api"
	"github.com/sbxlog/sbxlog/projections/apiclient"
)

var bins Binaries

// TestMain builds sandboxd and chsim once for every test here.
func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "chaos-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	bins, err = Build(context.Background(), dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// scratch is a short temp dir whose VMMs are killed (found by their socket
// path) when the test ends.
func scratch(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "chx")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		KillVMMsUnder(dir)
		if t.Failed() {
			t.Logf("scratch dir kept: %s", dir)
			return
		}
		os.RemoveAll(dir)
	})
	return dir
}

// TestShortCampaign is acceptance 2: a shortened campaign (at least 10
// SIGKILLs, under two minutes) with VMM kills, chsim faults and crashes at
// recipe steps, and no violation.
func TestShortCampaign(t *testing.T) {
	// The egress pool and its lock checks need root (network namespaces).
	egress := EgressAvailable()
	if egress != nil {
		if os.Getenv(netnstest.RequireEnv) == "1" {
			t.Fatalf("%v (required: %s=1)", egress, netnstest.RequireEnv)
		}
		t.Logf("without the egress pool: %v", egress)
	}
	var out bytes.Buffer
	res, err := Run(context.Background(), Options{
		Bins: bins, Dir: scratch(t), Keep: true, Duration: 35 * time.Second, Kills: 12, Seed: 20261130,
		VMMKills: true, Faults: true, CrashSteps: true, NATS: true, Egress: egress == nil, Out: &out,
	})
	if res != nil {
		var rep bytes.Buffer
		res.Print(&rep)
		t.Log("\n" + rep.String())
	}
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if !res.Passed() || res.Kills < 10 || res.Elapsed > 2*time.Minute {
		t.Fatalf("violations %d, kills %d, elapsed %s\n%s", len(res.Violation), res.Kills, res.Elapsed, out.String())
	}
	if res.Checked["woken VMs verified (memory, state, disk sums)"] == 0 || res.Checked["acked claims checked"] == 0 {
		t.Fatalf("the campaign checked nothing: %v", res.Checked)
	}
	if egress == nil && (res.Checked["egress lock reads (restart)"] == 0 || res.Checked["egress VMs running with their tap locked"] == 0) {
		t.Fatalf("the campaign checked no egress lock: %v", res.Checked)
	}
	if egress == nil {
		// The probe guest's traffic: every kind answered as the policy
		// says after restarts, and probes ran across kills and while down.
		for _, k := range append(slices.Collect(maps.Values(roundCheck)), "egress probes while up and across a kill (no leak)", "egress probes while down (failed closed)") {
			if res.Checked[k] == 0 {
				t.Fatalf("the campaign has no %q: %v", k, res.Checked)
			}
		}
	}
	// The store recipes ran: checkpoints and forks acked, promotes
	// tried, claims archived, and the end checks looked at the store.
	if res.Ops["checkpoint"][outAcked] == 0 || res.Ops["fork"][outAcked] == 0 || len(res.Ops["promote"]) == 0 ||
		res.Checked["archive events in the log: archived"] == 0 || res.Checked["clones holding their source's data"] == 0 {
		t.Fatalf("the campaign did not exercise the store recipes: %v %v", res.Ops, res.Checked)
	}
	if dup := res.Ops["duplicate"]; dup["release"]+dup["hibernate"]+dup["wake"]+dup["renew"] == 0 {
		t.Fatalf("the campaign sent no duplicate requests: %v", res.Ops)
	}
}

// node is one sandboxd on a scratch dir for the targeted tests.
type node struct {
	t   *testing.T
	d   *Daemon
	c   *apiclient.Client
	ctx context.Context
}

func newNode(t *testing.T, pools ...PoolConf) *node {
	t.Helper()
	dir := scratch(t)
	d, err := NewDaemon("n", bins.Sandboxd, filepath.Join(dir, "n"), pools, false)
	if err != nil {
		t.Fatal(err)
	}
	d.Env = vmmEnv
	n := &node{t: t, d: d, c: d.Client(30 * time.Second), ctx: context.Background()}
	t.Cleanup(func() {
		if d.Running() {
			_ = d.Signal(syscall.SIGKILL, 10*time.Second)
		}
		if t.Failed() {
			if log, err := os.ReadFile(d.Log); err == nil {
				t.Logf("daemon log (last 6000 bytes):\n%s", tail(log, 6000))
			}
		}
	})
	return n
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// start runs an incarnation with extra environment.
func (n *node) start(extra ...string) {
	n.t.Helper()
	if _, err := n.d.Start(n.ctx, extra, time.Minute); err != nil {
		n.t.Fatal(err)
	}
}

// crashed waits for the incarnation armed with SBX_CRASH_AT to kill itself.
func (n *node) crashed() {
	n.t.Helper()
	select {
	case <-n.d.Done():
	case <-time.After(time.Minute):
		n.t.Fatal("the armed crash never fired")
	}
	if st := n.d.ExitState(); !strings.Contains(st, "killed") {
		n.t.Fatalf("daemon ended with %q, want killed by SIGKILL", st)
	}
}

func (n *node) waitFor(what string, cond func() bool) {
	n.t.Helper()
	if err := waitFor(n.ctx, time.Minute, cond); err != nil {
		n.t.Fatalf("%s: %v", what, err)
	}
}

func (n *node) warm(k int) func() bool {
	return func() bool {
		in, err := n.c.Info(n.ctx)
		return err == nil && len(in.Pools) > 0 && in.Pools[0].Warm == k && in.Pools[0].Refilling == 0
	}
}

func (n *node) state(id string) string {
	sb, err := n.c.Sandbox(n.ctx, id)
	if err != nil {
		return ""
	}
	return sb.State
}

// clean checks what every recovery must leave: no VMM that is not a live
// VM's, no run dir the state does not know, no temp dir in the store, every
// running VM answering.
func (n *node) clean() {
	n.t.Helper()
	if err := (&campaign{}).quiesce(n.ctx, n.c); err != nil {
		n.t.Fatal(err)
	}
	// Quiescence is of the VMs: what a commit removes after it (a woken
	// VM's hibernate snapshot) may still be going, so the checks are
	// awaited, and what they find after the wait is reported.
	var violations []string
	_ = waitFor(n.ctx, 15*time.Second, func() bool {
		c := &campaign{a: n.d, res: &Result{Checked: map[string]int{}}, inst: n.d.Instance()}
		vms := c.checkVMs(n.ctx, n.c)
		c.checkOrphans(vms)
		if temps, _ := filepath.Glob(filepath.Join(n.d.DataDir, "store", ".sbx-tmp-*")); len(temps) > 0 {
			c.violate("temp dirs left in the store: %v", temps)
		}
		violations = c.res.Violation
		return len(violations) == 0
	})
	for _, v := range violations {
		n.t.Error(v)
	}
}

func (n *node) claim() *api.ClaimResponse {
	n.t.Helper()
	cr, err := n.c.Claim(n.ctx, api.ClaimRequest{Template: "default", TTLSeconds: 3600})
	if err != nil {
		n.t.Fatal(err)
	}
	return cr
}

var onePool = PoolConf{Template: "default", Net: "none", Size: "small", Warm: 1}

// stop ends the incarnation with SIGTERM, so the next can start armed.
func (n *node) stop() {
	n.t.Helper()
	if err := n.d.Signal(syscall.SIGTERM, 30*time.Second); err != nil {
		n.t.Fatal(err)
	}
}

// claimedThenStopped is the crash tests' start: a one-pool node, warm, one
// sandbox claimed from it, stopped so the next incarnation can be armed.
func claimedThenStopped(t *testing.T) (*node, *api.ClaimResponse) {
	t.Helper()
	n := newNode(t, onePool)
	n.start()
	n.waitFor("warm", n.warm(1))
	cr := n.claim()
	n.stop()
	return n, cr
}

// TestCrashAt is acceptance 3: sandboxd killed at a named recipe step
// (the SBX_CRASH_AT seam) recovers as specified after a restart.
func TestCrashAt(t *testing.T) {
	// hibernate crashes: the claim ends hibernated, from one snapshot, with
	// no VMM left, and a wake restores exactly that snapshot.
	hibernate := func(step string, renamed bool) func(t *testing.T) {
		return func(t *testing.T) {
			t.Parallel()
			n, cr := claimedThenStopped(t)
			n.start("SBX_CRASH_AT=hibernate:" + step)
			// Answered once durable: a waiting hibernate would see the
			// crash it arms as a dropped connection. Even so the crash can
			// land before the answer is written (the executor starts the
			// recipe once the request is durable): a dropped connection is
			// not a failure, the recovery checked below is what counts.
			if _, err := n.c.HibernateNoWait(n.ctx, cr.ID); err != nil && !droppedByCrash(err) {
				t.Fatal(err)
			}
			n.crashed()
			store := filepath.Join(n.d.DataDir, "store")
			snaps, _ := filepath.Glob(filepath.Join(store, "hibernate", cr.VM+"-*"))
			temps, _ := filepath.Glob(filepath.Join(store, ".sbx-tmp-*"))
			if renamed != (len(snaps) == 1) || renamed == (len(temps) == 1) {
				t.Fatalf("at the crash: snapshots %v, temp dirs %v; want the snapshot renamed: %v", snaps, temps, renamed)
			}
			n.start()
			n.waitFor("hibernated", func() bool { return n.state(cr.ID) == "hibernated" })
			n.clean()
			snaps, _ = filepath.Glob(filepath.Join(store, "hibernate", cr.VM+"-*"))
			if len(snaps) != 1 {
				t.Fatalf("snapshots after recovery: %v", snaps)
			}
			before, err := sumsOf(snaps[0], filepath.Join(snaps[0], diskFile))
			if err != nil {
				t.Fatal(err)
			}
			if err := n.c.Wake(n.ctx, cr.ID); err != nil {
				t.Fatal(err)
			}
			n.waitFor("woken", func() bool { return n.state(cr.ID) == "running" })
			runDir := filepath.Join(n.d.DataDir, "run", n.d.Instance(), cr.VM)
			after, err := sumsOf(filepath.Join(runDir, restoreDir), filepath.Join(runDir, diskFile))
			if err != nil {
				t.Fatal(err)
			}
			if after.Memory != before.Memory || after.State != before.State || after.Disk != before.Disk {
				t.Fatalf("woken from %+v, snapshot was %+v", after, before)
			}
			n.clean()
		}
	}
	// Between vm.snapshot and the rename into the store: the temp dir is
	// swept and the hibernate runs again.
	t.Run("hibernate between snapshot and rename", hibernate("sync_files", false))
	t.Run("hibernate at the rename", hibernate("rename", false))
	// Between the rename and vm.shutdown: the stored snapshot is kept and
	// the VM stopped.
	t.Run("hibernate between rename and shutdown", hibernate("shutdown", true))

	// A clone killed between its restore and its result: before vm.restore
	// completed it is torn down and cloned again (a new VMM); after it, the
	// restored VM is adopted and finished (the same VMM). Either way one
	// warm VM, one VMM.
	clone := func(step string, sameVMM bool) func(t *testing.T) {
		return func(t *testing.T) {
			t.Parallel()
			n := newNode(t, onePool)
			n.start()
			n.waitFor("warm", n.warm(1))
			n.stop()
			n.start("SBX_CRASH_AT=clone:" + step)
			if _, err := n.c.SetPools(n.ctx, api.PoolsRequest{Pools: []api.PoolSpec{{Template: "default", Net: "none", Size: "small", Warm: 2}}}); err != nil {
				t.Fatal(err)
			}
			n.crashed()
			before := map[string]int{}
			for _, p := range VMMsUnder(n.d.DataDir) {
				before[filepath.Base(filepath.Dir(p.Socket))] = p.Pid
			}
			n.start()
			n.waitFor("two warm VMs", n.warm(2))
			n.clean()
			after := VMMsUnder(n.d.DataDir)
			if len(after) != 2 {
				t.Fatalf("%d VMMs for 2 warm VMs", len(after))
			}
			same := 0
			for _, p := range after {
				if before[filepath.Base(filepath.Dir(p.Socket))] == p.Pid {
					same++
				}
			}
			want := 1 // the first warm VM's
			if sameVMM {
				want = 2
			}
			if same != want {
				t.Fatalf("%d VMMs kept across the crash, want %d (before %v)", same, want, before)
			}
		}
	}
	t.Run("clone before its restore", clone("restore", false))
	t.Run("clone between restore and result", clone("probe", true))

	// A golden build killed mid-way is built again; its build VM and run
	// dir are gone, the pool fills.
	for _, step := range []string{"boot", "snapshot"} {
		t.Run("golden build at "+step, func(t *testing.T) {
			t.Parallel()
			n := newNode(t, PoolConf{Template: "default", Net: "none", Size: "small", Warm: 2})
			if _, err := n.d.Start(n.ctx, []string{"SBX_CRASH_AT=golden:" + step}, time.Minute); err != nil && n.d.Running() {
				t.Fatal(err)
			}
			n.crashed()
			builds, _ := filepath.Glob(filepath.Join(n.d.DataDir, "run", "*", "golden-*"))
			if len(builds) != 1 {
				t.Fatalf("build run dirs at the crash: %v", builds)
			}
			n.start()
			n.waitFor("two warm VMs", n.warm(2))
			n.clean()
			goldens, _ := filepath.Glob(filepath.Join(n.d.DataDir, "store", "golden", "*"))
			if len(goldens) != 1 {
				t.Fatalf("goldens %v", goldens)
			}
			if builds, _ := filepath.Glob(filepath.Join(n.d.DataDir, "run", "*", "golden-*")); len(builds) != 0 {
				t.Fatalf("build run dirs left: %v", builds)
			}
		})
	}
}

// TestDaemonDeathSparesVMMs: SIGTERM, SIGKILL and a panic of sandboxd
// leave every VMM running: they are in their own process group (and cgroup
// scope where the cgroup tree is writable), and the next daemon adopts
// them.
func TestDaemonDeathSparesVMMs(t *testing.T) {
	n := newNode(t, PoolConf{Template: "default", Net: "none", Size: "small", Warm: 2})
	n.start()
	n.waitFor("warm", n.warm(2))
	cr := n.claim()
	n.waitFor("refilled", n.warm(2))
	vmms := VMMsUnder(n.d.DataDir)
	if len(vmms) != 3 {
		t.Fatalf("%d VMMs, want 3", len(vmms))
	}
	daemonCG, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", n.d.Pid()))
	for _, p := range vmms {
		pgid, err := syscall.Getpgid(p.Pid)
		if err != nil || pgid != p.Pid {
			t.Fatalf("VMM %d: process group %d (%v), want its own", p.Pid, pgid, err)
		}
		if pgid == n.d.Pid() {
			t.Fatal("VMM in the daemon's process group")
		}
		cg, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", p.Pid))
		if bytes.Equal(cg, daemonCG) {
			t.Logf("VMM %d shares the daemon's cgroup (no writable cgroup v2 scope here); its own process group protects it", p.Pid)
		} else if !strings.Contains(string(cg), ".scope") {
			t.Errorf("VMM %d cgroup %q: neither the daemon's nor a scope", p.Pid, cg)
		}
	}
	deaths := []struct {
		name  string
		arm   []string
		kill  func()
		state string
	}{
		{"SIGTERM", nil, func() {
			n.stop()
		}, "exit status 0"},
		{"SIGKILL", nil, func() {
			if err := n.d.Signal(syscall.SIGKILL, 10*time.Second); err != nil {
				t.Fatal(err)
			}
		}, "signal: killed"},
		{"panic", []string{"SBX_CRASH_AT=hibernate:info:panic"}, func() {
			if _, err := n.c.HibernateNoWait(n.ctx, cr.ID); err != nil && !droppedByCrash(err) {
				t.Fatal(err)
			}
			select {
			case <-n.d.Done():
			case <-time.After(time.Minute):
				t.Fatal("no panic")
			}
		}, "exit status 2"},
	}
	for i, d := range deaths {
		if i > 0 {
			n.start(d.arm...)
		}
		d.kill()
		if st := n.d.ExitState(); st != d.state {
			t.Fatalf("%s: daemon ended with %q, want %q", d.name, st, d.state)
		}
		for _, p := range vmms {
			if !alive(p.Pid) {
				t.Fatalf("%s of sandboxd killed VMM %d (%s)", d.name, p.Pid, p.Socket)
			}
		}
	}
	log, _ := os.ReadFile(n.d.Log)
	if !bytes.Contains(log, []byte("panic: SBX_CRASH_AT")) {
		t.Fatal("the last death was not a panic")
	}
	// The next daemon adopts them all and finishes the hibernate.
	n.start()
	n.waitFor("hibernated", func() bool { return n.state(cr.ID) == "hibernated" })
	n.clean()
	for _, p := range VMMsUnder(n.d.DataDir) {
		found := false
		for _, q := range vmms {
			found = found || q.Pid == p.Pid
		}
		if !found {
			t.Errorf("VMM %d was started after the deaths; the warm VMs should have been adopted", p.Pid)
		}
	}
}

// droppedByCrash reports an error of a request whose connection the daemon's
// death cut (no HTTP answer at all), as opposed to an answer with an error.
func droppedByCrash(err error) bool {
	var ae *apiclient.Error
	return err != nil && !errors.As(err, &ae)
}
