package chdriver

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/sbxlog/sbxlog/eventlog/event"
	"github.com/sbxlog/sbxlog/executors"
	"github.com/sbxlog/sbxlog/executors/ch"
	"github.com/sbxlog/sbxlog/executors/layout"
	"github.com/sbxlog/sbxlog/executors/reconcile"
)

// The start-up reconcile's view of the driver (executors/reconcile).
var _ reconcile.Driver = (*Driver)(nil)

// Instance returns the instance id whose run dirs the driver owns.
func (d *Driver) Instance() string { return d.instance }

// VMMBinary returns the VMM executable's absolute path.
func (d *Driver) VMMBinary() string { return d.vmmBin }

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

// AdoptVM takes over the VMM of a VM the state says runs (warm or claimed):
// a VMM serving rel (pid file and cmdline checked) whose VM is Running is
// kept and watched (OnExit) and reported alive; a Paused one is resumed
// first. A VMM that does not answer is kept and reported alive too (it may
// only be slow; its death will be seen). No VMM, or one whose VM is not
// running (which is then stopped), is reported dead with the reason.
func (d *Driver) AdoptVM(ctx context.Context, vm, rel string) (reconcile.Liveness, error) {
	runDir, err := d.roots.VMRunDir(d.instance, vm, rel)
	if err != nil {
		return reconcile.Liveness{}, err
	}
	p, err := d.attach(ctx, runDir, vm)
	switch {
	case p == nil && err != nil:
		return reconcile.Liveness{}, err
	case p == nil:
		return reconcile.Liveness{Detail: "no VMM process"}, nil
	case err != nil:
		d.log.Warn().Err(err).Str("run_dir", runDir).Msg("adopted a VMM that does not answer; watching it")
		d.adoptDoors(vm, runDir)
		return reconcile.Liveness{Alive: true, Pid: p.Pid(), Detail: "unresponsive"}, nil
	}
	api := d.api(runDir)
	info, err := api.Info(ctx)
	state := "no VM"
	if err == nil {
		state = string(info.State)
	}
	switch {
	case err == nil && info.State == ch.StateRunning:
		d.adoptDoors(vm, runDir)
		return reconcile.Liveness{Alive: true, Pid: p.Pid()}, nil
	case err == nil && info.State == ch.StatePaused:
		if rerr := api.Resume(ctx); rerr == nil {
			d.log.Info().Str("run_dir", runDir).Msg("resumed a paused VM at adoption")
			d.adoptDoors(vm, runDir)
			return reconcile.Liveness{Alive: true, Pid: p.Pid(), Detail: "resumed"}, nil
		} else {
			state = "Paused (resume: " + rerr.Error() + ")"
		}
	case err != nil && !ch.IsNotFound(err) && !ch.IsVMMGone(err):
		d.log.Warn().Err(err).Str("run_dir", runDir).Msg("vm.info failed at adoption; watching the VMM")
		d.adoptDoors(vm, runDir)
		return reconcile.Liveness{Alive: true, Pid: p.Pid(), Detail: "vm.info: " + err.Error()}, nil
	}
	if terr := d.terminate(ctx, runDir, p); terr != nil {
		return reconcile.Liveness{}, fmt.Errorf("stop the VMM of %s (VM %s): %w", vm, state, terr)
	}
	return reconcile.Liveness{Detail: "VM is " + state}, nil
}

// HibernateSnapshotDir names, relative to the store, the snapshot the
// hibernate of vm with intent op op makes.
func (d *Driver) HibernateSnapshotDir(vm string, op event.OpID) string {
	return layout.HibernateRel(vm, op)
}

// SweepSnapshots implements reconcile.SnapshotSweeper (layout's
// StaleHibernateSnapshots decides what is stale).
func (d *Driver) SweepSnapshots(ctx context.Context, own map[string][]string, foreign map[string]bool) ([]string, error) {
	stale, err := d.roots.StaleHibernateSnapshots(own, foreign)
	if err != nil {
		return nil, fmt.Errorf("chdriver: %w", err)
	}
	var removed []string
	for _, rel := range stale {
		if ctx.Err() != nil {
			return removed, ctx.Err()
		}
		if err := d.fs.RemoveAll(filepath.Join(d.roots.Store, rel)); err != nil {
			return removed, err
		}
		d.log.Info().Str("snapshot", rel).Msg("removed a snapshot no longer needed (a crash cut its removal short)")
		removed = append(removed, rel)
	}
	return removed, nil
}

// RemoveRunDir removes an entry under InstanceRoot that no VM and no build
// in the state owns: a VMM serving it (pid file and cmdline checked) is
// stopped first, and the tap of a VM of that name when egress is
// configured.
func (d *Driver) RemoveRunDir(ctx context.Context, name string) error {
	if name == "" || strings.ContainsRune(name, '/') || name == "." || name == ".." {
		return executors.Unrecoverablef("run dir name %q", name)
	}
	runDir := filepath.Join(d.InstanceRoot(), name)
	d.closeDoors(name)
	p, err := d.attach(ctx, runDir, name)
	if p != nil {
		if err := d.terminate(ctx, runDir, p); err != nil {
			return err
		}
	} else if err != nil {
		return err
	}
	if d.bridge != "" && !strings.HasPrefix(name, layout.GoldenRunPrefix) {
		// The tap before its lock, which stays on a tap the delete left.
		if err := d.taps.Delete(d.tapName(name)); err != nil {
			d.log.Warn().Err(err).Str("vm", name).Msg("could not delete the tap of a removed run dir; keeping its lock")
		} else if err := d.unlockTap(name); err != nil {
			d.log.Warn().Err(err).Str("vm", name).Msg("could not unlock the tap of a removed run dir")
		}
	}
	return d.fs.RemoveAll(runDir)
}
