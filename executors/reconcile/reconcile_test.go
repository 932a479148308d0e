package reconcile

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/sbxlog/sbxlog/eventlog/event"
	"github.com/sbxlog/sbxlog/executors/ch/chsimbin"
	"github.com/sbxlog/sbxlog/executors/layout"
	"github.com/sbxlog/sbxlog/fsm"
)

var chsimBin string

func TestMain(m *testing.M) { os.Exit(chsimbin.RunTests(m, &chsimBin)) }

// fakeDriver answers adoption from a table and records what it is asked.
type fakeDriver struct {
	root  string
	bin   string
	alive map[string]Liveness // by VM id; missing: dead, "no VMM process"
	fail  map[string]error

	mu      sync.Mutex
	adopted []string
	removed []string
	keep    map[string][]string
	foreign map[string]bool
	// storeKeep is what step 7 asked the driver to keep.
	storeKeep func(rel, op string) bool
}

var (
	_ Driver          = (*fakeDriver)(nil)
	_ SnapshotSweeper = (*fakeDriver)(nil)
	_ StoreSweeper    = (*fakeDriver)(nil)
)

func (f *fakeDriver) SweepStore(_ context.Context, keep func(rel, op string) bool) (layout.StoreSweep, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.storeKeep = keep
	return layout.StoreSweep{Stale: []string{"golden/stale"}, Foreign: []string{"golden/other"}}, nil
}

func (f *fakeDriver) Instance() string     { return filepath.Base(f.root) }
func (f *fakeDriver) VMMBinary() string    { return f.bin }
func (f *fakeDriver) InstanceRoot() string { return f.root }
func (f *fakeDriver) RunDirs() ([]string, error) {
	ents, err := os.ReadDir(f.root)
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out, err
}
func (f *fakeDriver) GoldenRunDir(op event.OpID) string { return "golden-" + op.String()[:6] }
func (f *fakeDriver) AdoptVM(_ context.Context, vm, rel string) (Liveness, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.adopted = append(f.adopted, vm)
	if err := f.fail[vm]; err != nil {
		return Liveness{}, err
	}
	if l, ok := f.alive[vm]; ok {
		return l, nil
	}
	return Liveness{Detail: "no VMM process"}, nil
}
func (f *fakeDriver) HibernateSnapshotDir(vm string, op event.OpID) string {
	return "hibernate/" + vm + "-" + op.String()
}
func (f *fakeDriver) SweepSnapshots(_ context.Context, keep map[string][]string, foreign map[string]bool) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.keep, f.foreign = keep, foreign
	return []string{"hibernate/stale"}, nil
}
func (f *fakeDriver) RemoveRunDir(_ context.Context, name string) error {
	f.mu.Lock()
	f.removed = append(f.removed, name)
	f.mu.Unlock()
	return os.RemoveAll(filepath.Join(f.root, name))
}

// engine is the smallest single writer: Decide and Apply under a lock.
type engine struct {
	mu  sync.Mutex
	st  *fsm.State
	n   uint64
	now int64
	// proposed records the commands proposed through Propose.
	proposed []fsm.Command
}

func newEngine() *engine { return &engine{st: fsm.New(), now: 1_790_000_000_000_000_000} }

func (e *engine) Meta() fsm.Meta {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.n++
	return fsm.Meta{Op: event.OpIDFromUint(uint64(e.now/1e6), e.n), Now: e.now}
}

func (e *engine) View(fn func(*fsm.State)) { e.mu.Lock(); defer e.mu.Unlock(); fn(e.st) }

func (e *engine) Propose(_ context.Context, cmd fsm.Command) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.proposed = append(e.proposed, cmd)
	return e.apply(cmd)
}

func (e *engine) apply(cmd fsm.Command) error {
	evs, err := fsm.Decide(e.st, cmd)
	if err != nil {
		return err
	}
	for i := range evs {
		if err := fsm.Apply(e.st, &evs[i]); err != nil {
			return err
		}
	}
	return nil
}

// must applies cmd directly (set-up, not recorded as proposed).
func (e *engine) must(t *testing.T, cmd fsm.Command) {
	t.Helper()
	e.mu.Lock()
	defer e.mu.Unlock()
	if err := e.apply(cmd); err != nil {
		t.Fatalf("%T: %v", cmd, err)
	}
}

// result answers the pending intent about vm (or the golden) with a
// success.
func (e *engine) result(t *testing.T, vm string) {
	t.Helper()
	var in fsm.Intent
	e.View(func(st *fsm.State) {
		for _, x := range fsm.Intents(st) {
			switch x := x.(type) {
			case fsm.CloneVM:
				if x.VM == vm {
					in = x
				}
			case fsm.HibernateVM:
				if x.VM == vm {
					in = x
				}
			case fsm.BuildGolden:
				if vm == "" {
					in = x
				}
			}
		}
	})
	if in == nil {
		t.Fatalf("no intent for %q", vm)
	}
	m := e.Meta()
	m.Cause = in.IntentOp()
	switch x := in.(type) {
	case fsm.CloneVM:
		e.must(t, fsm.VMCloned{Meta: m, VM: x.VM})
	case fsm.HibernateVM:
		e.must(t, fsm.HibernateDone{Meta: m, VM: x.VM, SnapshotDir: "hibernate/" + x.VM})
	case fsm.BuildGolden:
		e.must(t, fsm.GoldenBuilt{Meta: m, Key: x.Key, SnapshotDir: "golden/g"})
	}
}

var key = fsm.PoolKey{Template: "default", Net: "none", Size: "small"}

// world is a state with VMs in every status that matters to the
// reconcile: warm, claimed (two), hibernated, hibernating and cloning,
// and a golden build in flight for a second pool.
type world struct {
	e                                      *engine
	warm, claimed, dead, hib, hibing, clon string
	golden                                 event.OpID
}

func newWorld(t *testing.T) *world {
	e := newEngine()
	e.must(t, fsm.ConfigureNode{Meta: e.Meta(), Node: "n1", Instance: "i1"})
	e.must(t, fsm.ConfigurePools{Meta: e.Meta(), Pools: []fsm.PoolSpec{{PoolKey: key, Warm: 6}}})
	e.result(t, "")
	e.must(t, fsm.Refill{Meta: e.Meta()})
	var vms []string
	e.View(func(st *fsm.State) { vms = st.VMIDs() })
	if len(vms) != 6 {
		t.Fatalf("%d VMs", len(vms))
	}
	for _, vm := range vms[:5] {
		e.result(t, vm)
	}
	w := &world{e: e, clon: vms[5]}
	claim := func(n int) string {
		id := "sb_" + strconv.FormatInt(int64(0x1000000000000000+n), 16)
		e.must(t, fsm.Claim{Meta: e.Meta(), ID: id, Key: key})
		var vm string
		e.View(func(st *fsm.State) { c, _ := st.Claim(id); vm = c.VM })
		return vm
	}
	w.claimed, w.dead, w.hib, w.hibing = claim(1), claim(2), claim(3), claim(4)
	e.must(t, fsm.Hibernate{Meta: e.Meta(), Claim: "sb_1000000000000003"})
	e.result(t, w.hib)
	e.must(t, fsm.Hibernate{Meta: e.Meta(), Claim: "sb_1000000000000004"})
	e.View(func(st *fsm.State) { p, _ := st.Pool(key); w.warm = p.WarmVMs()[0] })
	k2 := fsm.PoolKey{Template: "other", Net: "none", Size: "small"}
	e.must(t, fsm.ConfigurePools{Meta: e.Meta(), Pools: []fsm.PoolSpec{{PoolKey: key, Warm: 6}, {PoolKey: k2, Warm: 1}}})
	e.View(func(st *fsm.State) { g, _ := st.Golden(k2); w.golden = g.Op })
	return w
}

func TestRun(t *testing.T) {
	ctx := context.Background()
	w := newWorld(t)
	root := filepath.Join(chsimbin.ShortTempDir(t), "run", "i1")
	d := &fakeDriver{root: root, bin: chsimBin, alive: map[string]Liveness{
		w.warm: {Alive: true, Pid: 1}, w.claimed: {Alive: true, Pid: 2},
	}}
	goldenDir := d.GoldenRunDir(w.golden)
	// Run dirs: every VM's but the hibernated one's, plus a stale copy of
	// it, a stray, the golden build's, and another instance's.
	for _, n := range []string{w.warm, w.claimed, w.dead, w.hib, w.hibing, w.clon, "vm-stray", goldenDir, "../i-other/vm-x"} {
		if err := os.MkdirAll(filepath.Join(root, n), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	rep, err := Run(ctx, Options{Driver: d, Propose: w.e, View: w.e.View, Meta: w.e.Meta, Policy: fsm.DefaultRestartPolicy, Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(d.adopted)
	if want := sorted(w.warm, w.claimed, w.dead); !slices.Equal(d.adopted, want) {
		t.Fatalf("adopted %v, want the warm and claimed VMs %v", d.adopted, want)
	}
	if rep.Adopted != 2 || rep.InFlight != 2 || len(rep.Exited) != 1 || rep.Exited[w.dead] != "no VMM process" {
		t.Fatalf("report %+v", rep)
	}
	if want := sorted(w.hib, "vm-stray"); !slices.Equal(rep.Removed, want) {
		t.Fatalf("removed %v, want %v", rep.Removed, want)
	}
	if !slices.Equal(rep.Foreign, []string{"i-other"}) {
		t.Fatalf("foreign %v", rep.Foreign)
	}
	// The dead claimed VM got a VMExited with the policy, and restarts.
	if len(w.e.proposed) != 1 {
		t.Fatalf("proposed %v", w.e.proposed)
	}
	x := w.e.proposed[0].(fsm.VMExited)
	if x.VM != w.dead || x.Restart != fsm.DefaultRestartPolicy {
		t.Fatalf("proposed %+v", x)
	}
	w.e.View(func(st *fsm.State) {
		if v, _ := st.VM(w.dead); v.Status != fsm.VMRestarting {
			t.Fatalf("dead VM is %s", v.Status)
		}
	})
	// Snapshots: the hibernated VM's and the in-flight hibernate's are
	// kept, every other VM's are not.
	var hibSnap, hibingOp string
	w.e.View(func(st *fsm.State) {
		v, _ := st.VM(w.hib)
		hibSnap = v.SnapshotDir
		h, _ := st.VM(w.hibing)
		hibingOp = h.Op.String()
	})
	if got := d.keep[w.hib]; !slices.Equal(got, []string{hibSnap}) {
		t.Fatalf("keep of the hibernated VM %v, want %s", got, hibSnap)
	}
	if got := d.keep[w.hibing]; len(got) != 2 || got[1] != "hibernate/"+w.hibing+"-"+hibingOp {
		t.Fatalf("keep of the hibernating VM %v", got)
	}
	if got, ok := d.keep[w.claimed]; !ok || got != nil {
		t.Fatalf("keep of a claimed VM %v (%v)", got, ok)
	}
	if d.foreign == nil || len(d.foreign) != 0 {
		t.Fatalf("foreign VMs %v: every VM of the state is this instance's", d.foreign)
	}
	if !slices.Equal(rep.Snapshots, []string{"hibernate/stale"}) {
		t.Fatalf("report snapshots %v", rep.Snapshots)
	}
	// Step 7 keeps every dir the state references and what an intent in
	// flight makes (by its meta.json's op or the op its name ends in);
	// nothing else.
	var refs []fsm.SnapshotRef
	w.e.View(func(st *fsm.State) { refs = st.SnapshotRefs() })
	if len(refs) == 0 {
		t.Fatal("the world references no snapshot")
	}
	for _, r := range refs {
		if !d.storeKeep(r.Dir, "") {
			t.Errorf("step 7 would remove %s (%s %s)", r.Dir, r.Kind, r.Owner)
		}
	}
	if !d.storeKeep("golden/x-"+w.golden.String(), "") || !d.storeKeep("golden/y", hibingOp) {
		t.Error("step 7 would remove an in-flight intent's snapshot")
	}
	if d.storeKeep("golden/unreferenced", "") || d.storeKeep("golden/z", event.OpIDFromUint(7, 7).String()) {
		t.Error("step 7 keeps what nothing references")
	}
	if !slices.Equal(rep.Store.Stale, []string{"golden/stale"}) || !slices.Equal(rep.Store.Foreign, []string{"golden/other"}) {
		t.Fatalf("report store %+v", rep.Store)
	}
	for _, n := range []string{w.warm, w.hibing, w.clon, goldenDir, "../i-other/vm-x"} {
		if _, err := os.Stat(filepath.Join(root, n)); err != nil {
			t.Errorf("%s was removed", n)
		}
	}

	// ReportExit: a later death of the warm VM is recorded; the same death
	// reported twice, or one of a VM in flight, is dropped quietly.
	opt := Options{Driver: d, Propose: w.e, View: w.e.View, Meta: w.e.Meta, Policy: fsm.DefaultRestartPolicy, Log: zerolog.Nop()}
	if err := ReportExit(ctx, opt, w.warm, "VMM (pid 1) exited"); err != nil {
		t.Fatal(err)
	}
	for _, vm := range []string{w.warm, w.clon, w.dead} {
		if err := ReportExit(ctx, opt, vm, "again"); err != nil {
			t.Fatalf("%s: %v", vm, err)
		}
	}
	if err := ReportExit(ctx, opt, "vm-unknown", "x"); err != nil {
		t.Fatalf("unknown VM: %v", err)
	}
}

func TestRunErrors(t *testing.T) {
	w := newWorld(t)
	if _, err := Run(context.Background(), Options{}); err == nil {
		t.Fatal("Run without a driver")
	}
	// A VM that cannot be adopted is left as it is; the pass goes on.
	root := filepath.Join(chsimbin.ShortTempDir(t), "run", "i1")
	if err := os.MkdirAll(root, 0o755); err != nil {
		t.Fatal(err)
	}
	d := &fakeDriver{root: root, bin: chsimBin, fail: map[string]error{w.claimed: errors.New("pid file unreadable")}}
	rep, err := Run(context.Background(), Options{Driver: d, Propose: w.e, View: w.e.View, Meta: w.e.Meta, Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := rep.Exited[w.claimed]; ok || len(rep.Exited) != 2 {
		t.Fatalf("exited %v", rep.Exited)
	}
}

// TestOrphans: live VMMs of this instance that no pid file records are
// killed; the recorded one, another instance's and another data dir's are
// left alone.
func TestOrphans(t *testing.T) {
	dir := chsimbin.ShortTempDir(t)
	root := filepath.Join(dir, "run", "i1")
	start := func(runDir string, record bool) *chsimbin.Process {
		t.Helper()
		if err := os.MkdirAll(runDir, 0o755); err != nil {
			t.Fatal(err)
		}
		p := chsimbin.StartT(t, chsimBin, filepath.Join(runDir, "api.sock"))
		if record {
			if err := os.WriteFile(filepath.Join(runDir, pidFile), []byte(strconv.Itoa(p.Pid())+"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		return p
	}
	orphan := start(filepath.Join(root, "vm-o1"), false)
	stale := start(filepath.Join(root, "vm-o2"), false)
	if err := os.WriteFile(filepath.Join(root, "vm-o2", pidFile), []byte("1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	kept := start(filepath.Join(root, "vm-k"), true)
	foreign := start(filepath.Join(dir, "run", "i2", "vm-f"), false)
	otherData := start(filepath.Join(chsimbin.ShortTempDir(t), "run", "i1", "vm-d"), false)

	procs, err := scanVMMs("/proc", chsimBin, root)
	if err != nil {
		t.Fatal(err)
	}
	if len(procs) != 3 {
		t.Fatalf("found %+v, want this instance's 3 VMMs", procs)
	}
	w := newWorld(t)
	d := &fakeDriver{root: root, bin: chsimBin}
	rep, err := Run(context.Background(), Options{Driver: d, Propose: w.e, View: w.e.View, Meta: w.e.Meta, KillGrace: time.Second, Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	if want := sorted(strconv.Itoa(orphan.Pid()), strconv.Itoa(stale.Pid())); !slices.Equal(pids(rep.Orphans), want) {
		t.Fatalf("orphans killed %v, want %v", rep.Orphans, want)
	}
	for _, p := range []*chsimbin.Process{orphan, stale} {
		select {
		case <-p.Done(): // SIGTERM: chsim exits as CH does
		case <-time.After(5 * time.Second):
			t.Fatalf("orphan %d still runs", p.Pid())
		}
	}
	for _, p := range []*chsimbin.Process{kept, foreign, otherData} {
		select {
		case <-p.Done():
			t.Fatalf("pid %d (%s) was killed", p.Pid(), p.Socket)
		default:
		}
	}
}

func TestVMMSocket(t *testing.T) {
	dir := t.TempDir()
	write := func(pid int, args ...string) {
		p := filepath.Join(dir, strconv.Itoa(pid))
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
		b := []byte{}
		for _, a := range args {
			b = append(append(b, a...), 0)
		}
		if err := os.WriteFile(filepath.Join(p, "cmdline"), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(1, "/opt/chsim", "--api-socket", "path=/r/i1/vm/api.sock")
	write(2, "/usr/bin/chsim", "--api-socket=/r/i1/vm/api.sock")
	write(3, "/opt/cloud-hypervisor", "--api-socket", "path=/r/i1/vm/api.sock")
	write(4, "/opt/chsim", "--api-socket", "fd=3")
	write(5, "/opt/chsim")
	cases := []struct {
		pid  int
		want string
	}{{1, "/r/i1/vm/api.sock"}, {2, "/r/i1/vm/api.sock"}, {3, ""}, {4, ""}, {5, ""}, {6, ""}}
	for _, c := range cases {
		got, _ := vmmSocket(dir, c.pid, "/opt/chsim")
		if got != c.want {
			t.Errorf("pid %d: %q, want %q", c.pid, got, c.want)
		}
	}
}

func sorted(s ...string) []string { slices.Sort(s); return s }

func pids(p []int) []string {
	var out []string
	for _, n := range p {
		out = append(out, strconv.Itoa(n))
	}
	slices.Sort(out)
	return out
}
