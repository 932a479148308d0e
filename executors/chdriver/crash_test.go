package chdriver

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/rs/zerolog"

	"github.com/sbxlog/sbxlog/executors"
	"github.com/sbxlog/sbxlog/executors/ch"
	"github.com/sbxlog/sbxlog/executors/fsx"
	"github.com/sbxlog/sbxlog/executors/layout"
	"github.com/sbxlog/sbxlog/executors/probe"
	"github.com/sbxlog/sbxlog/fsm"
)

// Acceptance 3: for every step of clone, wake, hibernate and golden build,
// break the recipe at that step in one of three ways, run it again with the
// same op id, and check the end state.
//
//   - abort: the step fails (as if its own call had failed); the recipe's
//     rollback runs. The state in between is checked too.
//   - crash: the step fails and so does every later side effect, rollback
//     included, as if the daemon died there; then a fresh driver starts on
//     the same data dir (Prepare sweeps the store) and re-runs.
//   - kill: the VMM is SIGKILLed just before the step and the recipe goes on.

type crashMode string

const (
	modeAbort crashMode = "abort"
	modeCrash crashMode = "crash"
	modeKill  crashMode = "kill"
)

var (
	errAbort = errors.New("test: executor aborted at this step")
	errCrash = errors.New("test: executor process died")
)

// inject arms one failure of mode m before step of recipe.
func (h *harness) inject(recipe fsm.IntentKind, step string, m crashMode) {
	var fired, dead atomic.Bool
	match := func(s StepCall) bool { return s.Recipe == string(recipe) && s.Step == step && !s.Undo }
	switch m {
	case modeAbort:
		h.setHook(func(_ context.Context, s StepCall) error {
			if match(s) && fired.CompareAndSwap(false, true) {
				return errAbort
			}
			return nil
		})
	case modeCrash:
		h.setHook(func(_ context.Context, s StepCall) error {
			if dead.Load() {
				return errCrash
			}
			if match(s) {
				dead.Store(true)
				return errCrash
			}
			return nil
		})
		fsf := func(fsx.Step) error {
			if dead.Load() {
				return errCrash
			}
			return nil
		}
		h.fsFail.Store(&fsf)
		chf := func(string) error {
			if dead.Load() {
				return errCrash
			}
			return nil
		}
		h.chFail.Store(&chf)
	case modeKill:
		h.setHook(func(_ context.Context, s StepCall) error {
			if match(s) && fired.CompareAndSwap(false, true) {
				killVMM(h.t, s.RunDir)
			}
			return nil
		})
	}
}

func (h *harness) clearInjection() {
	h.setHook(nil)
	h.fsFail.Store(nil)
	h.chFail.Store(nil)
}

// liveVMMs lists the live chsim processes serving this harness's data dir.
func (h *harness) liveVMMs() []int {
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmd, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil || !strings.HasPrefix(string(cmd), chsimBin+"\x00") || !strings.Contains(string(cmd), h.data+"/") {
			continue
		}
		if st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil && !strings.Contains(string(st), ") Z") {
			out = append(out, pid)
		}
	}
	return out
}

// shared holds a golden and a hibernate snapshot built once per test binary;
// scenarios copy them into their own store instead of rebuilding.
var shared struct {
	once           sync.Once
	dir            string
	golden, hibern string
	err            error
}

func sharedSnapshots(t *testing.T) (dir, golden, hibern string) {
	t.Helper()
	shared.once.Do(func() {
		shared.dir, shared.err = os.MkdirTemp("", "sbxs")
		if shared.err != nil {
			return
		}
		d, err := New(Config{
			Roots: layout.RootsIn(shared.dir), Instance: testInstance, VMM: chsimBin, Hypervisor: CHSim,
			VMMEnv: testVMMEnv, Sizes: testSizes, Synth: testSynth, Log: zerolog.Nop(),
		})
		if err != nil {
			shared.err = err
			return
		}
		defer d.Close()
		ctx := context.Background()
		if _, shared.err = d.Prepare(ctx); shared.err != nil {
			return
		}
		g, err := d.BuildGolden(ctx, fsm.BuildGolden{OpID: newOp(), Key: testKey})
		if shared.err = err; err != nil {
			return
		}
		shared.golden = g.SnapshotDir
		const vm = "vm-5000000000000000"
		if _, shared.err = d.Clone(ctx, cloneIntent(vm, g.SnapshotDir, testKey)); shared.err != nil {
			return
		}
		hres, err := d.Hibernate(ctx, fsm.HibernateVM{OpID: newOp(), VM: vm, Key: testKey, RunDir: testInstance + "/" + vm})
		shared.err, shared.hibern = err, hres.SnapshotDir
	})
	if shared.err != nil {
		t.Fatalf("shared snapshots: %v", shared.err)
	}
	return shared.dir, shared.golden, shared.hibern
}

func sharedGolden(t *testing.T) string {
	_, g, _ := sharedSnapshots(t)
	return g
}

// seed copies a shared snapshot into h's store under the same name.
func (h *harness) seed(rel string) string {
	h.t.Helper()
	dir, _, _ := sharedSnapshots(h.t)
	src, dst := filepath.Join(dir, "store", rel), h.store(rel)
	if err := os.MkdirAll(dst, 0o755); err != nil {
		h.t.Fatal(err)
	}
	c := fsx.NewCloner(zerolog.Nop())
	for _, f := range append(slices.Clone(snapshotFiles), MetaFile) {
		if _, err := c.Clone(filepath.Join(dst, f), filepath.Join(src, f)); err != nil {
			h.t.Fatal(err)
		}
	}
	return rel
}

// stepsOf runs a recipe once on a fresh harness and returns its step names.
func stepsOf(t *testing.T, run func(h *harness) executors.Result) []string {
	t.Helper()
	h := newHarness(t, "")
	return recipeSteps(run(h).Report)
}

// scenarios lists (mode, step) pairs; kill only where a VMM exists.
func scenarios(steps []string, killFrom string, killAll bool) [][2]string {
	var out [][2]string
	for _, m := range []crashMode{modeAbort, modeCrash} {
		for _, s := range steps {
			out = append(out, [2]string{string(m), s})
		}
	}
	from := slices.Index(steps, killFrom)
	for i, s := range steps {
		if killAll || (from >= 0 && i > from) {
			out = append(out, [2]string{string(modeKill), s})
		}
	}
	return out
}

// restart is what the daemon does after a crash: a new driver on the same
// data dir, which sweeps the store's temp dirs.
func (h *harness) afterFailure(m crashMode) {
	h.clearInjection()
	if m == modeCrash {
		h.start()
	}
}

// checkNoTemps fails if the store holds a temp dir.
func (h *harness) checkNoTemps() {
	h.t.Helper()
	if tmp := h.storeTemps(); len(tmp) != 0 {
		h.t.Fatalf("temp dirs left in the store: %v", tmp)
	}
}

// checkRunning checks that vm runs, answers the probe, and is the only VMM.
func (h *harness) checkRunning(vm string, wantVMMs int) {
	h.t.Helper()
	if st := h.vmState(vm); st != ch.StateRunning {
		h.t.Fatalf("VM %s is %q, want Running", vm, st)
	}
	if err := probe.Connect(context.Background(), filepath.Join(h.runDir(vm), VsockFile), 1024); err != nil {
		h.t.Fatalf("guest agent of %s: %v", vm, err)
	}
	if n := len(h.liveVMMs()); n != wantVMMs {
		h.t.Fatalf("%d VMM processes under the data dir, want %d", n, wantVMMs)
	}
}

func (h *harness) checkGone(path string) {
	h.t.Helper()
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		h.t.Fatalf("%s still exists (%v)", path, err)
	}
}

func TestCrashClone(t *testing.T) {
	t.Parallel()
	_, golden, _ := sharedSnapshots(t)
	const vm = "vm-00000000000000d1"
	steps := stepsOf(t, func(h *harness) executors.Result { return h.clone(vm, h.seed(golden)) })
	for _, sc := range scenarios(steps, StepLaunch, false) {
		m, step := crashMode(sc[0]), sc[1]
		t.Run(sc[0]+"/"+step, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, "")
			in := cloneIntent(vm, h.seed(golden), testKey)
			ctx := context.Background()
			h.inject(fsm.KindClone, step, m)
			_, err := h.d.Clone(ctx, in)
			if m != modeKill && err == nil {
				t.Fatal("clone succeeded through an injected failure")
			}
			if err != nil && m == modeAbort {
				// Rolled back: no run dir, no VMM.
				h.checkGone(h.runDir(vm))
				if n := len(h.liveVMMs()); n != 0 {
					t.Fatalf("%d VMMs left after a failed clone", n)
				}
			}
			h.afterFailure(m)
			if _, err := h.d.Clone(ctx, in); err != nil {
				t.Fatalf("re-run: %v", err)
			}
			h.checkRunning(vm, 1)
			h.checkNoTemps()
			a, _ := os.Stat(filepath.Join(h.runDir(vm), RestoreDir, MemoryFile))
			b, _ := os.Stat(filepath.Join(h.store(golden), MemoryFile))
			if a == nil || b == nil || !os.SameFile(a, b) {
				t.Fatal("memory-ranges is not the golden's")
			}
		})
	}
}

func TestCrashWake(t *testing.T) {
	t.Parallel()
	_, _, snap := sharedSnapshots(t)
	const vm = "vm-00000000000000d2"
	wake := func(h *harness, op [16]byte) (executors.Result, error) {
		return h.d.Wake(context.Background(), fsm.WakeVM{OpID: op, VM: vm, Key: testKey, RunDir: testInstance + "/" + vm, SnapshotDir: snap})
	}
	steps := stepsOf(t, func(h *harness) executors.Result {
		h.seed(snap)
		res, err := wake(h, newOp())
		if err != nil {
			t.Fatal(err)
		}
		return res
	})
	for _, sc := range scenarios(steps, StepLaunch, false) {
		m, step := crashMode(sc[0]), sc[1]
		t.Run(sc[0]+"/"+step, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, "")
			h.seed(snap)
			sdir := h.store(snap)
			memSum, diskSum := sha(t, filepath.Join(sdir, MemoryFile)), sha(t, filepath.Join(sdir, DiskFile))
			beats := snapshotHeartbeats(t, sdir)
			intact := func() {
				t.Helper()
				if _, err := ReadMeta(sdir); err != nil {
					t.Fatalf("snapshot damaged: %v", err)
				}
				if sha(t, filepath.Join(sdir, MemoryFile)) != memSum || sha(t, filepath.Join(sdir, DiskFile)) != diskSum {
					t.Fatal("snapshot files changed")
				}
			}
			op := newOp()
			h.inject(fsm.KindWake, step, m)
			_, err := wake(h, op)
			if m != modeKill && err == nil {
				t.Fatal("wake succeeded through an injected failure")
			}
			if err != nil && m == modeAbort {
				h.checkGone(h.runDir(vm))
				if n := len(h.liveVMMs()); n != 0 {
					t.Fatalf("%d VMMs left after a failed wake", n)
				}
			}
			intact()
			h.afterFailure(m)
			res, err := wake(h, op)
			if err != nil {
				t.Fatalf("re-run: %v", err)
			}
			h.checkRunning(vm, 1)
			h.checkNoTemps()
			intact()
			if got := h.heartbeats(vm); got < beats {
				t.Fatalf("woken guest has %d heartbeats, snapshot %d", got, beats)
			}
			if err := res.AfterCommit(context.Background()); err != nil {
				t.Fatal(err)
			}
			h.checkGone(sdir)
			h.checkRunning(vm, 1)
		})
	}
}

// pauseAndRef pauses vm and snapshots it outside the store: the checksums a
// hibernate of the (still paused) VM must reproduce.
func (h *harness) pauseAndRef(vm string) (mem, disk string) {
	h.t.Helper()
	ctx := context.Background()
	api := h.api(vm)
	if err := api.Pause(ctx); err != nil {
		h.t.Fatal(err)
	}
	ref, err := os.MkdirTemp(h.data, "ref")
	if err != nil {
		h.t.Fatal(err)
	}
	defer os.RemoveAll(ref)
	url, _ := ch.FileURL(ref)
	if err := api.Snapshot(ctx, url); err != nil {
		h.t.Fatal(err)
	}
	return sha(h.t, filepath.Join(ref, MemoryFile)), sha(h.t, filepath.Join(h.runDir(vm), DiskFile))
}

func TestCrashHibernate(t *testing.T) {
	t.Parallel()
	_, golden, _ := sharedSnapshots(t)
	const vm = "vm-00000000000000d3"
	hib := func(h *harness, op [16]byte) (executors.Result, error) {
		return h.d.Hibernate(context.Background(), fsm.HibernateVM{OpID: op, VM: vm, Key: testKey, RunDir: testInstance + "/" + vm})
	}
	steps := stepsOf(t, func(h *harness) executors.Result {
		h.clone(vm, h.seed(golden))
		res, err := hib(h, newOp())
		if err != nil {
			t.Fatal(err)
		}
		return res
	})
	snapshotted := slices.Index(steps, StepSnapshot)
	// Up to the shutdown the VM sits paused in its VMM; from the shutdown
	// on its memory is in the snapshot alone.
	shutdown := slices.Index(steps, StepShutdown)
	for _, sc := range scenarios(steps, "", true) {
		m, step := crashMode(sc[0]), sc[1]
		at := slices.Index(steps, step)
		t.Run(sc[0]+"/"+step, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, "")
			h.clone(vm, h.seed(golden))
			op := newOp()
			final := h.store(layout.HibernateRel(vm, op))
			mem, disk := h.pauseAndRef(vm)
			h.inject(fsm.KindHibernate, step, m)
			_, err := hib(h, op)
			if m != modeKill && err == nil {
				t.Fatal("hibernate succeeded through an injected failure")
			}
			if m == modeCrash {
				h.afterFailure(m) // the sweep runs before anything is checked
			}
			h.clearInjection()
			h.checkNoTemps()
			lost := false
			switch {
			case m == modeKill && at <= snapshotted:
				// The VMM died before its memory was written anywhere: the
				// VM is lost, and that is what the recipe must say.
				if !executors.IsLost(err) {
					t.Fatalf("VMM killed before the snapshot: got %v, want a Lost error", err)
				}
				h.checkGone(final)
				lost = true
			case err == nil:
				// Done despite the kill (after the snapshot, nothing needs
				// the VMM): the snapshot must be the reference.
			case m == modeAbort && at <= shutdown:
				// Rolled back: no snapshot, the VM running again (or, when
				// the recipe stopped before pausing, left as it was). That
				// holds after the rename too, while the VM is intact: a
				// failed hibernate's state never names the snapshot, so
				// the rollback removes it rather than the start-up sweep.
				h.checkGone(final)
				st := h.vmState(vm)
				untouched := at < slices.Index(steps, StepPause)
				if st != ch.StateRunning && !(untouched && st == ch.StatePaused) {
					t.Fatalf("after a rollback the VM is %q", st)
				}
				if st == ch.StateRunning {
					mem, disk = h.pauseAndRef(vm) // it ran on: new reference
				}
			case m == modeAbort:
				// The VM was shut down: the snapshot is the only copy of
				// its memory and stays for the re-run.
				if _, err := ReadMeta(final); err != nil {
					t.Fatalf("after a failure past the shutdown the snapshot is gone: %v", err)
				}
				if st := h.vmState(vm); st == ch.StateRunning || st == ch.StatePaused {
					t.Fatalf("after a failure past the shutdown the VM is %q", st)
				}
			}
			res, err := hib(h, op)
			if lost {
				if !executors.IsLost(err) {
					t.Fatalf("re-run of a lost VM: %v", err)
				}
				h.checkNoTemps()
				return
			}
			if err != nil {
				t.Fatalf("re-run: %v", err)
			}
			if res.SnapshotDir != layout.HibernateRel(vm, op) {
				t.Fatalf("snapshot dir %q", res.SnapshotDir)
			}
			if _, err := ReadMeta(final); err != nil {
				t.Fatal(err)
			}
			if sha(t, filepath.Join(final, MemoryFile)) != mem || sha(t, filepath.Join(final, DiskFile)) != disk {
				t.Fatal("snapshot checksums differ from the ones taken before the hibernate")
			}
			h.checkGone(h.runDir(vm))
			if n := len(h.liveVMMs()); n != 0 {
				t.Fatalf("%d VMMs left after hibernate", n)
			}
			h.checkNoTemps()
			if got := h.storeEntries(layout.HibernateStore); len(got) != 1 {
				t.Fatalf("store/hibernate holds %v", got)
			}
		})
	}
}

// A re-run that finds its snapshot in the store (the daemon died between
// the rename and the stop, the VM paused) and then fails while the VM is
// still paused rolls back as the first run would: the snapshot goes, the
// VM runs again; the next run hibernates it afresh.
func TestHibernateRerunFailsAfterRename(t *testing.T) {
	t.Parallel()
	_, golden, _ := sharedSnapshots(t)
	const vm = "vm-00000000000000d4"
	h := newHarness(t, "")
	h.clone(vm, h.seed(golden))
	op := newOp()
	final := h.store(layout.HibernateRel(vm, op))
	hib := func() (executors.Result, error) {
		return h.d.Hibernate(context.Background(), fsm.HibernateVM{OpID: op, VM: vm, Key: testKey, RunDir: testInstance + "/" + vm})
	}
	h.inject(fsm.KindHibernate, StepShutdown, modeCrash)
	if _, err := hib(); err == nil {
		t.Fatal("hibernate succeeded through a crash")
	}
	h.afterFailure(modeCrash)
	if _, err := ReadMeta(final); err != nil {
		t.Fatalf("after a crash past the rename: %v", err)
	}
	if st := h.vmState(vm); st != ch.StatePaused {
		t.Fatalf("after a crash past the rename the VM is %q", st)
	}
	h.inject(fsm.KindHibernate, StepSyncTree, modeAbort)
	if _, err := hib(); err == nil {
		t.Fatal("re-run succeeded through an injected failure")
	}
	h.clearInjection()
	h.checkGone(final)
	h.checkRunning(vm, 1)
	mem, disk := h.pauseAndRef(vm)
	res, err := hib()
	if err != nil {
		t.Fatalf("third run: %v", err)
	}
	if res.SnapshotDir != layout.HibernateRel(vm, op) {
		t.Fatalf("snapshot dir %q", res.SnapshotDir)
	}
	if sha(t, filepath.Join(final, MemoryFile)) != mem || sha(t, filepath.Join(final, DiskFile)) != disk {
		t.Fatal("snapshot checksums differ from the ones taken before the hibernate")
	}
	h.checkGone(h.runDir(vm))
	h.checkNoTemps()
}

func TestCrashGolden(t *testing.T) {
	t.Parallel()
	build := func(h *harness, op [16]byte) (executors.Result, error) {
		return h.d.BuildGolden(context.Background(), fsm.BuildGolden{OpID: op, Key: testKey})
	}
	steps := stepsOf(t, func(h *harness) executors.Result {
		res, err := build(h, newOp())
		if err != nil {
			t.Fatal(err)
		}
		return res
	})
	renamed := slices.Index(steps, StepRename)
	for _, sc := range scenarios(steps, StepLaunch, false) {
		m, step := crashMode(sc[0]), sc[1]
		at := slices.Index(steps, step)
		t.Run(sc[0]+"/"+step, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, "")
			op := newOp()
			final := h.store(layout.GoldenRel(testKey, op))
			buildDir := h.d.roots.GoldenRunDir(h.d.instance, op)
			h.inject(fsm.KindGolden, step, m)
			_, err := build(h, op)
			if m != modeKill && err == nil {
				t.Fatal("golden build succeeded through an injected failure")
			}
			if m == modeCrash {
				h.afterFailure(m)
			}
			h.clearInjection()
			h.checkNoTemps()
			if err != nil && m != modeCrash && at < renamed {
				// Rolled back: no golden, no build VM.
				h.checkGone(final)
				h.checkGone(buildDir)
				if n := len(h.liveVMMs()); n != 0 {
					t.Fatalf("%d VMMs left after a failed build", n)
				}
			}
			res, err := build(h, op)
			if err != nil {
				t.Fatalf("re-run: %v", err)
			}
			if res.SnapshotDir != layout.GoldenRel(testKey, op) {
				t.Fatalf("golden dir %q", res.SnapshotDir)
			}
			if _, err := ReadMeta(final); err != nil {
				t.Fatal(err)
			}
			h.checkGone(buildDir)
			if n := len(h.liveVMMs()); n != 0 {
				t.Fatalf("%d VMMs left after the build", n)
			}
			h.checkNoTemps()
			if got := h.storeEntries(layout.GoldenStore); len(got) != 1 {
				t.Fatalf("store/golden holds %v", got)
			}
			// The golden works.
			const vm = "vm-00000000000000d4"
			h.clone(vm, res.SnapshotDir)
			h.checkRunning(vm, 1)
		})
	}
}

// TestHibernateVMMDiesMidSnapshot: chsim SIGKILLs itself after writing part
// of the snapshot (as a VMM crashing in vm.snapshot would): the VM is lost,
// reported so, and no partial snapshot stays in the store.
func TestHibernateVMMDiesMidSnapshot(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "", func(c *Config) { c.VMMEnv = append(c.VMMEnv, "SBX_CHSIM_SNAPSHOT_EXIT_AFTER=64K") })
	const vm = "vm-00000000000000d5"
	h.clone(vm, h.seed(sharedGolden(t)))
	op := newOp()
	_, err := h.d.Hibernate(context.Background(), fsm.HibernateVM{OpID: op, VM: vm, Key: testKey, RunDir: testInstance + "/" + vm})
	if !executors.IsLost(err) {
		t.Fatalf("got %v, want a Lost error", err)
	}
	h.checkNoTemps()
	h.checkGone(h.store(layout.HibernateRel(vm, op)))
	if n := len(h.liveVMMs()); n != 0 {
		t.Fatalf("%d VMMs alive", n)
	}
}
