package chdriver

import (
	"context"
	"fmt"
	"path/filepath"

	"github.com/sbxlog/sbxlog/eventlog/event"
	"github.com/sbxlog/sbxlog/executors"
	"github.com/sbxlog/sbxlog/executors/fsx"
	"github.com/sbxlog/sbxlog/executors/layout"
	"github.com/sbxlog/sbxlog/executors/transport"
	"github.com/sbxlog/sbxlog/fsm"
)

// StepPauseWindow is not a step but a measure in the report of a snapshot of
// a VM that runs on (checkpoint, promote): the time the VM was paused, from
// vm.pause to the end of vm.resume.
const StepPauseWindow = "pause_window"

// Checkpoint implements executors.Checkpointer. A running VM is captured by
// snapshotLive (it runs on); a hibernated VM is exported from its hibernate
// snapshot without a VMM (copyImage). A re-run finds a complete checkpoint
// of its op in the store and only makes it durable again; anything less is
// started over (the start-up sweep removes temp dirs), so a crash at any
// step leaves the checkpoint done or absent.
func (d *Driver) Checkpoint(ctx context.Context, in fsm.CaptureCheckpoint) (executors.Result, error) {
	rel := layout.CheckpointRel(in.Checkpoint)
	meta := Meta{Kind: fsm.KindCheckpoint, Op: in.OpID.String(), VM: in.VM, Key: in.Key}
	if in.Source != "" {
		src, err := d.roots.SnapshotIn(layout.HibernateStore, in.Source)
		if err != nil {
			return executors.Result{}, err
		}
		return d.copyImage(d.begin(ctx, string(fsm.KindCheckpoint), in.OpID, src), src, rel, meta)
	}
	runDir, err := d.roots.VMRunDir(d.instance, in.VM, in.RunDir)
	if err != nil {
		return executors.Result{}, err
	}
	return d.snapshotLive(d.begin(ctx, string(fsm.KindCheckpoint), in.OpID, runDir), "checkpoint", in.VM, runDir, rel, meta)
}

// snapshotLive snapshots the running VM vm into rel and lets it run on
// (checkpoint, promote): pauseSnapshot with runOn, in the hibernate
// recipe's order but resumed as soon as its memory and disk are in the
// temp dir; the resume (or its rollback) gives the VM its doors. A re-run
// that finds the op's snapshot complete under rel only makes it durable
// again (storedSnapshot).
func (d *Driver) snapshotLive(r *run, verb, vm, runDir, rel string, m Meta) (executors.Result, error) {
	if res, done, err := d.storedSnapshot(r, rel); done || err != nil {
		if err != nil {
			return res, err
		}
		return res, d.ranOn(r, verb, vm, runDir, rel)
	}
	proc, api, _, gone, err := d.liveVM(r, verb, vm, runDir)
	if err != nil {
		return executors.Result{}, err
	}
	mode, err := d.pauseSnapshot(r, api, proc, gone, runDir, filepath.Join(d.roots.Store, rel), m, true)
	if err != nil {
		return executors.Result{}, err
	}
	res := r.result(rel)
	res.Report.CopyMode = mode
	return res, nil
}

// ranOn is the check of a re-run that found its snapshot of a running VM
// stored (a crash past the rename, so past the resume): the VM goes back to
// running, so its VMM must still run, and from now on be watched and have
// its doors, as an adopted one (the start-up reconcile leaves a VM in
// flight to its intent). A VMM that died meanwhile lost its VM: the
// snapshot is reported failed with it (Lost), and goes, since no state
// will reference it.
func (d *Driver) ranOn(r *run, verb, vm, runDir, rel string) error {
	proc, err := d.attach(r.ctx, runDir, vm)
	if proc != nil {
		d.openDoors(r, vm, runDir)
		return nil
	}
	if err != nil {
		return fmt.Errorf("%s %s: %w", verb, vm, err)
	}
	r.undo("undo_"+StepRename, func(context.Context) error { return d.fs.RemoveAll(filepath.Join(d.roots.Store, rel)) })
	return executors.Lostf("%s %s: its snapshot stood but no VMM runs in %s any more", verb, vm, runDir)
}

// copyImage makes rel a snapshot of its own from the stored image src (a
// hibernated VM's) without a VMM (checkpoint, promote): its memory-ranges
// hard-linked (nothing ever writes a snapshot's memory file), its disk
// reflinked, its config and state copied into a temp dir in the store, then
// publish. src is not modified. A re-run that finds the op's snapshot
// complete under rel only makes it durable again (storedSnapshot).
func (d *Driver) copyImage(r *run, src, rel string, m Meta) (executors.Result, error) {
	if res, done, err := d.storedSnapshot(r, rel); done || err != nil {
		return res, err
	}
	if err := r.step(StepCheck, func() error { _, err := ReadMeta(src); return err }); err != nil {
		return executors.Result{}, executors.AsUnrecoverable(err)
	}
	var tmp string
	dropTemp := func(err error) error {
		if tmp != "" {
			r.undo("undo_"+StepMkTemp, func(context.Context) error { return d.fs.RemoveAll(tmp) })
		}
		return err
	}
	if err := r.step(StepMkTemp, func() error {
		var err error
		tmp, err = d.fs.MkTempDir(d.roots.Store, string(m.Kind))
		return err
	}); err != nil {
		return executors.Result{}, dropTemp(err)
	}
	if err := r.step(StepLinkMemory, func() error {
		return d.fs.Link(filepath.Join(tmp, MemoryFile), filepath.Join(src, MemoryFile))
	}); err != nil {
		return executors.Result{}, dropTemp(err)
	}
	if err := r.step(StepWriteState, func() error {
		for _, f := range []string{StateFile, ConfigFile} {
			if _, err := d.fs.Clone(filepath.Join(tmp, f), filepath.Join(src, f)); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		return executors.Result{}, dropTemp(err)
	}
	var mode string
	if err := r.step(StepCloneDisk, func() error {
		res, err := d.fs.Clone(filepath.Join(tmp, DiskFile), filepath.Join(src, DiskFile))
		r.noteClone(res.Method)
		mode = res.Method.String()
		return err
	}); err != nil {
		return executors.Result{}, dropTemp(err)
	}
	final := filepath.Join(d.roots.Store, rel)
	if err := d.publish(r, tmp, final, m, mode, dropTemp); err != nil {
		if got, merr := ReadMeta(final); merr == nil && got.Op == r.op.String() {
			// Past the rename: the failure is reported, so nothing will
			// reference the copy.
			r.undo("undo_"+StepRename, func(context.Context) error { return d.fs.RemoveAll(final) })
		}
		return executors.Result{}, err
	}
	res := r.result(rel)
	res.Report.CopyMode = mode
	return res, nil
}

// storedSnapshot finishes a re-run that finds its op's snapshot complete
// in the store under rel (a crash after the rename): it is made durable
// again. A dir under the name with another op's meta is not this op's to
// touch.
func (d *Driver) storedSnapshot(r *run, rel string) (res executors.Result, done bool, err error) {
	final := filepath.Join(d.roots.Store, rel)
	var m *Meta
	if err := r.step(StepCheck, func() error {
		if got, err := ReadMeta(final); err == nil {
			m = got
		}
		return nil
	}); err != nil || m == nil {
		return res, false, err
	}
	if m.Op != r.op.String() {
		return res, true, executors.Unrecoverablef("%s holds another op's snapshot (%s)", rel, m.Op)
	}
	if err := r.step(StepSyncTree, func() error { return d.fs.SyncTree(final) }); err != nil {
		return res, true, err
	}
	res = r.result(rel)
	res.Report.CopyMode = m.CopyMode
	return res, true, nil
}

// RemoveCheckpoint implements executors.Checkpointer: the checkpoint's dir
// goes (nothing clones from it any more; clones hard-linked its memory),
// crash-safely (fsx.Discard: no half checkpoint under its name).
func (d *Driver) RemoveCheckpoint(ctx context.Context, in fsm.RemoveCheckpoint) (executors.Result, error) {
	dir, err := d.roots.SnapshotIn(layout.CheckpointStore, in.SnapshotDir)
	if err != nil {
		return executors.Result{}, err
	}
	r := d.begin(ctx, string(fsm.KindCheckpointDelete), in.OpID, dir)
	if err := r.step(StepRemoveSnapshot, func() error { return fsx.Discard(d.fs, d.roots.Store, dir, in.OpID.String()) }); err != nil {
		return executors.Result{}, err
	}
	return r.result(""), nil
}

var _ executors.Checkpointer = (*Driver)(nil)

// UseTransport configures the checkpoint imports (transport.Receiver) with
// this driver's filesystem and step hook, so the import's steps run through
// the same seam as every CH recipe (recipe "checkpoint_import": the
// SBX_CRASH_AT crash tests).
func (d *Driver) UseTransport(c transport.Config) {
	if c.FS == nil {
		c.FS = d.fs
	}
	if c.Hook == nil && d.hook != nil {
		c.Hook = func(ctx context.Context, step string, op event.OpID) error {
			return d.hook(ctx, StepCall{Recipe: string(fsm.KindCheckpointImport), Step: step, Op: op})
		}
	}
	d.Receiver.UseTransport(c)
}
