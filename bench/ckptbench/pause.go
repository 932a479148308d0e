// Package ckptbench holds the checkpoint and fork benchmark sections (issue
// 24, acceptance 6):
//
//   - pausebench (RunPause): how long a checkpoint pauses a real guest.
//     The project's 256 MiB QEMU test guest (TCG) on a loop-mounted XFS
//     with reflink is checkpointed by the recipe every checkpoint runs
//     (qemu.Recipes.SnapshotLive: stop, device state into a temp dir in the
//     store, FICLONE of RAM and disk, cont; then meta.json, SyncTree and
//     rename while the guest runs). The pause window is the recipe's own
//     measure (its qemu.StepPauseWindow, from before the stop to the end of
//     cont); the checkpoint call is the recipe's wall time. Comparator, in
//     the same run on the same guest: a hibernate's capture (its stop,
//     migrate and clone steps), which pauses the guest for the same work
//     and then makes it durable before quitting it.
//   - forkbench (RunFork): a fork of N children (N = 1, 8, 32) against a
//     warm claim and a clone-tier claim, through a built sandboxd with the
//     chsim hypervisor (the control plane's cost: the fsm, the op log, the
//     executors, the VMM API round trips and the snapshot files; chsim runs
//     no guest), in the same run on the same node.
package ckptbench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"time"

	"github.com/sbxlog/sbxlog/bench/qemubench"
	"github.com/sbxlog/sbxlog/bench/report"
	"github.com/sbxlog/sbxlog/executors/guest/agent"
	"github.com/sbxlog/sbxlog/executors/guest/guesttest"
	"github.com/sbxlog/sbxlog/executors/qemu"
)

// pauseConfig sizes a pausebench run.
type pauseConfig struct {
	cycles    int   // checkpoint + hibernate/wake cycles
	resident  int64 // bytes the guest writes once (RAM it keeps using)
	dirty     int64 // bytes the guest rewrites before each snapshot
	memoryMiB int
}

func pauseConfigFor(quick bool) pauseConfig {
	if quick {
		return pauseConfig{cycles: 2, resident: 16 << 20, dirty: 8 << 20, memoryMiB: 256}
	}
	return pauseConfig{cycles: 12, resident: 96 << 20, dirty: 8 << 20, memoryMiB: 256}
}

// pauseTarget: a checkpoint may pause the guest at most this much longer
// than a hibernate's capture of the same guest takes (ratio), the slack
// being the cont and the QMP status query the hibernate's stop step
// already holds.
const pauseTarget = 1.25

// pauseSample is one cycle's figures.
type pauseSample struct {
	call    time.Duration    // SnapshotLive's wall time
	pause   time.Duration    // its StepPauseWindow
	parts   [4]time.Duration // its stop, migrate, clone and cont steps
	after   time.Duration    // meta + sync + rename, while the guest runs
	capture time.Duration    // the hibernate's stop + migrate + clone
	hib     time.Duration    // the hibernate's wall time
}

// RunPause measures the pausebench section.
func RunPause(ctx context.Context, opts report.Options) (*report.Section, error) {
	cfg := pauseConfigFor(opts.Quick)
	if os.Geteuid() != 0 {
		return nil, errors.New("pausebench: needs root to loop-mount XFS")
	}
	if _, err := exec.LookPath("mkfs.xfs"); err != nil {
		return nil, fmt.Errorf("pausebench: mkfs.xfs not found (apt-get install xfsprogs)")
	}
	g, err := guesttest.Build(ctx)
	if err != nil {
		return nil, fmt.Errorf("pausebench: guest: %w", err)
	}
	d, err := qemu.NewRecipes(qemu.RecipesConfig{Accel: qemu.AccelTCG})
	if err != nil {
		return nil, err
	}
	mnt, unmount, err := qemubench.MountLoop(ctx, opts.Scratch, "xfs", 4<<30)
	if err != nil {
		return nil, fmt.Errorf("pausebench: %w", err)
	}
	defer func() { _ = unmount() }()
	samples, err := measurePause(ctx, cfg, d, g, mnt)
	if err != nil {
		return nil, fmt.Errorf("pausebench: %w", err)
	}
	return pauseSection(cfg, samples), nil
}

// measurePause boots a golden in a store at mnt, clones a VM that writes
// its resident data, and runs the cycles: the guest dirties memory, is checkpointed (and must answer after
// it), dirties again, is hibernated and woken (its data checked).
func measurePause(ctx context.Context, cfg pauseConfig, d *qemu.Recipes, g guesttest.Guest, mnt string) (out []pauseSample, err error) {
	var golden string
	vm, destroy, err := qemubench.StartVM(ctx, d, g, mnt, cfg.memoryMiB, cfg.resident, &golden)
	if err != nil {
		return nil, err
	}
	defer func() {
		if derr := destroy(); derr != nil && err == nil {
			err = derr
		}
	}()
	write := func(n int64) (string, error) {
		return qemubench.GuestDo(ctx, vm, func(a *agent.Client) (string, error) { return a.Write(ctx, n) })
	}
	sha := func() (string, error) {
		return qemubench.GuestDo(ctx, vm, func(a *agent.Client) (string, error) { return a.Sha(ctx) })
	}
	for i := range cfg.cycles {
		sum, err := write(cfg.dirty)
		if err != nil {
			return nil, fmt.Errorf("cycle %d: write: %w", i, err)
		}
		ck := fmt.Sprintf("ck-%d", i)
		t0 := time.Now()
		cr, err := d.SnapshotLive(ctx, vm, ck, "checkpoint")
		call := time.Since(t0)
		if err != nil {
			return nil, fmt.Errorf("cycle %d: checkpoint: %w", i, err)
		}
		// The guest ran on: it answers, with its data.
		if got, err := sha(); err != nil || got != sum {
			return nil, fmt.Errorf("cycle %d: guest after the checkpoint: sha %q (%v), want %q", i, got, err, sum)
		}
		if sum, err = write(cfg.dirty); err != nil {
			return nil, fmt.Errorf("cycle %d: write: %w", i, err)
		}
		hib := fmt.Sprintf("hib-%d", i)
		t0 = time.Now()
		hr, err := d.Hibernate(ctx, vm, hib)
		hibWall := time.Since(t0)
		if err != nil {
			return nil, fmt.Errorf("cycle %d: hibernate: %w", i, err)
		}
		if _, err := d.Wake(ctx, vm, hib); err != nil {
			return nil, fmt.Errorf("cycle %d: wake: %w", i, err)
		}
		if got, err := sha(); err != nil || got != sum {
			return nil, fmt.Errorf("cycle %d: guest after wake: sha %q (%v), want %q", i, got, err, sum)
		}
		for _, n := range []string{ck, hib} {
			if err := os.RemoveAll(vm.SnapshotDir(n)); err != nil {
				return nil, err
			}
		}
		out = append(out, pauseSample{
			call: call, pause: cr.Dur(qemu.StepPauseWindow),
			parts:   [4]time.Duration{cr.Dur(qemu.StepStop), cr.Dur(qemu.StepMigrate), cr.Dur(qemu.StepClone), cr.Dur(qemu.StepCont)},
			after:   cr.Dur(qemu.StepMeta) + cr.Dur(qemu.StepSync) + cr.Dur(qemu.StepRename),
			capture: hr.Dur(qemu.StepStop) + hr.Dur(qemu.StepMigrate) + hr.Dur(qemu.StepClone),
			hib:     hibWall,
		})
	}
	return out, nil
}

func pauseSection(cfg pauseConfig, samples []pauseSample) *report.Section {
	sec := &report.Section{
		Title: "Checkpoint pause window of a running guest (QEMU, XFS reflink)",
		Method: fmt.Sprintf(`executors/qemu's live-snapshot recipe (Recipes.SnapshotLive, the checkpoint's and
promote's) on the project's %d MiB TCG guest, RAM in a share=on memory-backend-file, on a 4 GiB
loop-mounted XFS with reflink=1. One clone of a golden writes %d MiB once into its tmpfs, then %d
cycles of: guest rewrites %d MiB, checkpoint (the guest must answer after it with its data),
guest rewrites %d MiB, hibernate, wake (data checked). Pause window: the recipe's own measure
(pause_window, from before QMP stop to the end of cont: the status query, stop, device state
into a temp dir in the store, FICLONE of RAM and disk, cont). Checkpoint call: SnapshotLive's
wall time (QMP dial, the pause, then meta.json, SyncTree and the rename while the guest runs).
Comparator, same guest, same run: the hibernate's capture (its stop, migrate and clone steps),
the same work a hibernate pauses the guest for before making it durable and quitting it. Target:
the checkpoint pauses the guest no longer than %.2fx that capture at p50 (the slack is the cont);
the durability steps run after the cont, outside the pause. Cells are p50 / p99 over the cycles.`,
			cfg.memoryMiB, cfg.resident>>20, cfg.cycles, cfg.dirty>>20, cfg.dirty>>20, pauseTarget),
		Header: []string{"measure", "p50 / p99", "samples"},
	}
	var call, pause, after, capture, hib report.Durations
	var parts [4]report.Durations
	for _, s := range samples {
		call = append(call, s.call)
		pause = append(pause, s.pause)
		for i, d := range s.parts {
			parts[i] = append(parts[i], d)
		}
		after = append(after, s.after)
		capture = append(capture, s.capture)
		hib = append(hib, s.hib)
	}
	cell := func(d report.Durations) string {
		return report.Fmt(d.Quantile(0.5)) + " / " + report.Fmt(d.Quantile(0.99))
	}
	sec.AddRow("checkpoint call (SnapshotLive wall time)", cell(call), len(call))
	sec.AddRow("  pause window (stop to end of cont)", cell(pause), len(pause))
	for i, name := range []string{"QMP status + stop", "migrate (device state to the temp dir)", "FICLONE of RAM and disk", "QMP cont"} {
		sec.AddRow("    "+name, cell(parts[i]), len(parts[i]))
	}
	sec.AddRow("  meta + SyncTree + rename, guest running", cell(after), len(after))
	sec.AddRow("hibernate's capture: stop + migrate + clone (comparator)", cell(capture), len(capture))
	sec.AddRow("hibernate call (wall time, for reference)", cell(hib), len(hib))
	p, c, k := pause.Quantile(0.5), capture.Quantile(0.5), call.Quantile(0.5)
	sec.Verdict(pauseOK(p, c), "pause window p50 %s vs the hibernate's capture %s (%.2fx; target <= %.2fx)",
		report.Fmt(p), report.Fmt(c), ratio(p, c), pauseTarget)
	sec.Notes = append(sec.Notes,
		fmt.Sprintf("The pause is %.0f%% of the checkpoint call at p50 (%s of %s): the rest runs with the guest resumed.", 100*ratio(p, k), report.Fmt(p), report.Fmt(k)),
		"TCG, not KVM: the pause's parts are QMP, the device-state write and FICLONE, none of which depends on the accelerator.")
	return sec
}

func pauseOK(pause, capture time.Duration) bool {
	return float64(pause) <= pauseTarget*float64(capture)
}

func ratio(a, b time.Duration) float64 { return float64(a) / float64(max(b, 1)) }
