package chdriver

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"github.com/sbxlog/sbxlog/eventlog/event"
	"github.com/sbxlog/sbxlog/executors"
	"github.com/sbxlog/sbxlog/executors/ch"
	"github.com/sbxlog/sbxlog/executors/layout"
	"github.com/sbxlog/sbxlog/executors/vmm"
	"github.com/sbxlog/sbxlog/fsm"
)

// Hibernate implements executors.Driver; the order of its steps is the
// package doc's durability order.
func (d *Driver) Hibernate(ctx context.Context, in fsm.HibernateVM) (executors.Result, error) {
	runDir, err := d.roots.InstanceRunDir(d.instance, in.RunDir)
	if err != nil {
		return executors.Result{}, err
	}
	egress, err := d.checkEgress(in.Key)
	if err != nil {
		return executors.Result{}, err
	}
	r := d.begin(ctx, string(fsm.KindHibernate), in.OpID, runDir)
	rel := layout.HibernateRel(in.VM, in.OpID)
	final := filepath.Join(d.roots.Store, rel)

	if res, done, err := d.finishStored(r, rel, in.VM, runDir, egress); done || err != nil {
		return res, err
	}

	proc, api, info, gone, err := d.liveVM(r, "hibernate", in.VM, runDir)
	if err != nil {
		return executors.Result{}, err
	}
	if err := r.step(StepBalloon, func() error { return d.settleBalloon(r.ctx, api, info, r.log) }); err != nil {
		return executors.Result{}, gone(err)
	}
	copyMode, err := d.pauseSnapshot(r, api, proc, gone, runDir, final, Meta{Kind: fsm.KindHibernate, Op: in.OpID.String(), VM: in.VM, Key: in.Key}, false)
	if err != nil {
		return executors.Result{}, d.afterSnapshot(r, api, proc, in.VM, rel, err)
	}
	if err := d.stopVM(r, in.VM, runDir, egress); err != nil {
		return executors.Result{}, d.afterSnapshot(r, api, proc, in.VM, rel, err)
	}
	res := r.result(rel)
	res.Report.CopyMode = copyMode
	res.AfterCommit = d.rewriteDisk(final)
	return res, nil
}

// liveVM attaches to the VMM of vm in runDir for a recipe that snapshots
// it (verb, for errors) and reads its vm.info, which must say running or
// paused. gone classifies a later error: a VMM that died makes the VM lost,
// as its memory existed nowhere else.
func (d *Driver) liveVM(r *run, verb, vm, runDir string) (proc *vmm.Process, api API, info *ch.VmInfo, gone func(error) error, err error) {
	proc, err = d.attach(r.ctx, runDir, vm)
	if proc == nil {
		if err != nil {
			return nil, nil, nil, nil, fmt.Errorf("%s %s: %w", verb, vm, err)
		}
		return nil, nil, nil, nil, executors.Lostf("%s %s: no VMM runs in %s and no snapshot was taken", verb, vm, runDir)
	}
	api = d.api(runDir)
	gone = func(err error) error {
		if vmmDied(proc, err) {
			return &executors.Unrecoverable{Err: err, Lost: true}
		}
		return err
	}
	if info, err = r.info(api); err != nil {
		return nil, nil, nil, nil, gone(err)
	}
	if info.State != ch.StateRunning && info.State != ch.StatePaused {
		return nil, nil, nil, nil, executors.Lostf("%s %s: VM is %s", verb, vm, info.State)
	}
	return proc, api, info, gone, nil
}

// afterSnapshot is the rollback of a hibernate that failed once its
// snapshot stood in the store (its SyncTree, or stopping the VM). Which
// way it goes depends on where the VM's memory is:
//   - the VM is still paused in a live VMM (the stop did not reach it): the
//     snapshot is a copy nothing needs. A failed hibernate leaves the VM
//     claimed and never references its snapshot (fsm HibernateFailed), and
//     a re-run that found it would stop a VM resumed since; so the snapshot
//     is removed and the VM resumed, as before the rename.
//   - the VMM is gone or the VM shut down: the snapshot is the only copy of
//     its memory. It stays, and the re-run (finishStored) completes the
//     hibernate from it.
//
// A VM whose state cannot be read (its VMM not answering) counts as the
// second case: nothing that may be the only copy is removed on a guess.
// The snapshot goes before the resume, never after: one left behind a VM
// that ran on would make the re-run stop the VM for a stale image. The
// price is that a VMM dying during the resume takes the VM with it (Lost),
// as it would have without the snapshot.
// A failure before the rename (no snapshot of this op) is returned as is:
// snapshotInto rolled it back.
func (d *Driver) afterSnapshot(r *run, api API, proc *vmm.Process, vm, rel string, cause error) error {
	final := filepath.Join(d.roots.Store, rel)
	if m, err := ReadMeta(final); err != nil || m.Op != r.op.String() {
		return cause
	}
	intact := false
	if proc.Alive() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(r.ctx), 5*time.Second)
		info, err := api.Info(ctx)
		cancel()
		intact = err == nil && info.State == ch.StatePaused
	}
	if !intact {
		r.log.Warn().Err(cause).Str("snapshot", rel).Msg("hibernate failed after its snapshot stood; the VM is stopped, so the snapshot stays for the re-run")
		return cause
	}
	if r.undo("undo_"+StepRename, func(context.Context) error { return d.fs.RemoveAll(final) }) != nil {
		// The snapshot could not be removed: leave the VM paused, so the
		// re-run (finishStored) stops the VM it describes.
		return cause
	}
	return d.resumeAfter(r, api, proc, vm, "", cause)
}

// afterStored is afterSnapshot for a re-run that found its snapshot in the
// store (a crash between the rename and the stop leaves the VM paused).
func (d *Driver) afterStored(r *run, rel, vm, runDir string, cause error) error {
	proc, _ := d.attach(context.WithoutCancel(r.ctx), runDir, vm)
	if proc == nil {
		return cause // no VMM: the snapshot is the VM's only memory
	}
	return d.afterSnapshot(r, d.api(runDir), proc, vm, rel, cause)
}

// resumeAfter is the rollback of a failed snapshot of a live VM (hibernate,
// checkpoint, promote, golden) while the VM is paused: remove the temp dir,
// resume the VM. A dead VMM makes the error Lost.
//
// The VM vm runs on, so it gets its doors here: a re-run after a restart
// found it left in flight by the start-up reconcile, which opens only
// adopted VMs' doors, and a hibernate's stop closed them before failing
// (Open keeps doors already open). vm is "" for a golden build's VM, which
// has none.
func (d *Driver) resumeAfter(r *run, api API, proc *vmm.Process, vm, tmp string, cause error) error {
	if tmp != "" {
		r.undo("undo_"+StepMkTemp, func(context.Context) error { return d.fs.RemoveAll(tmp) })
	}
	if executors.IsLost(cause) || !proc.Alive() {
		if executors.IsLost(cause) {
			return cause
		}
		return &executors.Unrecoverable{Err: fmt.Errorf("VMM exited: %w", cause), Lost: true}
	}
	var rerr error
	resumed := r.undo("undo_"+StepPause, func(ctx context.Context) error {
		rerr = api.Resume(ctx)
		return rerr
	}) == nil
	if rerr != nil && vmmDied(proc, rerr) {
		return &executors.Unrecoverable{Err: fmt.Errorf("%w (and the VMM is gone: %v)", cause, rerr), Lost: true}
	}
	if resumed && vm != "" {
		d.openDoors(r, vm, r.runDir)
	}
	return cause
}

// pauseSnapshot is the step sequence of every snapshot of a live VM
// (hibernate, checkpoint, promote): vm.pause, then snapshotInto. gone
// classifies a failed pause (liveVM's).
func (d *Driver) pauseSnapshot(r *run, api API, proc *vmm.Process, gone func(error) error, runDir, final string, m Meta, runOn bool) (string, error) {
	paused := d.now()
	if err := r.step(StepPause, func() error { return api.Pause(r.ctx) }); err != nil {
		return "", d.resumeAfter(r, api, proc, m.VM, "", gone(err))
	}
	return d.snapshotInto(r, api, proc, runDir, final, m, runOn, paused)
}

// snapshotInto snapshots the paused VM into final by way of a temp dir in
// the store: vm.snapshot, FICLONE cow.raw (captureInto), then SyncTree,
// meta.json, rename, SyncTree (publish). Before the rename a failure rolls
// back (temp dir removed, VM resumed); after it the snapshot stands. It
// returns the copy mode.
//
// runOn is for a VM that runs on (checkpoint, promote): it is resumed as
// soon as its memory and disk are in the temp dir, so the pause window
// (reported as StepPauseWindow, from paused to the end of vm.resume) holds
// only what needs the VM still, and the files are made durable while it
// runs. A failure after the resume rolls back to nothing: the temp dir, or
// past the rename the snapshot, is removed (the failure is reported, so
// nothing will reference it).
func (d *Driver) snapshotInto(r *run, api API, proc *vmm.Process, runDir, final string, m Meta, runOn bool, paused time.Time) (string, error) {
	var tmp string
	fail := func(err error) error {
		if vmmDied(proc, err) {
			err = &executors.Unrecoverable{Err: err, Lost: true}
		}
		return d.resumeAfter(r, api, proc, m.VM, tmp, err)
	}
	tmp, mode, err := d.captureInto(r, api, runDir, string(m.Kind))
	if err != nil {
		return "", fail(err)
	}
	if runOn {
		// The snapshot's files are complete and the disk cloned: what the VM
		// does from here on is not in them.
		if err := r.step(StepResume, func() error { return api.Resume(r.ctx) }); err != nil {
			return "", fail(err)
		}
		r.rep.Steps = append(r.rep.Steps, event.Step{Name: StepPauseWindow, NS: int64(d.now().Sub(paused))})
		// It runs again, so it has its doors, whatever befalls the
		// snapshot: a re-run after a restart found the VM left in flight
		// by the start-up reconcile, which opens only adopted VMs' doors
		// (Open keeps doors already open).
		d.openDoors(r, m.VM, runDir)
		fail = func(err error) error {
			r.undo("undo_"+StepMkTemp, func(context.Context) error { return d.fs.RemoveAll(tmp) })
			return err
		}
	}
	if err := d.publish(r, tmp, final, m, mode, fail); err != nil {
		if got, merr := ReadMeta(final); runOn && merr == nil && got.Op == r.op.String() {
			r.undo("undo_"+StepRename, func(context.Context) error { return d.fs.RemoveAll(final) })
		}
		return "", err
	}
	return mode, nil
}

// captureInto is the part of a snapshot that needs the VM paused: a temp dir
// in the store, vm.snapshot into it, FICLONE of cow.raw. It returns the temp
// dir (set once made, even on error, for the caller's rollback) and the
// copy mode.
func (d *Driver) captureInto(r *run, api API, runDir, kind string) (tmp, mode string, err error) {
	if err := r.step(StepMkTemp, func() error {
		var err error
		tmp, err = d.fs.MkTempDir(d.roots.Store, kind)
		return err
	}); err != nil {
		return tmp, "", err
	}
	if err := r.step(StepSnapshot, func() error {
		url, err := ch.FileURL(tmp)
		if err != nil {
			return err
		}
		return api.Snapshot(r.ctx, url)
	}); err != nil {
		return tmp, "", err
	}
	err = r.step(StepCloneDisk, func() error {
		res, err := d.fs.Clone(filepath.Join(tmp, DiskFile), filepath.Join(runDir, DiskFile))
		r.noteClone(res.Method)
		mode = res.Method.String()
		return err
	})
	return tmp, mode, err
}

// publish makes the snapshot assembled in tmp durable under final: SyncTree,
// meta.json, rename, SyncTree. Before the rename a failure is handed to fail
// (the caller's rollback, which removes tmp); after it the snapshot stands
// and the error is returned as is.
func (d *Driver) publish(r *run, tmp, final string, m Meta, mode string, fail func(error) error) error {
	if err := r.step(StepSyncFiles, func() error { return d.fs.SyncTree(tmp) }); err != nil {
		return fail(err)
	}
	if err := r.step(StepWriteMeta, func() error {
		m.CreatedNS = d.now().UnixNano()
		m.Instance = d.instance
		m.CopyMode = mode
		m.Hypervisor = d.hv
		data, err := buildMeta(tmp, m)
		if err != nil {
			return err
		}
		return d.fs.WriteFileAtomic(filepath.Join(tmp, MetaFile), data, 0o600)
	}); err != nil {
		return fail(err)
	}
	if err := r.step(StepRename, func() error { return d.fs.RenameDir(tmp, final) }); err != nil {
		// RenameDir may have renamed and then failed to fsync a parent; a
		// snapshot the caller will report as failed must not stay behind.
		r.undo("undo_"+StepRename, func(context.Context) error { return d.fs.RemoveAll(final) })
		return fail(err)
	}
	return r.step(StepSyncTree, func() error { return d.fs.SyncTree(final) })
}

// vmmDied reports whether err came from a VMM that has exited. A connection
// cut mid-call is ambiguous until the process is seen to exit, which follows
// within moments when the VMM died; a live VMM is given a second.
func vmmDied(p *vmm.Process, err error) bool {
	if !p.Alive() || ch.IsVMMGone(err) {
		return true
	}
	var te *ch.TransportError
	if !errors.As(err, &te) {
		return false
	}
	t := time.NewTimer(time.Second)
	defer t.Stop()
	select {
	case <-p.Exited():
		return true
	case <-t.C:
		return false
	}
}

// finishStored handles a re-run that finds the op's snapshot complete in the
// store (a crash after the rename): it is made durable again and the VM is
// stopped. done is false when no complete snapshot of this op is there.
func (d *Driver) finishStored(r *run, rel, vm, runDir string, egress bool) (res executors.Result, done bool, err error) {
	final := filepath.Join(d.roots.Store, rel)
	var m *Meta
	if err := r.step(StepCheck, func() error {
		if got, err := ReadMeta(final); err == nil && got.Op == r.op.String() {
			m = got
		}
		return nil
	}); err != nil || m == nil {
		return res, false, err
	}
	r.log.Info().Str("snapshot", final).Msg("snapshot already in the store; finishing the recipe")
	if err := r.step(StepSyncTree, func() error { return d.fs.SyncTree(final) }); err != nil {
		return res, true, d.afterStored(r, rel, vm, runDir, err)
	}
	if err := d.stopVM(r, vm, runDir, egress); err != nil {
		return res, true, d.afterStored(r, rel, vm, runDir, err)
	}
	res = r.result(rel)
	res.Report.CopyMode = m.CopyMode
	res.AfterCommit = d.rewriteDisk(final)
	return res, true, nil
}
