package chdriver

import (
	"context"
	"path/filepath"

	"github.com/sbxlog/sbxlog/eventlog/event"
	"github.com/sbxlog/sbxlog/executors"
	"github.com/sbxlog/sbxlog/executors/layout"
	"github.com/sbxlog/sbxlog/fsm"
)

// StepPauseWindow is not a step but a measure in a checkpoint's report: the
// time the VM was paused, from vm.pause to the end of vm.resume.
const StepPauseWindow = "pause_window"

// Checkpoint implements executors.Checkpointer. A running VM is captured in
// the hibernate recipe's order, but resumed as soon as its memory and disk
// are in the temp dir (pause, snapshot, FICLONE cow.raw, resume), so the
// pause window holds only what needs the VM still; the files are then made
// durable (SyncTree, meta.json, rename, SyncTree) while it runs. A
// hibernated VM is exported from its hibernate snapshot without a VMM: its
// memory-ranges hard-linked (nothing ever writes a snapshot's memory file),
// its disk reflinked, its config and state copied. A re-run finds a
// complete checkpoint of its op in the store and only makes it durable
// again; anything less is started over (the start-up sweep removes temp
// dirs), so a crash at any step leaves the checkpoint done or absent.
func (d *Driver) Checkpoint(ctx context.Context, in fsm.CaptureCheckpoint) (executors.Result, error) {
	rel := layout.CheckpointRel(in.Checkpoint)
	final := filepath.Join(d.roots.Store, rel)
	meta := Meta{Kind: fsm.KindCheckpoint, Op: in.OpID.String(), VM: in.VM, Key: in.Key}
	if in.Source != "" {
		src, err := d.roots.SnapshotIn(layout.HibernateStore, in.Source)
		if err != nil {
			return executors.Result{}, err
		}
		r := d.begin(ctx, string(fsm.KindCheckpoint), in.OpID, src)
		if res, done, err := d.checkpointStored(r, rel); done || err != nil {
			return res, err
		}
		return d.exportSnapshot(r, src, rel, meta)
	}
	runDir, err := d.roots.VMRunDir(d.instance, in.VM, in.RunDir)
	if err != nil {
		return executors.Result{}, err
	}
	r := d.begin(ctx, string(fsm.KindCheckpoint), in.OpID, runDir)
	if res, done, err := d.checkpointStored(r, rel); done || err != nil {
		return res, err
	}
	proc, api, _, gone, err := d.liveVM(r, "checkpoint", in.VM, runDir)
	if err != nil {
		return executors.Result{}, err
	}
	paused := d.now()
	if err := r.step(StepPause, func() error { return api.Pause(r.ctx) }); err != nil {
		return executors.Result{}, d.resumeAfter(r, api, proc, "", gone(err))
	}
	tmp, mode, err := d.captureInto(r, api, runDir, string(fsm.KindCheckpoint))
	if err != nil {
		return executors.Result{}, d.resumeAfter(r, api, proc, tmp, gone(err))
	}
	// The snapshot's files are complete and the disk cloned: what the VM
	// does from here on is not in them.
	if err := r.step(StepResume, func() error { return api.Resume(r.ctx) }); err != nil {
		return executors.Result{}, d.resumeAfter(r, api, proc, tmp, gone(err))
	}
	r.rep.Steps = append(r.rep.Steps, event.Step{Name: StepPauseWindow, NS: int64(d.now().Sub(paused))})
	dropTemp := func(err error) error {
		r.undo("undo_"+StepMkTemp, func(context.Context) error { return d.fs.RemoveAll(tmp) })
		return err
	}
	if err := d.publish(r, tmp, final, meta, mode, dropTemp); err != nil {
		return executors.Result{}, err
	}
	res := r.result(rel)
	res.Report.CopyMode = mode
	return res, nil
}

// exportSnapshot assembles checkpoint rel from the hibernate snapshot src.
func (d *Driver) exportSnapshot(r *run, src, rel string, m Meta) (executors.Result, error) {
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
		tmp, err = d.fs.MkTempDir(d.roots.Store, string(fsm.KindCheckpoint))
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
	if err := d.publish(r, tmp, filepath.Join(d.roots.Store, rel), m, mode, dropTemp); err != nil {
		return executors.Result{}, err
	}
	res := r.result(rel)
	res.Report.CopyMode = mode
	return res, nil
}

// checkpointStored finishes a re-run that finds its op's checkpoint complete
// in the store (a crash after the rename): it is made durable again. A dir
// under the name with another op's meta is not this op's to touch.
func (d *Driver) checkpointStored(r *run, rel string) (res executors.Result, done bool, err error) {
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
		return res, true, executors.Unrecoverablef("checkpoint %s holds another op's snapshot (%s)", rel, m.Op)
	}
	if err := r.step(StepSyncTree, func() error { return d.fs.SyncTree(final) }); err != nil {
		return res, true, err
	}
	res = r.result(rel)
	res.Report.CopyMode = m.CopyMode
	return res, true, nil
}

// RemoveCheckpoint implements executors.Checkpointer: the checkpoint's dir
// goes (nothing clones from it any more; clones hard-linked its memory).
func (d *Driver) RemoveCheckpoint(ctx context.Context, in fsm.RemoveCheckpoint) (executors.Result, error) {
	dir, err := d.roots.SnapshotIn(layout.CheckpointStore, in.SnapshotDir)
	if err != nil {
		return executors.Result{}, err
	}
	r := d.begin(ctx, string(fsm.KindCheckpointDelete), in.OpID, dir)
	if err := r.step(StepRemoveSnapshot, func() error { return d.fs.RemoveAll(dir) }); err != nil {
		return executors.Result{}, err
	}
	return r.result(""), nil
}

var _ executors.Checkpointer = (*Driver)(nil)
