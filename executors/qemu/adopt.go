package qemu

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/sbxlog/sbxlog/eventlog/event"
	"github.com/sbxlog/sbxlog/executors"
	"github.com/sbxlog/sbxlog/executors/layout"
	"github.com/sbxlog/sbxlog/executors/reconcile"
	"github.com/sbxlog/sbxlog/fsm"
)

// The start-up reconcile's view of the driver (executors/reconcile). Its
// orphan scan parses Cloud Hypervisor's --api-socket and finds no QEMU; a
// QEMU whose launch a crash cut short before its pid file is found instead
// by Recipes.Adopt's cmdline scan, whenever AdoptVM, RemoveRunDir or a
// re-run intent looks at its run dir.
var _ reconcile.Driver = (*Driver)(nil)

// Instance returns the instance id whose run dirs the driver owns.
func (d *Driver) Instance() string { return d.instance }

// VMMBinary returns the QEMU binary.
func (d *Driver) VMMBinary() string { return d.qemuBin }

// InstanceRoot returns <runs>/<instance>, the parent of every run dir the
// driver may act on.
func (d *Driver) InstanceRoot() string { return d.roots.InstanceRoot(d.instance) }

// RunDirs lists the names of the entries under InstanceRoot.
func (d *Driver) RunDirs() ([]string, error) { return d.roots.InstanceRunDirs(d.instance) }

// GoldenRunDir returns the name (under InstanceRoot) of the run dir the
// golden build with intent op id op uses.
func (d *Driver) GoldenRunDir(op event.OpID) string {
	return filepath.Base(d.roots.GoldenRunDir(d.instance, op))
}

// AdoptVM takes over the QEMU of a VM the state says runs (warm or claimed):
// one serving rel (pid file and cmdline checked) whose VM runs is watched
// (OnExit) and reported alive; a stopped one (paused, or postmigrate after a
// hibernate a crash cut short) is resumed first. One whose QMP does not
// answer is watched and reported alive too (it may only be slow; its death
// will be seen). No QEMU, or one whose VM is in any other state (then
// stopped, its run dir and logs kept), is reported dead with the reason.
func (d *Driver) AdoptVM(ctx context.Context, vm, rel string) (reconcile.Liveness, error) {
	runDir, err := d.roots.VMRunDir(d.instance, vm, rel)
	if err != nil {
		return reconcile.Liveness{}, err
	}
	spec := Spec{RunDir: runDir, StoreDir: d.roots.Store}
	pid, err := d.q.Adopt(spec)
	if errors.Is(err, ErrNotRunning) {
		return reconcile.Liveness{Detail: "no QEMU process"}, nil
	}
	if err != nil {
		return reconcile.Liveness{}, err
	}
	st, err := d.q.Status(ctx, spec)
	switch {
	case errors.Is(err, ErrNotRunning):
		return reconcile.Liveness{Detail: "QEMU exited during adoption"}, nil
	case err != nil:
		d.log.Warn().Err(err).Str("run_dir", runDir).Msg("adopted a QEMU whose QMP does not answer; watching it")
		d.watch(runDir, pid)
		d.openDoors(vm)
		return reconcile.Liveness{Alive: true, Pid: pid, Detail: "unresponsive: " + err.Error()}, nil
	case st == "running":
		d.watch(runDir, pid)
		d.openDoors(vm)
		return reconcile.Liveness{Alive: true, Pid: pid}, nil
	case st == "paused" || st == "postmigrate":
		if _, rerr := d.q.Resume(ctx, spec); rerr == nil {
			d.log.Info().Str("run_dir", runDir).Str("status", st).Msg("resumed a stopped VM at adoption")
			d.watch(runDir, pid)
			d.openDoors(vm)
			return reconcile.Liveness{Alive: true, Pid: pid, Detail: "resumed from " + st}, nil
		} else {
			st += " (resume: " + rerr.Error() + ")"
		}
	}
	if err := d.q.Stop(ctx, spec); err != nil {
		return reconcile.Liveness{}, fmt.Errorf("stop the QEMU of %s (VM %s): %w", vm, st, err)
	}
	return reconcile.Liveness{Detail: "VM is " + st}, nil
}

// RemoveRunDir removes an entry under InstanceRoot that no VM and no build in
// the state owns; a QEMU serving it (pid file, or cmdline when the pid file
// was never written) is stopped first.
func (d *Driver) RemoveRunDir(ctx context.Context, name string) error {
	if name == "" || strings.ContainsRune(name, '/') || name == "." || name == ".." {
		return executors.Unrecoverablef("run dir name %q", name)
	}
	runDir := filepath.Join(d.InstanceRoot(), name)
	d.unwatch(runDir)
	_, err := d.q.Destroy(ctx, Spec{RunDir: runDir, StoreDir: d.roots.Store})
	return err
}

var _ executors.Restarter = (*Driver)(nil)

// Restart implements executors.Restarter: the VM whose QEMU died is booted
// again, cold, in its own run dir (the guest has no disk, so it starts with
// nothing of what it had in memory). A re-run finds the QEMU an interrupted
// attempt booted and keeps it once its agent answers. On error no QEMU of the
// VM runs and the run dir (with its logs) is kept.
func (d *Driver) Restart(ctx context.Context, in fsm.RestartVM) (executors.Result, error) {
	runDir, err := d.roots.OwnedRunDir(d.instance, in.Instance, in.VM, in.RunDir, string(in.Kind()))
	if err != nil {
		return executors.Result{}, err
	}
	spec, err := d.bootSpec(ctx, runDir, d.roots.Store, in.Key)
	if err != nil {
		return executors.Result{}, fmt.Errorf("restart %s: %w", in.VM, err)
	}
	if spec.EgressNIC {
		// The tap and its lock outlived the QEMU that died; making them
		// again is idempotent, and gives the NIC to the new launch.
		if spec.Egress, err = d.attachEgress(in.VM); err != nil {
			return executors.Result{}, fmt.Errorf("restart %s: %w", in.VM, err)
		}
	}
	d.unwatch(runDir)
	r, err := d.q.Boot(ctx, spec)
	if err != nil {
		d.cleanup(ctx, "stop "+in.VM+" after a failed restart", func(ctx context.Context) error { return d.q.Stop(ctx, spec) })
		return executors.Result{}, fmt.Errorf("restart %s: %w", in.VM, classify(err))
	}
	d.watch(runDir, r.PID)
	d.openDoors(in.VM)
	if err := d.reattachVolumes(ctx, runDir, in.Volumes); err != nil {
		return executors.Result{}, fmt.Errorf("restart %s: %w", in.VM, err)
	}
	return executors.Result{Report: d.report(r)}, nil
}

var _ reconcile.SnapshotSweeper = (*Driver)(nil)

// HibernateSnapshotDir implements reconcile.SnapshotSweeper: the snapshot
// (relative to the store) the hibernate of vm with intent op makes.
func (d *Driver) HibernateSnapshotDir(vm string, op event.OpID) string {
	return layout.HibernateRel(vm, op)
}

// SweepSnapshots implements reconcile.SnapshotSweeper (layout's
// StaleHibernateSnapshots decides what is stale).
func (d *Driver) SweepSnapshots(ctx context.Context, own map[string][]string, foreign map[string]bool) ([]string, error) {
	stale, err := d.roots.StaleHibernateSnapshots(own, foreign)
	if err != nil {
		return nil, fmt.Errorf("qemu: %w", err)
	}
	var removed []string
	for _, rel := range stale {
		if ctx.Err() != nil {
			return removed, ctx.Err()
		}
		if err := os.RemoveAll(filepath.Join(d.roots.Store, rel)); err != nil {
			return removed, fmt.Errorf("qemu: %w", err)
		}
		d.log.Info().Str("snapshot", rel).Msg("removed a snapshot no longer needed (a crash cut its removal short)")
		removed = append(removed, rel)
	}
	return removed, nil
}
