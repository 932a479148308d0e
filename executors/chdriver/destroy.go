package chdriver

import (
	"context"

	"github.com/sbxlog/sbxlog/executors"
	"github.com/sbxlog/sbxlog/executors/layout"
	"github.com/sbxlog/sbxlog/executors/vmm"
	"github.com/sbxlog/sbxlog/fsm"
)

// Destroy implements executors.Driver. Every step tolerates what is already
// gone, so a re-run after a crash finishes the job.
func (d *Driver) Destroy(ctx context.Context, in fsm.DestroyVM) (executors.Result, error) {
	runDir, err := d.roots.OwnedRunDir(d.instance, in.Instance, in.VM, in.RunDir, string(in.Kind()))
	if err != nil {
		return executors.Result{}, err
	}
	var snap string
	if in.SnapshotDir != "" {
		if snap, err = d.roots.SnapshotIn(layout.HibernateStore, in.SnapshotDir); err != nil {
			return executors.Result{}, err
		}
	}
	egress := in.Key.Net == NetEgress
	r := d.begin(ctx, string(fsm.KindDestroy), in.OpID, runDir)
	d.closeDoors(in.VM)
	var proc *vmm.Process
	if err := r.step(StepAdopt, func() error {
		var err error
		proc, err = d.attach(r.ctx, runDir, in.VM)
		if proc != nil {
			return nil // unresponsive is fine: Terminate escalates to signals
		}
		return err
	}); err != nil {
		return executors.Result{}, err
	}
	if proc != nil {
		api := d.api(runDir)
		if err := r.step(StepShutdown, func() error { return r.shutdown(api) }); err != nil {
			return executors.Result{}, err
		}
		if err := r.step(StepTerminate, func() error { return d.terminate(r.ctx, runDir, proc) }); err != nil {
			return executors.Result{}, err
		}
	}
	if egress {
		// The tap before its lock: the VMM is gone, and a tap that
		// outlives a failed delete keeps its lock (the kernel keeps the
		// table of a deleted device until the unlock, or the start-up
		// reconcile, removes it).
		if err := r.step(StepTapDelete, func() error { return d.taps.Delete(d.tapName(in.VM)) }); err != nil {
			return executors.Result{}, err
		}
		if err := r.step(StepEgressUnlock, func() error { return d.unlockTap(in.VM) }); err != nil {
			return executors.Result{}, err
		}
	}
	if err := r.step(StepRemoveRun, func() error { return d.fs.RemoveAll(runDir) }); err != nil {
		return executors.Result{}, err
	}
	if snap != "" {
		if err := r.step(StepRemoveSnapshot, func() error { return d.fs.RemoveAll(snap) }); err != nil {
			return executors.Result{}, err
		}
	}
	return r.result(""), nil
}
