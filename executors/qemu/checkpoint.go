package qemu

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"

	"github.com/sbxlog/sbxlog/eventlog/event"
	"github.com/sbxlog/sbxlog/executors"
	"github.com/sbxlog/sbxlog/executors/fsx"
	"github.com/sbxlog/sbxlog/executors/layout"
	"github.com/sbxlog/sbxlog/fsm"
)

// Checkpoints: a running VM's state captured into the store, the VM left
// running; or a hibernated VM's snapshot copied as a checkpoint.

// sourceCheckpoint is Meta.Source of a checkpoint.
const sourceCheckpoint = "checkpoint"

// StepPauseWindow is not a step but a measure in the report of a snapshot
// of a VM that runs on (checkpoint, promote): the time the vCPUs were
// stopped, from QMP stop to the end of cont.
const StepPauseWindow = "pause_window"

// Checkpoint implements executors.Checkpointer: Recipes.SnapshotLive of the
// running VM into checkpoint/<id>, or Recipes.CopySnapshot of its hibernate
// snapshot when in.Source is set.
func (d *Driver) Checkpoint(ctx context.Context, in fsm.CaptureCheckpoint) (executors.Result, error) {
	rel := layout.CheckpointRel(in.Checkpoint)
	final := filepath.Join(d.roots.Store, rel)
	var r RecipeResult
	var err error
	if in.Source != "" {
		src, serr := d.roots.SnapshotIn(layout.HibernateStore, in.Source)
		if serr != nil {
			return executors.Result{}, serr
		}
		r, err = d.q.CopySnapshot(ctx, src, filepath.Dir(final), filepath.Base(final), sourceCheckpoint)
		if errors.Is(err, ErrNoSnapshot) {
			err = executors.AsUnrecoverable(err)
		}
	} else {
		runDir, rerr := d.roots.VMRunDir(d.instance, in.VM, in.RunDir)
		if rerr != nil {
			return executors.Result{}, rerr
		}
		r, err = d.q.SnapshotLive(ctx, Spec{RunDir: runDir, StoreDir: filepath.Dir(final)}, filepath.Base(final), sourceCheckpoint)
		if errors.Is(err, ErrNotRunning) {
			err = &executors.Unrecoverable{Err: err, Lost: true}
		}
		if err == nil {
			err = d.ranOn(in.VM, runDir, r, final)
		}
	}
	if err != nil {
		return executors.Result{}, fmt.Errorf("checkpoint %s: %w", in.VM, classify(err))
	}
	return executors.Result{Report: d.report(r), SnapshotDir: rel}, nil
}

// ranOn follows a snapshot of a running VM that runs on (checkpoint,
// promote): its QEMU is watched from now on and its doors are open. A re-run that found the
// snapshot stored (Already: a crash past the rename) never dialled it, and
// the start-up reconcile leaves a VM in flight to its intent, so it was not
// adopted: its QEMU is looked up, and one that died meanwhile lost its VM
// (Lost; the stored copy goes, since no state will reference it).
func (d *Driver) ranOn(vm, runDir string, r RecipeResult, final string) error {
	pid := r.PID
	if r.Already {
		var err error
		if pid, err = d.q.pid(runDir); errors.Is(err, ErrNotRunning) {
			if rerr := d.fs.RemoveAll(final); rerr != nil {
				err = errors.Join(err, rerr)
			}
			return &executors.Unrecoverable{Err: fmt.Errorf("its snapshot stood but %w", err), Lost: true}
		} else if err != nil {
			return err
		}
	}
	d.watch(runDir, pid)
	// Its doors too, as AdoptVM's (Open keeps doors already open).
	d.openDoors(vm)
	return nil
}

// RemoveCheckpoint implements executors.Checkpointer: the checkpoint's dir
// goes (clones of it hold their own copies of RAM and disk), crash-safely
// (fsx.Discard: no half checkpoint under its name).
func (d *Driver) RemoveCheckpoint(_ context.Context, in fsm.RemoveCheckpoint) (executors.Result, error) {
	dir, err := d.roots.SnapshotIn(layout.CheckpointStore, in.SnapshotDir)
	if err != nil {
		return executors.Result{}, err
	}
	t0 := d.q.now()
	if err := fsx.Discard(d.fs, d.roots.Store, dir, in.OpID.String()); err != nil {
		return executors.Result{}, err
	}
	return executors.Result{Report: event.ExecReport{Steps: []event.Step{{Name: StepRemoveSnapshot, NS: int64(d.q.now().Sub(t0))}}}}, nil
}

var _ executors.Checkpointer = (*Driver)(nil)
