package chdriver

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/sbxlog/sbxlog/eventlog/event"
	"github.com/sbxlog/sbxlog/executors"
	"github.com/sbxlog/sbxlog/executors/ch"
	"github.com/sbxlog/sbxlog/executors/layout"
	"github.com/sbxlog/sbxlog/fsm"
)

func captureIntent(ck, vm, source string, op event.OpID) fsm.CaptureCheckpoint {
	return fsm.CaptureCheckpoint{OpID: op, Checkpoint: ck, VM: vm, Key: testKey, Instance: testInstance,
		RunDir: testInstance + "/" + vm, Source: source}
}

// recipeSteps are a report's hooked steps (the pause window is a measure).
func recipeSteps(rep event.ExecReport) []string {
	return slices.DeleteFunc(stepNames(rep), func(s string) bool { return s == StepPauseWindow })
}

// A running VM is checkpointed in the hibernate order, resumed before the
// files are made durable, and runs on; two clones of the checkpoint each
// get their own disk and share its memory file; the checkpoint goes when
// removed.
func TestCheckpointRunningVM(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "")
	golden := h.seed(sharedGolden(t))
	const vm = "vm-00000000000000c1"
	h.clone(vm, golden)
	h.tr.reset()
	ctx := context.Background()
	op := newOp()
	res, err := h.d.Checkpoint(ctx, captureIntent("ck_00000000000000c1", vm, "", op))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{StepCheck, StepInfo, StepPause, StepMkTemp, StepSnapshot, StepCloneDisk, StepResume,
		StepSyncFiles, StepWriteMeta, StepRename, StepSyncTree}
	if got := recipeSteps(res.Report); !slices.Equal(got, want) {
		t.Fatalf("steps %v, want %v", got, want)
	}
	var window int64
	for _, s := range res.Report.Steps {
		if s.Name == StepPauseWindow {
			window = s.NS
		}
	}
	if window <= 0 {
		t.Fatalf("no pause window in %+v", res.Report)
	}
	if res.SnapshotDir != layout.CheckpointRel("ck_00000000000000c1") {
		t.Fatalf("snapshot dir %q", res.SnapshotDir)
	}
	h.checkRunning(vm, 1)
	m, err := ReadMeta(h.store(res.SnapshotDir))
	if err != nil || m.Op != op.String() || m.Kind != fsm.KindCheckpoint {
		t.Fatalf("meta %+v: %v", m, err)
	}
	// Idempotent: a second call finds it done and leaves the VM alone.
	again, err := h.d.Checkpoint(ctx, captureIntent("ck_00000000000000c1", vm, "", op))
	if err != nil || again.SnapshotDir != res.SnapshotDir || slices.Contains(stepNames(again.Report), StepPause) {
		t.Fatalf("re-run %+v: %v", again, err)
	}
	// Two clones from it.
	for _, c := range []string{"vm-00000000000000c2", "vm-00000000000000c3"} {
		h.clone(c, res.SnapshotDir)
		a, _ := os.Stat(filepath.Join(h.runDir(c), RestoreDir, MemoryFile))
		b, _ := os.Stat(filepath.Join(h.store(res.SnapshotDir), MemoryFile))
		if a == nil || b == nil || !os.SameFile(a, b) {
			t.Fatalf("%s: memory-ranges is not the checkpoint's", c)
		}
	}
	d2, _ := os.Stat(filepath.Join(h.runDir("vm-00000000000000c2"), DiskFile))
	d3, _ := os.Stat(filepath.Join(h.runDir("vm-00000000000000c3"), DiskFile))
	if d2 == nil || d3 == nil || os.SameFile(d2, d3) {
		t.Fatal("the clones share a disk")
	}
	h.checkRunning("vm-00000000000000c3", 3)
	// Removal; the clones run on from their own links.
	if _, err := h.d.RemoveCheckpoint(ctx, fsm.RemoveCheckpoint{OpID: newOp(), Checkpoint: "ck_00000000000000c1", SnapshotDir: res.SnapshotDir}); err != nil {
		t.Fatal(err)
	}
	h.checkGone(h.store(res.SnapshotDir))
	if _, err := h.d.RemoveCheckpoint(ctx, fsm.RemoveCheckpoint{OpID: newOp(), SnapshotDir: res.SnapshotDir}); err != nil {
		t.Fatalf("second removal: %v", err)
	}
	h.checkRunning("vm-00000000000000c2", 3)
	// A removal outside the checkpoint store is refused.
	if _, err := h.d.RemoveCheckpoint(ctx, fsm.RemoveCheckpoint{OpID: newOp(), SnapshotDir: golden}); !executors.IsUnrecoverable(err) {
		t.Fatalf("removal of a golden: %v", err)
	}
}

// A hibernated VM is exported from its hibernate snapshot: no VMM starts,
// the snapshot is untouched, and a clone of the export runs.
func TestCheckpointHibernatedVM(t *testing.T) {
	t.Parallel()
	_, _, hib := sharedSnapshots(t)
	h := newHarness(t, "")
	h.seed(sharedGolden(t))
	src := h.seed(hib)
	memSum := sha(t, filepath.Join(h.store(src), MemoryFile))
	res, err := h.d.Checkpoint(context.Background(), captureIntent("ck_00000000000000d1", "vm-5000000000000000", src, newOp()))
	if err != nil {
		t.Fatal(err)
	}
	if n := len(h.liveVMMs()); n != 0 {
		t.Fatalf("%d VMMs started by an export", n)
	}
	if _, err := ReadMeta(h.store(src)); err != nil || sha(t, filepath.Join(h.store(src), MemoryFile)) != memSum {
		t.Fatalf("hibernate snapshot changed: %v", err)
	}
	h.clone("vm-00000000000000d2", res.SnapshotDir)
	h.checkRunning("vm-00000000000000d2", 1)
}

// Acceptance 2 for checkpoints: a failure at every step of both capture
// recipes (aborted there, or the process dead from there on) leaves no half
// snapshot: the VM runs (a crash mid-pause leaves it paused until the
// re-run), nothing of the op is in the store but a complete checkpoint, and
// the re-run with the same op completes it.
func TestCrashCheckpoint(t *testing.T) {
	t.Parallel()
	_, golden, hib := sharedSnapshots(t)
	const vm = "vm-00000000000000e1"
	const ck = "ck_00000000000000e1"
	rel := layout.CheckpointRel(ck)
	type recipe struct {
		name  string
		setup func(h *harness) fsm.CaptureCheckpoint
	}
	recipes := []recipe{
		{"running", func(h *harness) fsm.CaptureCheckpoint {
			h.clone(vm, h.seed(golden))
			return captureIntent(ck, vm, "", newOp())
		}},
		{"hibernated", func(h *harness) fsm.CaptureCheckpoint {
			return captureIntent(ck, vm, h.seed(hib), newOp())
		}},
	}
	for _, rc := range recipes {
		steps := stepsOf(t, func(h *harness) executors.Result {
			res, err := h.d.Checkpoint(context.Background(), rc.setup(h))
			if err != nil {
				t.Fatal(err)
			}
			return res
		})
		steps = slices.DeleteFunc(steps, func(s string) bool { return s == StepPauseWindow })
		for _, sc := range scenarios(steps, "", false) {
			m, step := crashMode(sc[0]), sc[1]
			t.Run(rc.name+"/"+sc[0]+"/"+step, func(t *testing.T) {
				t.Parallel()
				h := newHarness(t, "")
				in := rc.setup(h)
				ctx := context.Background()
				h.inject(fsm.KindCheckpoint, step, m)
				if _, err := h.d.Checkpoint(ctx, in); err == nil {
					t.Fatal("checkpoint succeeded through an injected failure")
				}
				if m == modeAbort {
					h.checkNoTemps()
					// Rolled back, past the rename too: nothing in the store.
					h.checkGone(h.store(rel))
					if in.Source == "" {
						h.checkRunning(vm, 1)
					}
				}
				h.afterFailure(m)
				if m == modeCrash {
					h.checkNoTemps() // the start-up sweep
					if meta, err := ReadMeta(h.store(rel)); err == nil && meta.Op != in.OpID.String() {
						t.Fatalf("another op's checkpoint: %+v", meta)
					} else if _, serr := os.Stat(h.store(rel)); err != nil && serr == nil {
						t.Fatalf("a half checkpoint stands in the store: %v", err)
					}
				}
				res, err := h.d.Checkpoint(ctx, in)
				if err != nil {
					t.Fatalf("re-run: %v", err)
				}
				if meta, err := ReadMeta(h.store(res.SnapshotDir)); err != nil || meta.Op != in.OpID.String() {
					t.Fatalf("checkpoint after the re-run: %+v %v", meta, err)
				}
				h.checkNoTemps()
				if in.Source == "" {
					h.checkRunning(vm, 1)
				} else if n := len(h.liveVMMs()); n != 0 {
					t.Fatalf("%d VMMs after an export", n)
				}
				// What it holds restores.
				h.clone("vm-00000000000000e2", res.SnapshotDir)
				if st := h.vmState("vm-00000000000000e2"); st != ch.StateRunning {
					t.Fatalf("clone of the checkpoint is %q", st)
				}
			})
		}
	}
}

// A checkpoint of a running VM re-run after a restart (a crash past its
// rename: the re-run finds it stored) gives the VM back its doors, which the
// start-up reconcile opens only for the VMs it adopts, not for one in
// flight; and the VM runs on.
func TestCheckpointRerunOpensDoors(t *testing.T) {
	t.Parallel()
	_, golden, _ := sharedSnapshots(t)
	doors := &recDoors{open: map[string]netip.AddrPort{}, sock: map[string]string{}}
	h := newHarness(t, "", func(c *Config) { c.Doors = doors })
	const vm = "vm-00000000000000e7"
	h.clone(vm, h.seed(golden))
	in := captureIntent("ck_00000000000000e7", vm, "", newOp())
	h.inject(fsm.KindCheckpoint, StepSyncTree, modeCrash)
	if _, err := h.d.Checkpoint(context.Background(), in); err == nil {
		t.Fatal("checkpoint succeeded through an injected crash")
	}
	h.afterFailure(modeCrash)
	doors.Close(vm) // the restarted daemon's proxy holds no door
	if _, err := h.d.Checkpoint(context.Background(), in); err != nil {
		t.Fatalf("re-run: %v", err)
	}
	if _, ok := doors.get(vm); !ok {
		t.Fatal("the re-run left the VM without its doors")
	}
	h.checkRunning(vm, 1)
}
