package qemubench

import (
	"strings"
	"testing"
	"time"

	"github.com/sbxlog/sbxlog/executors/fsx"
	"github.com/sbxlog/sbxlog/executors/qemu"
)

func ms(n int) time.Duration { return time.Duration(n) * time.Millisecond }

func hib(stop, migrate, clone, meta, sync, rename, quit int) qemu.RecipeResult {
	return qemu.RecipeResult{Steps: []qemu.Step{
		{Name: qemu.StepStop, Dur: ms(stop)}, {Name: qemu.StepMigrate, Dur: ms(migrate)},
		{Name: qemu.StepClone, Dur: ms(clone)}, {Name: qemu.StepMeta, Dur: ms(meta)},
		{Name: qemu.StepSync, Dur: ms(sync)}, {Name: qemu.StepRename, Dur: ms(rename)},
		{Name: qemu.StepQuit, Dur: ms(quit)},
	}}
}

func wake(prepare, clone, launch, incoming, cont, ready int) qemu.RecipeResult {
	return qemu.RecipeResult{Steps: []qemu.Step{
		{Name: qemu.StepPrepare, Dur: ms(prepare)}, {Name: qemu.StepClone, Dur: ms(clone)},
		{Name: qemu.StepLaunch, Dur: ms(launch)}, {Name: qemu.StepIncoming, Dur: ms(incoming)},
		{Name: qemu.StepCont, Dur: ms(cont)}, {Name: qemu.StepReady, Dur: ms(ready)},
	}}
}

func TestSplitAccountsForEveryStep(t *testing.T) {
	h := hib(1, 5, 20, 10, 2, 1, 3)
	h.Steps = append(h.Steps, qemu.Step{Name: qemu.StepCleanup, Dur: ms(4)})
	p := split([]qemu.RecipeResult{h}, hibSplit)
	if p.total[0] != ms(46) || p.qmp[0] != ms(6) || p.clone[0] != ms(20) || p.fsync[0] != ms(13) || p.proc[0] != ms(3) || p.rest[0] != ms(4) {
		t.Fatalf("hibernate split %+v", p)
	}
	w := split([]qemu.RecipeResult{wake(1, 2, 50, 5, 1, 80)}, wakeSplit)
	if w.total[0] != ms(139) || w.qmp[0] != ms(6) || w.clone[0] != ms(2) || w.fsync[0] != 0 || w.proc[0] != ms(50) || w.rest[0] != ms(81) {
		t.Fatalf("wake split %+v", w)
	}
}

func TestSectionVerdicts(t *testing.T) {
	fast := &fsRun{label: "XFS (reflink)", method: fsx.Reflink,
		hibernate: []qemu.RecipeResult{hib(1, 5, 20, 10, 2, 1, 3)}, wake: []qemu.RecipeResult{wake(1, 1, 50, 5, 1, 80)}}
	slow := &fsRun{label: "ext4 (copy)", method: fsx.Copy,
		hibernate: []qemu.RecipeResult{hib(1, 5, 200, 10, 300, 1, 3)}, wake: []qemu.RecipeResult{wake(1, 90, 50, 5, 1, 80)}}
	sec := section(configFor(true), []*fsRun{fast, slow})
	if len(sec.Rows) != 7 || len(sec.Verdicts) != 4 {
		t.Fatalf("%d rows, %d verdicts", len(sec.Rows), len(sec.Verdicts))
	}
	for _, v := range sec.Verdicts {
		if !strings.HasPrefix(v, "PASS") {
			t.Errorf("verdict %q", v)
		}
	}
	// A filesystem that did not reflink fails the path verdict.
	fast.method = fsx.Copy
	sec = section(configFor(true), []*fsRun{fast, slow})
	if !strings.HasPrefix(sec.Verdicts[0], "MISS") {
		t.Errorf("path verdict with copy on XFS: %q", sec.Verdicts[0])
	}
}
