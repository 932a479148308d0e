package chdriver

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/sbxlog/sbxlog/executors"
	"github.com/sbxlog/sbxlog/executors/fsx"
	"github.com/sbxlog/sbxlog/executors/layout"
	"github.com/sbxlog/sbxlog/fsm"
)

var promoteKey = fsm.PoolKey{Template: "app:v1", Net: "none", Size: "small"}

func promoteIntent(vm string, op [16]byte, image string) fsm.PromoteVM {
	return fsm.PromoteVM{OpID: op, VM: vm, Key: testKey, Target: promoteKey, RunDir: testInstance + "/" + vm, SnapshotDir: image}
}

// checkPromoted checks a promote's result: a complete golden of the target
// under the op's name, with the digest of its files, and no temp dir.
func (h *harness) checkPromoted(res executors.Result, op [16]byte) {
	h.t.Helper()
	rel := layout.GoldenRel(promoteKey, op)
	if res.SnapshotDir != rel {
		h.t.Fatalf("promoted into %q, want %q", res.SnapshotDir, rel)
	}
	m, err := ReadMeta(h.store(rel))
	if err != nil || m.Kind != fsm.KindPromote || m.Instance != testInstance {
		h.t.Fatalf("promoted snapshot: %+v %v", m, err)
	}
	if d, err := fsx.ContentDigest(h.store(rel), MetaFile); err != nil || d != res.Digest {
		h.t.Fatalf("digest %q, files say %q (%v)", res.Digest, d, err)
	}
	h.checkNoTemps()
}

// collectAll collects rel as the state would once nothing references it,
// and checks that the store keeps only keep under golden/ and no trash.
func (h *harness) collectAll(rel string, keep ...string) {
	h.t.Helper()
	in := fsm.CollectSnapshot{OpID: newOp(), Dir: rel}
	if _, err := h.d.CollectSnapshot(context.Background(), in); err != nil {
		h.t.Fatalf("collect %s: %v", rel, err)
	}
	var want []string
	for _, k := range keep {
		want = append(want, filepath.Base(k))
	}
	if got := h.storeEntries(layout.GoldenStore); !slices.Equal(got, want) {
		h.t.Fatalf("golden store holds %v, want %v", got, want)
	}
	h.checkNoTemps()
}

// Acceptance 2 for promote of a running VM: at each step, an abort rolls
// back (no snapshot, the VM running) and a crash is finished by the re-run
// (or rolled back and redone); either way the VM runs on, and after the
// promoted golden is collected the store holds only what it held before.
func TestCrashPromote(t *testing.T) {
	t.Parallel()
	_, golden, _ := sharedSnapshots(t)
	const vm = "vm-00000000000000e1"
	steps := stepsOf(t, func(h *harness) executors.Result {
		h.clone(vm, h.seed(golden))
		res, err := h.d.Promote(context.Background(), promoteIntent(vm, newOp(), ""))
		if err != nil {
			t.Fatal(err)
		}
		return res
	})
	if !slices.Equal(steps[:4], []string{StepCheck, StepInfo, StepPause, StepMkTemp}) || !slices.Contains(steps, StepResume) {
		t.Fatalf("promote steps %v", steps)
	}
	for _, sc := range scenarios(steps, "", false) {
		m, step := crashMode(sc[0]), sc[1]
		t.Run(sc[0]+"/"+step, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, "")
			g := h.seed(golden)
			h.clone(vm, g)
			op := newOp()
			final := h.store(layout.GoldenRel(promoteKey, op))
			h.inject(fsm.KindPromote, step, m)
			_, err := h.d.Promote(context.Background(), promoteIntent(vm, op, ""))
			if err == nil {
				t.Fatal("promote succeeded through an injected failure")
			}
			if m == modeAbort {
				h.clearInjection()
				if step != StepDigest {
					h.checkGone(final)
				}
				h.checkNoTemps()
				h.checkRunning(vm, 1)
			}
			h.afterFailure(m)
			res, err := h.d.Promote(context.Background(), promoteIntent(vm, op, ""))
			if err != nil {
				t.Fatalf("re-run: %v", err)
			}
			h.checkPromoted(res, op)
			h.checkRunning(vm, 1)
			h.collectAll(res.SnapshotDir, g)
		})
	}
}

// Promote of a hibernated VM copies its image without a VMM; a crash at
// any step is finished by the re-run and the image is left intact.
func TestCrashPromoteHibernated(t *testing.T) {
	t.Parallel()
	_, golden, image := sharedSnapshots(t)
	const vm = "vm-5000000000000000"
	steps := stepsOf(t, func(h *harness) executors.Result {
		res, err := h.d.Promote(context.Background(), promoteIntent(vm, newOp(), h.seed(image)))
		if err != nil {
			t.Fatal(err)
		}
		return res
	})
	for _, sc := range scenarios(steps, "", false) {
		m, step := crashMode(sc[0]), sc[1]
		t.Run(sc[0]+"/"+step, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, "")
			g, img := h.seed(golden), h.seed(image)
			before := sha(t, h.store(filepath.Join(img, MemoryFile)))
			op := newOp()
			h.inject(fsm.KindPromote, step, m)
			if _, err := h.d.Promote(context.Background(), promoteIntent(vm, op, img)); err == nil {
				t.Fatal("promote succeeded through an injected failure")
			}
			h.afterFailure(m)
			h.clearInjection()
			h.checkNoTemps()
			res, err := h.d.Promote(context.Background(), promoteIntent(vm, op, img))
			if err != nil {
				t.Fatalf("re-run: %v", err)
			}
			h.checkPromoted(res, op)
			if n := len(h.liveVMMs()); n != 0 {
				t.Fatalf("%d VMMs: a hibernated promote woke the VM", n)
			}
			if sha(t, h.store(filepath.Join(img, MemoryFile))) != before {
				t.Fatal("the image changed")
			}
			h.collectAll(res.SnapshotDir, g)
		})
	}
}

// A collection cut at its step (abort or crash) leaves the dir whole or
// renamed to trash; the re-run (or the start-up sweep) removes it, and a
// dir already gone is success.
func TestCrashCollect(t *testing.T) {
	t.Parallel()
	golden := sharedGolden(t)
	for _, m := range []crashMode{modeAbort, modeCrash} {
		t.Run(string(m), func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, "")
			g := h.seed(golden)
			in := fsm.CollectSnapshot{OpID: newOp(), Dir: g}
			h.inject(fsm.KindCollect, StepDiscard, m)
			if _, err := h.d.CollectSnapshot(context.Background(), in); err == nil {
				t.Fatal("collect succeeded through an injected failure")
			}
			h.afterFailure(m)
			for range 2 {
				if _, err := h.d.CollectSnapshot(context.Background(), in); err != nil {
					t.Fatalf("re-run: %v", err)
				}
			}
			h.checkGone(h.store(g))
			h.checkNoTemps()
			if _, err := h.d.CollectSnapshot(context.Background(), fsm.CollectSnapshot{OpID: newOp(), Dir: "../etc"}); !executors.IsUnrecoverable(err) {
				t.Fatalf("a dir outside the store: %v", err)
			}
		})
	}
	// A crash between the rename and the removal leaves a trash dir: the
	// start-up sweep removes it.
	h := newHarness(t, "")
	g := h.seed(golden)
	if err := fsx.RenameDir(h.store(g), filepath.Join(h.cfg.Roots.Store, fsx.TrashName("x"))); err != nil {
		t.Fatal(err)
	}
	h.start()
	h.checkNoTemps()
}

// The start-up sweep removes this instance's store entries nothing
// references and keeps what the state references, what an intent in flight
// is making, and every entry of another instance or of none.
func TestSweepStore(t *testing.T) {
	t.Parallel()
	golden := sharedGolden(t)
	h := newHarness(t, "")
	seeded := h.seed(golden)
	seedAs := func(name, instance string) string {
		rel := filepath.Join(layout.GoldenStore, name)
		dst := h.store(rel)
		if err := os.CopyFS(dst, os.DirFS(h.store(seeded))); err != nil {
			t.Fatal(err)
		}
		b, _ := os.ReadFile(filepath.Join(dst, MetaFile))
		var meta map[string]any
		_ = json.Unmarshal(b, &meta)
		if instance == "" {
			delete(meta, "instance")
		} else {
			meta["instance"] = instance
		}
		meta["op"] = name
		b, _ = json.Marshal(meta)
		if err := os.WriteFile(filepath.Join(dst, MetaFile), b, 0o600); err != nil {
			t.Fatal(err)
		}
		return rel
	}
	ref := seedAs("ref", testInstance)
	flight := seedAs("inflight", testInstance)
	stale := seedAs("stale", testInstance)
	foreign := seedAs("foreign", "other-instance")
	unknown := seedAs("legacy", "")
	if err := os.RemoveAll(h.store(seeded)); err != nil {
		t.Fatal(err)
	}
	keep := func(rel, op string) bool { return rel == ref || op == "inflight" }
	sw, err := h.d.SweepStore(context.Background(), keep)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(sw.Stale, []string{stale}) || !slices.Equal(sw.Foreign, []string{foreign}) || !slices.Equal(sw.Unknown, []string{unknown}) {
		t.Fatalf("sweep %+v", sw)
	}
	h.checkGone(h.store(stale))
	for _, rel := range []string{ref, flight, foreign, unknown} {
		if _, err := os.Stat(h.store(rel)); err != nil {
			t.Fatalf("%s removed: %v", rel, err)
		}
	}
	h.checkNoTemps()
}
