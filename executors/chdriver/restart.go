package chdriver

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/sbxlog/sbxlog/executors"
	"github.com/sbxlog/sbxlog/executors/ch"
	"github.com/sbxlog/sbxlog/executors/vmm"
	"github.com/sbxlog/sbxlog/fsm"
)

var _ executors.Restarter = (*Driver)(nil)

// Restart implements executors.Restarter: the VM is booted again from the
// template's kernel with the disk in its own run dir (cow.raw, which holds
// everything the guest wrote; its memory is lost). The disk is never
// removed here, so a failed attempt can be retried: on error no VMM of the
// VM runs and the run dir keeps cow.raw (and vmm.log).
//
// A re-run after a crash finds the VMM the earlier attempt booted: Running
// (or Paused) it is adopted and finished (resume, probe); anything else is
// stopped and the boot starts over.
func (d *Driver) Restart(ctx context.Context, in fsm.RestartVM) (executors.Result, error) {
	runDir, err := d.roots.OwnedRunDir(d.instance, in.Instance, in.VM, in.RunDir, string(in.Kind()))
	if err != nil {
		return executors.Result{}, err
	}
	egress, err := d.checkEgress(in.Key)
	if err != nil {
		return executors.Result{}, err
	}
	r := d.begin(ctx, string(fsm.KindRestart), in.OpID, runDir)
	stop := func() {
		r.undo("undo_"+StepTerminate, func(ctx context.Context) error {
			p, err := d.attach(ctx, runDir, in.VM)
			if p == nil {
				return err
			}
			return d.terminate(ctx, runDir, p)
		})
	}

	done, err := d.adoptRestarted(r, in.VM, runDir)
	if err != nil {
		stop()
		return executors.Result{}, err
	}
	if done {
		d.openDoors(r, in.VM, runDir)
		if err := d.reattachVolumes(r.ctx, in); err != nil {
			return executors.Result{}, err
		}
		return r.result(""), nil
	}
	disk := filepath.Join(runDir, DiskFile)
	if err := r.step(StepCheck, func() error {
		if _, err := os.Stat(disk); err != nil {
			return executors.Unrecoverablef("the VM's disk is gone: %w", err)
		}
		return nil
	}); err != nil {
		return executors.Result{}, err
	}
	_, cfg, err := d.templateConfig(r, in.Key, runDir, false)
	if err != nil {
		return executors.Result{}, err
	}
	if egress {
		_ = cfg.Set([]any{map[string]any{"id": NICID, "tap": d.tapName(in.VM), "mac": MAC(in.VM)}}, "net")
	}
	if err := r.step(StepResetRun, func() error { return d.clearRunDir(runDir) }); err != nil {
		return executors.Result{}, err
	}
	if egress {
		if err := r.step(StepTapCreate, func() error { return d.taps.Create(d.tapName(in.VM), d.bridge) }); err != nil {
			return executors.Result{}, err
		}
		if err := d.lockTap(r, in.VM); err != nil {
			return executors.Result{}, err
		}
	}
	if err := d.boot(r, runDir, in.VM, cfg); err != nil {
		stop()
		return executors.Result{}, fmt.Errorf("restart %s: %w", in.VM, err)
	}
	d.openDoors(r, in.VM, runDir)
	if err := d.reattachVolumes(r.ctx, in); err != nil {
		return executors.Result{}, err
	}
	return r.result(""), nil
}

// adoptRestarted finishes a VM an interrupted restart already booted: done
// when it runs (resumed if paused) and answers the probe. A VMM that serves
// the run dir with no running VM is stopped.
func (d *Driver) adoptRestarted(r *run, vm, runDir string) (done bool, err error) {
	var proc *vmm.Process
	var info *ch.VmInfo
	api := d.api(runDir)
	if err := r.step(StepAdopt, func() error {
		p, aerr := d.attach(r.ctx, runDir, vm)
		proc = p
		if p != nil && aerr == nil {
			info, _ = api.Info(r.ctx)
		}
		return nil
	}); err != nil || proc == nil {
		return false, err
	}
	if info == nil || (info.State != ch.StateRunning && info.State != ch.StatePaused) {
		r.log.Info().Str("run_dir", runDir).Msg("stopping a VMM whose VM does not run before the restart")
		return false, r.step(StepTerminate, func() error { return d.terminate(r.ctx, runDir, proc) })
	}
	r.log.Info().Str("run_dir", runDir).Str("state", string(info.State)).Msg("adopting the VM an interrupted restart booted")
	return true, d.resumeAndProbe(r, api, vm, runDir, false, info.State == ch.StatePaused)
}

// clearRunDir removes what a dead VMM and the VM's last restore left in the
// run dir, keeping the disk and the VMM's log: sockets that would make the
// new VMM's bind fail, the pid file, the restore files.
func (d *Driver) clearRunDir(runDir string) error {
	ents, err := os.ReadDir(runDir)
	if err != nil {
		return err
	}
	for _, e := range ents {
		switch e.Name() {
		case DiskFile, vmm.LogFile:
			continue
		}
		if err := d.fs.RemoveAll(filepath.Join(runDir, e.Name())); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	return nil
}
