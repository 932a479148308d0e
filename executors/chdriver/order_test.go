package chdriver

import (
	"context"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/sbxlog/sbxlog/fsm"
)

// effects keeps the side effects of a trace (fs and ch entries, and the
// VMM's launch and termination, which go through neither), collapsing
// repeated vm.info polls into one.
func effects(entries []string) []string {
	var out []string
	for _, e := range entries {
		keep := strings.HasPrefix(e, "fs ") || strings.HasPrefix(e, "ch ") ||
			e == "step "+StepLaunch || e == "step "+StepTerminate || e == "step "+StepWriteConfig
		if !keep {
			continue
		}
		if n := len(out); n > 0 && e == "ch "+CallInfo && out[n-1] == e {
			continue
		}
		out = append(out, e)
	}
	return out
}

func index(t *testing.T, entries []string, e string) int {
	t.Helper()
	i := slices.Index(entries, e)
	if i < 0 {
		t.Fatalf("%q not in trace:\n%s", e, strings.Join(entries, "\n"))
	}
	return i
}

// tempOf returns the temp dir a trace's mktempdir made.
func tempOf(t *testing.T, entries []string) string {
	t.Helper()
	for _, e := range entries {
		if f := strings.Fields(e); len(f) == 5 && f[1] == "mktempdir" {
			return f[4]
		}
	}
	t.Fatalf("no mktempdir in trace:\n%s", strings.Join(entries, "\n"))
	return ""
}

func checkSequence(t *testing.T, what string, got, want []string) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Fatalf("%s side effects:\n  %s\nwant:\n  %s", what, strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
}

// TestHibernateOrder is acceptance 2 for hibernate: vm.snapshot into a temp
// dir in the store, FICLONE, every file fsynced (SyncTree of the temp dir,
// meta.json written atomically) before the rename into the store, SyncTree
// of the final dir, and only then vm.shutdown and the VMM's termination.
func TestHibernateOrder(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "")
	golden := h.buildGolden(testKey)
	const vm = "vm-00000000000000b1"
	h.clone(vm, golden)
	h.tr.reset()

	in := fsm.HibernateVM{OpID: newOp(), VM: vm, Key: testKey, RunDir: testInstance + "/" + vm}
	res, err := h.d.Hibernate(context.Background(), in)
	if err != nil {
		t.Fatal(err)
	}
	all := h.tr.reset()
	got := effects(all)
	tmp := tempOf(t, got)
	final := h.store(res.SnapshotDir)
	run := h.runDir(vm)
	want := []string{
		"ch " + CallInfo,
		"ch " + CallPause,
		"fs mktempdir " + h.cfg.Roots.Store + " hibernate " + tmp,
		"ch " + CallSnapshot,
		"fs clone " + filepath.Join(tmp, DiskFile) + " " + filepath.Join(run, DiskFile),
		"fs synctree " + tmp,
		"fs write " + filepath.Join(tmp, MetaFile),
		"fs rename " + tmp + " " + final,
		"fs synctree " + final,
		"ch " + CallShutdown,
		"step " + StepTerminate,
		"fs removeall " + run,
	}
	checkSequence(t, "hibernate", got, want)
	if filepath.Dir(tmp) != h.cfg.Roots.Store {
		t.Fatalf("temp dir %s is not inside the store", tmp)
	}
	// The two properties the issue names, stated directly.
	if index(t, got, "fs synctree "+final) > index(t, got, "ch "+CallShutdown) {
		t.Fatal("vm.shutdown before SyncTree")
	}
	rename := index(t, got, "fs rename "+tmp+" "+final)
	for _, w := range []string{"ch " + CallSnapshot, "fs clone " + filepath.Join(tmp, DiskFile) + " " + filepath.Join(run, DiskFile)} {
		if index(t, got, w) > index(t, got, "fs synctree "+tmp) {
			t.Fatalf("%s wrote into the temp dir after its SyncTree", w)
		}
	}
	if index(t, got, "fs synctree "+tmp) > rename || index(t, got, "fs write "+filepath.Join(tmp, MetaFile)) > rename {
		t.Fatal("rename into the store before every file was fsynced")
	}
	// The report carries the same steps, timed.
	wantSteps := []string{StepCheck, StepInfo, StepBalloon, StepPause, StepMkTemp, StepSnapshot, StepCloneDisk, StepSyncFiles, StepWriteMeta, StepRename, StepSyncTree, StepShutdown, StepTerminate, StepRemoveRun}
	if got := stepNames(res.Report); !slices.Equal(got, wantSteps) {
		t.Fatalf("report steps %v, want %v", got, wantSteps)
	}
}

// TestRecipeOrders checks the side-effect order of clone, wake, golden
// build and destroy against the recipes' required order.
func TestRecipeOrders(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "")
	ctx := context.Background()

	gop := newOp()
	gres, err := h.d.BuildGolden(ctx, fsm.BuildGolden{OpID: gop, Key: testKey})
	if err != nil {
		t.Fatal(err)
	}
	got := effects(h.tr.reset())
	build := h.d.roots.GoldenRunDir(h.d.instance, gop)
	tmp := tempOf(t, got)
	gfinal := h.store(gres.SnapshotDir)
	tpl := filepath.Join(h.cfg.Roots.Templates, testKey.Template, "disk.raw")
	checkSequence(t, "golden", got, []string{
		"fs removeall " + build,
		"fs mkdirall " + build,
		"fs clone " + filepath.Join(build, DiskFile) + " " + tpl,
		"step " + StepLaunch,
		"ch " + CallCreate,
		"ch " + CallBoot,
		"ch " + CallInfo, // probe, then the balloon's vm.info
		"ch " + CallPause,
		"fs mktempdir " + h.cfg.Roots.Store + " golden " + tmp,
		"ch " + CallSnapshot,
		"fs clone " + filepath.Join(tmp, DiskFile) + " " + filepath.Join(build, DiskFile),
		"fs synctree " + tmp,
		"fs write " + filepath.Join(tmp, MetaFile),
		"fs rename " + tmp + " " + gfinal,
		"fs synctree " + gfinal,
		"ch " + CallShutdown,
		"step " + StepTerminate,
		"fs removeall " + build,
	})

	const vm = "vm-00000000000000b2"
	run := h.runDir(vm)
	restore := filepath.Join(run, RestoreDir)
	restoreSeq := func(src string) []string {
		return []string{
			"fs removeall " + run,
			"fs mkdirall " + restore,
			"fs link " + filepath.Join(restore, MemoryFile) + " " + filepath.Join(src, MemoryFile),
			"fs clone " + filepath.Join(run, DiskFile) + " " + filepath.Join(src, DiskFile),
			"fs clone " + filepath.Join(restore, StateFile) + " " + filepath.Join(src, StateFile),
			"step " + StepWriteConfig,
			"step " + StepLaunch,
			"ch " + CallRestore,
			"ch " + CallResume,
			"ch " + CallInfo, // probe
		}
	}
	h.clone(vm, gres.SnapshotDir)
	checkSequence(t, "clone", effects(h.tr.reset()), restoreSeq(gfinal))

	hib := fsm.HibernateVM{OpID: newOp(), VM: vm, Key: testKey, RunDir: testInstance + "/" + vm}
	hres, err := h.d.Hibernate(ctx, hib)
	if err != nil {
		t.Fatal(err)
	}
	h.tr.reset()
	snap := h.store(hres.SnapshotDir)
	wres, err := h.d.Wake(ctx, fsm.WakeVM{OpID: newOp(), VM: vm, Key: testKey, RunDir: hib.RunDir, SnapshotDir: hres.SnapshotDir})
	if err != nil {
		t.Fatal(err)
	}
	checkSequence(t, "wake", effects(h.tr.reset()), restoreSeq(snap))
	if err := wres.AfterCommit(ctx); err != nil {
		t.Fatal(err)
	}
	checkSequence(t, "wake commit", effects(h.tr.reset()), []string{"fs removeall " + snap})

	if _, err := h.d.Destroy(ctx, fsm.DestroyVM{OpID: newOp(), VM: vm, Key: testKey, Instance: testInstance, RunDir: hib.RunDir, SnapshotDir: hres.SnapshotDir}); err != nil {
		t.Fatal(err)
	}
	checkSequence(t, "destroy", effects(h.tr.reset()), []string{
		"ch " + CallShutdown,
		"step " + StepTerminate,
		"fs removeall " + run,
		"fs removeall " + snap,
	})
}
