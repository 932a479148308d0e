package chdriver

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sbxlog/sbxlog/eventlog/event"
	"github.com/sbxlog/sbxlog/executors"
	"github.com/sbxlog/sbxlog/executors/ch"
	"github.com/sbxlog/sbxlog/fsm"
)

func restartIntent(vm string) fsm.RestartVM {
	return fsm.RestartVM{OpID: newOp(), Claim: "sb_0000000000000001", VM: vm, Key: testKey, Instance: testInstance, RunDir: testInstance + "/" + vm}
}

// writeMarker writes data into the VM's disk, as its guest would.
func writeMarker(t *testing.T, runDir string, data string) {
	t.Helper()
	f, err := os.OpenFile(filepath.Join(runDir, DiskFile), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt([]byte(data), 1<<20); err != nil {
		t.Fatal(err)
	}
}

// exits collects the driver's exit reports.
type exits struct {
	mu  sync.Mutex
	got []Exit
}

func (e *exits) add(x Exit) { e.mu.Lock(); e.got = append(e.got, x); e.mu.Unlock() }
func (e *exits) list() []Exit {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]Exit(nil), e.got...)
}

// TestRestart: a claimed VM whose VMM died boots again from its own disk
// (what the guest wrote survives, its memory does not); a re-run adopts the
// VM the first run booted; a failed attempt leaves no VMM and keeps the
// disk, so the retry works; without a disk the restart is unrecoverable.
func TestRestart(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t, "")
	golden := h.buildGolden(testKey)
	vm := "vm-restart1"
	h.clone(vm, golden)
	rd := h.runDir(vm)
	writeMarker(t, rd, "written by the guest before the crash")
	diskSum := sha(t, filepath.Join(rd, DiskFile))
	oldPid, _ := vmmPid(rd)
	killVMM(t, rd)

	in := restartIntent(vm)
	res, err := h.d.Restart(ctx, in)
	if err != nil {
		t.Fatalf("restart: %v", err)
	}
	pid, ok := vmmPid(rd)
	if !ok || pid == oldPid || h.vmState(vm) != ch.StateRunning {
		t.Fatalf("after restart: pid %d (old %d, ok %v), state %q", pid, oldPid, ok, h.vmState(vm))
	}
	if got := sha(t, filepath.Join(rd, DiskFile)); got != diskSum {
		t.Fatal("the restart did not boot the VM's own disk")
	}
	if _, err := os.Stat(filepath.Join(rd, RestoreDir)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("stale restore files left: %v", err)
	}
	if names := stepNames(res.Report); names[len(names)-1] != StepProbe {
		t.Fatalf("steps %v", names)
	}

	// A re-run of the same op (the daemon died before the result was
	// recorded) adopts the running VM.
	h.start()
	if _, err := h.d.Restart(ctx, in); err != nil {
		t.Fatalf("re-run: %v", err)
	}
	if again, _ := vmmPid(rd); again != pid {
		t.Fatalf("re-run replaced the VMM (%d -> %d)", pid, again)
	}

	// A failing boot leaves no VMM and keeps the disk; the retry works.
	killVMM(t, rd)
	h.inject(fsm.KindRestart, StepBoot, modeAbort)
	in2 := restartIntent(vm)
	if _, err := h.d.Restart(ctx, in2); !errors.Is(err, errAbort) {
		t.Fatalf("restart with a failing boot: %v", err)
	}
	if _, alive := vmmPid(rd); alive {
		t.Fatal("a VMM is left after a failed restart")
	}
	if sha(t, filepath.Join(rd, DiskFile)) != diskSum {
		t.Fatal("a failed restart lost the disk")
	}
	h.setHook(nil)
	if _, err := h.d.Restart(ctx, in2); err != nil {
		t.Fatalf("retry: %v", err)
	}
	if h.vmState(vm) != ch.StateRunning {
		t.Fatal("not running after the retry")
	}

	// No disk: nothing to restart from.
	killVMM(t, rd)
	if err := os.Remove(filepath.Join(rd, DiskFile)); err != nil {
		t.Fatal(err)
	}
	if _, err := h.d.Restart(ctx, restartIntent(vm)); !executors.IsUnrecoverable(err) {
		t.Fatalf("restart without a disk: %v", err)
	}
	// Another instance's VM is refused.
	other := restartIntent(vm)
	other.Instance = "i-other"
	if _, err := h.d.Restart(ctx, other); !executors.IsUnrecoverable(err) {
		t.Fatalf("restart of another instance's VM: %v", err)
	}
}

// TestExitWatch: a VMM the driver holds that dies on its own is reported
// once; VMMs the driver stops itself (destroy, hibernate) are not, nor golden
// builds; after a restart of the driver, adopted VMMs are watched too.
func TestExitWatch(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t, "")
	var ex exits
	h.d.OnExit(ex.add)
	golden := h.buildGolden(testKey)
	for _, vm := range []string{"vm-w1", "vm-w2", "vm-w3"} {
		h.clone(vm, golden)
	}
	killVMM(t, h.runDir("vm-w1"))
	waitFor(t, 5*time.Second, "exit report", func() bool { return len(ex.list()) == 1 })
	if e := ex.list()[0]; e.VM != "vm-w1" || e.RunDir != h.runDir("vm-w1") || e.Pid == 0 {
		t.Fatalf("exit %+v", e)
	}
	if _, err := h.d.Destroy(ctx, fsm.DestroyVM{OpID: newOp(), VM: "vm-w2", Key: testKey, Instance: testInstance, RunDir: testInstance + "/vm-w2"}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.d.Hibernate(ctx, fsm.HibernateVM{OpID: newOp(), VM: "vm-w3", Key: testKey, RunDir: testInstance + "/vm-w3"}); err != nil {
		t.Fatal(err)
	}

	// A fresh driver adopts vm-w4's VMM and reports its death.
	h.clone("vm-w4", golden)
	h.start()
	var ex2 exits
	h.d.OnExit(ex2.add)
	l, err := h.d.AdoptVM(ctx, "vm-w4", testInstance+"/vm-w4")
	if err != nil || !l.Alive || l.Pid == 0 {
		t.Fatalf("adopt: %+v, %v", l, err)
	}
	killVMM(t, h.runDir("vm-w4"))
	waitFor(t, 5*time.Second, "exit report of an adopted VMM", func() bool { return len(ex2.list()) == 1 })
	// No wait is needed for a late, wrong report of the first driver: its
	// Close (in h.start) dropped vm-w4 from the processes it holds, under
	// the lock its watcher takes before reporting, and vm-w4's VMM was
	// alive then; so that watcher finds it not current and never reports.
	if n := len(ex.list()); n != 1 {
		t.Fatalf("%d exit reports from the first driver, want 1: %+v", n, ex.list())
	}
}

// TestAdoptVM covers what adoption finds: a running VM (adopted), a paused
// one (resumed), one that shut down (its VMM stopped, reported dead), none
// at all, and run dirs that are not the VM's.
func TestAdoptVM(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t, "")
	golden := h.buildGolden(testKey)
	for _, vm := range []string{"vm-a1", "vm-a2", "vm-a3", "vm-a4"} {
		h.clone(vm, golden)
	}
	if err := h.api("vm-a2").Pause(ctx); err != nil {
		t.Fatal(err)
	}
	if err := h.api("vm-a3").Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	killVMM(t, h.runDir("vm-a4"))
	h.start()
	cases := []struct {
		vm     string
		alive  bool
		detail string
		state  ch.VmState
	}{
		{"vm-a1", true, "", ch.StateRunning},
		{"vm-a2", true, "resumed", ch.StateRunning},
		{"vm-a3", false, "VM is Shutdown", ""},
		{"vm-a4", false, "no VMM process", ""},
	}
	for _, c := range cases {
		l, err := h.d.AdoptVM(ctx, c.vm, testInstance+"/"+c.vm)
		if err != nil || l.Alive != c.alive || l.Detail != c.detail {
			t.Errorf("%s: %+v, %v; want alive %v %q", c.vm, l, err, c.alive, c.detail)
		}
		if got := h.vmState(c.vm); got != c.state {
			t.Errorf("%s: state %q, want %q", c.vm, got, c.state)
		}
	}
	if _, alive := vmmPid(h.runDir("vm-a3")); alive {
		t.Error("the VMM of a shut-down VM was left running")
	}
	for _, bad := range []struct{ vm, rel string }{{"vm-a1", "i-other/vm-a1"}, {"vm-a1", testInstance + "/vm-a2"}, {"vm-a1", "../x"}} {
		if _, err := h.d.AdoptVM(ctx, bad.vm, bad.rel); !executors.IsUnrecoverable(err) {
			t.Errorf("adopt %s in %s: %v", bad.vm, bad.rel, err)
		}
	}
}

// TestRemoveRunDir: an entry no state owns goes, its VMM (checked by pid
// file and cmdline) stopped first; RunDirs lists only this instance's.
func TestRemoveRunDir(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t, "")
	golden := h.buildGolden(testKey)
	h.clone("vm-r1", golden)
	pid, _ := vmmPid(h.runDir("vm-r1"))
	if err := os.MkdirAll(filepath.Join(h.cfg.Roots.Runs, "i-other", "vm-x"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(h.runDir("stray"), 0o755); err != nil {
		t.Fatal(err)
	}
	names, err := h.d.RunDirs()
	if err != nil || len(names) != 2 {
		t.Fatalf("run dirs %v, %v", names, err)
	}
	for _, n := range names {
		if err := h.d.RemoveRunDir(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	if names, _ := h.d.RunDirs(); len(names) != 0 {
		t.Fatalf("left %v", names)
	}
	if _, err := os.Stat(filepath.Join("/proc", strconv.Itoa(pid), "cmdline")); err == nil {
		t.Fatal("the VMM of a removed run dir still runs")
	}
	if _, err := os.Stat(filepath.Join(h.cfg.Roots.Runs, "i-other", "vm-x")); err != nil {
		t.Fatal("another instance's run dir was touched")
	}
	for _, bad := range []string{"", ".", "..", "a/b"} {
		if err := h.d.RemoveRunDir(ctx, bad); !executors.IsUnrecoverable(err) {
			t.Errorf("RemoveRunDir(%q) = %v", bad, err)
		}
	}
	if h.d.GoldenRunDir(newOp()) == "" || h.d.VMMBinary() != chsimBin || h.d.Instance() != testInstance {
		t.Fatal("accessors")
	}
}

// TestSweepSnapshots: a snapshot a wake restored from whose removal a crash
// cut short is removed once the VM hibernated again, and so is the snapshot
// of a VM the state no longer holds; the current ones and another
// instance's VM's are kept.
func TestSweepSnapshots(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t, "")
	golden := h.buildGolden(testKey)
	hibernate := func(vm string) string {
		t.Helper()
		res, err := h.d.Hibernate(ctx, fsm.HibernateVM{OpID: newOp(), VM: vm, Key: testKey, RunDir: testInstance + "/" + vm})
		if err != nil {
			t.Fatal(err)
		}
		return res.SnapshotDir
	}
	for _, vm := range []string{"vm-s1", "vm-s2", "vm-s3", "vm-s4"} {
		h.clone(vm, golden)
	}
	first := hibernate("vm-s1")
	other := hibernate("vm-s2")
	lost := hibernate("vm-s3") // then lost: the state no longer holds vm-s3
	foreign := hibernate("vm-s4")
	// Woken, but its AfterCommit (the snapshot's removal) never ran.
	if _, err := h.d.Wake(ctx, fsm.WakeVM{OpID: newOp(), VM: "vm-s1", Key: testKey, RunDir: testInstance + "/vm-s1", SnapshotDir: first}); err != nil {
		t.Fatal(err)
	}
	second := hibernate("vm-s1")
	// And the removal was cut short half way (as make chaos once found it:
	// cow.raw gone, meta.json still there, so ReadMeta refuses the dir).
	if err := os.Remove(filepath.Join(h.store(first), DiskFile)); err != nil {
		t.Fatal(err)
	}
	removed, err := h.d.SweepSnapshots(ctx, map[string][]string{"vm-s1": {second}, "vm-s2": {other}}, map[string]bool{"vm-s4": true})
	slices.Sort(removed)
	if want := []string{first, lost}; err != nil || !slices.Equal(removed, want) {
		t.Fatalf("removed %v, %v; want %v", removed, err, want)
	}
	for _, keep := range []string{second, other, foreign} {
		if _, err := ReadMeta(h.store(keep)); err != nil {
			t.Fatalf("%s: %v", keep, err)
		}
	}
	for _, gone := range []string{first, lost} {
		if _, err := os.Stat(h.store(gone)); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("%s still there: %v", gone, err)
		}
	}
	if got := h.d.HibernateSnapshotDir("vm-s1", event.OpID{}); !strings.HasPrefix(got, "hibernate/vm-s1-") {
		t.Fatalf("HibernateSnapshotDir = %q", got)
	}
}
