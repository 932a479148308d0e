package chdriver

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/sbxlog/sbxlog/executors"
	"github.com/sbxlog/sbxlog/executors/ch"
	"github.com/sbxlog/sbxlog/executors/fsx"
	"github.com/sbxlog/sbxlog/executors/layout"
	"github.com/sbxlog/sbxlog/fsm"
)

// Promote implements executors.Driver: the sandbox's snapshot becomes the
// golden of in.Target, under layout.GoldenRel(in.Target, op) (a promoted
// template is a golden like any other: clones of its key restore from it).
// A running VM is snapshotted in a pause window and runs on (snapshotLive);
// a hibernated one is copied from its image (copyImage) without waking.
// Result.Digest is the template's content digest.
func (d *Driver) Promote(ctx context.Context, in fsm.PromoteVM) (executors.Result, error) {
	runDir, err := d.roots.InstanceRunDir(d.instance, in.RunDir)
	if err != nil {
		return executors.Result{}, err
	}
	rel := layout.GoldenRel(in.Target, in.OpID)
	final := filepath.Join(d.roots.Store, rel)
	r := d.begin(ctx, string(fsm.KindPromote), in.OpID, runDir)
	m := Meta{Kind: fsm.KindPromote, Op: in.OpID.String(), VM: in.VM, Key: in.Target}
	var mode string
	if in.SnapshotDir != "" {
		src, err := d.roots.SnapshotIn(layout.HibernateStore, in.SnapshotDir)
		if err != nil {
			return executors.Result{}, err
		}
		mode, err = d.copyImage(r, src, final, m)
		if err != nil {
			return executors.Result{}, fmt.Errorf("promote %s: %w", in.VM, err)
		}
	} else if mode, err = d.snapshotLive(r, in.VM, runDir, final, m); err != nil {
		return executors.Result{}, fmt.Errorf("promote %s: %w", in.VM, err)
	}
	res := r.result(rel)
	res.Report.CopyMode = mode
	if err := r.step(StepDigest, func() error {
		var err error
		res.Digest, err = fsx.ContentDigest(final, MetaFile)
		return err
	}); err != nil {
		return executors.Result{}, err
	}
	return res, nil
}

// snapshotLive is the step sequence of every snapshot of a running VM that
// runs on (promote; checkpoint): pause → snapshot into a temp dir in the
// store → FICLONE the disk → SyncTree → metadata → rename → SyncTree →
// resume, the pause window being the snapshot, the disk clone and the
// fsyncs. Idempotent under the run's op: a re-run that finds the snapshot
// complete under final (a crash after the rename) only makes it durable
// again and resumes the VM. Before the rename a failure removes the temp
// dir and resumes the VM (snapshotInto); after it the snapshot is removed
// and the VM resumed, so a failed call leaves nothing in the store. A VMM
// that died makes the error Lost.
func (d *Driver) snapshotLive(r *run, vm, runDir, final string, m Meta) (string, error) {
	proc, err := d.attach(r.ctx, runDir, vm)
	if proc == nil {
		if err == nil {
			err = executors.Lostf("no VMM runs in %s", runDir)
		}
		return "", err
	}
	api := d.api(runDir)
	var done *Meta
	if err := r.step(StepCheck, func() error {
		if got, err := ReadMeta(final); err == nil && got.Op == r.op.String() {
			done = got
		}
		return nil
	}); err != nil {
		return "", err
	}
	mode := ""
	if done != nil {
		mode = done.CopyMode
		if err := r.step(StepSyncTree, func() error { return d.fs.SyncTree(final) }); err != nil {
			return "", d.undoLive(r, api, proc, final, err)
		}
	} else {
		info, err := r.info(api)
		if err != nil {
			return "", d.resumeAfter(r, api, proc, "", err)
		}
		if info.State != ch.StateRunning && info.State != ch.StatePaused {
			return "", executors.Lostf("VM %s is %s", vm, info.State)
		}
		if err := r.step(StepPause, func() error { return api.Pause(r.ctx) }); err != nil {
			return "", d.resumeAfter(r, api, proc, "", err)
		}
		if mode, err = d.snapshotInto(r, api, proc, runDir, final, m); err != nil {
			if _, serr := os.Stat(final); serr == nil {
				return "", d.undoLive(r, api, proc, final, err)
			}
			return "", err // snapshotInto resumed the VM
		}
	}
	if err := r.step(StepResume, func() error { return api.Resume(r.ctx) }); err != nil {
		return "", d.undoLive(r, api, proc, final, err)
	}
	return mode, nil
}

// undoLive rolls back a live snapshot that failed after its rename: the
// snapshot is a copy nothing references (the failure is reported), so it
// goes, and the VM is resumed.
func (d *Driver) undoLive(r *run, api API, proc interface{ Alive() bool }, final string, cause error) error {
	r.undo("undo_"+StepRename, func(context.Context) error { return d.fs.RemoveAll(final) })
	if !proc.Alive() {
		return &executors.Unrecoverable{Err: fmt.Errorf("VMM exited: %w", cause), Lost: true}
	}
	r.undo("undo_"+StepPause, func(ctx context.Context) error { return api.Resume(ctx) })
	return cause
}

// copyImage makes final a snapshot of its own from the stored image src
// (a hibernated VM's), without a VMM: hard links of the memory file (no
// snapshot file is ever written in place) and reflinks of the rest into a
// temp dir in the store, SyncTree, metadata, rename, SyncTree. A re-run
// that finds final complete under the run's op only syncs it again.
func (d *Driver) copyImage(r *run, src, final string, m Meta) (string, error) {
	if got, err := ReadMeta(final); err == nil && got.Op == r.op.String() {
		return got.CopyMode, r.step(StepSyncTree, func() error { return d.fs.SyncTree(final) })
	}
	if _, err := ReadMeta(src); err != nil {
		return "", executors.AsUnrecoverable(err)
	}
	var tmp string
	fail := func(err error) (string, error) {
		if tmp != "" {
			r.undo("undo_"+StepMkTemp, func(context.Context) error { return d.fs.RemoveAll(tmp) })
		}
		return "", err
	}
	if err := r.step(StepMkTemp, func() error {
		var err error
		tmp, err = d.fs.MkTempDir(d.roots.Store, string(m.Kind))
		return err
	}); err != nil {
		return fail(err)
	}
	mode := ""
	if err := r.step(StepCloneDisk, func() error {
		for _, name := range snapshotFiles {
			if name == MemoryFile {
				if err := d.fs.Link(filepath.Join(tmp, name), filepath.Join(src, name)); err != nil {
					return err
				}
				continue
			}
			res, err := d.fs.Clone(filepath.Join(tmp, name), filepath.Join(src, name))
			if name == DiskFile {
				r.noteClone(res.Method)
				mode = res.Method.String()
			}
			if err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		return fail(err)
	}
	if err := r.step(StepSyncFiles, func() error { return d.fs.SyncTree(tmp) }); err != nil {
		return fail(err)
	}
	if err := r.step(StepWriteMeta, func() error {
		m.CreatedNS, m.CopyMode, m.Hypervisor, m.Instance = d.now().UnixNano(), mode, d.hv, d.instance
		data, err := buildMeta(tmp, m)
		if err != nil {
			return err
		}
		return d.fs.WriteFileAtomic(filepath.Join(tmp, MetaFile), data, 0o600)
	}); err != nil {
		return fail(err)
	}
	if err := r.step(StepRename, func() error { return d.fs.RenameDir(tmp, final) }); err != nil {
		r.undo("undo_"+StepRename, func(context.Context) error { return d.fs.RemoveAll(final) })
		return fail(err)
	}
	if err := r.step(StepSyncTree, func() error { return d.fs.SyncTree(final) }); err != nil {
		r.undo("undo_"+StepRename, func(context.Context) error { return d.fs.RemoveAll(final) })
		return "", err
	}
	return mode, nil
}

// CollectSnapshot implements executors.Driver: layout's Collect (a
// retired snapshot nothing references or maps).
func (d *Driver) CollectSnapshot(ctx context.Context, in fsm.CollectSnapshot) (executors.Result, error) {
	r := d.begin(ctx, string(fsm.KindCollect), in.OpID, "")
	if err := r.step(StepDiscard, func() error { return d.roots.Collect(d.fs, in.Dir, in.OpID.String()) }); err != nil {
		return executors.Result{}, err
	}
	d.log.Info().Str("snapshot", in.Dir).Str("owner", in.Owner).Msg("collected a snapshot nothing references")
	return r.result(""), nil
}

// SweepStore implements reconcile.StoreSweeper (layout's SweepStore).
func (d *Driver) SweepStore(ctx context.Context, keep func(rel, op string) bool) (layout.StoreSweep, error) {
	return d.roots.SweepStore(ctx, d.fs, d.instance, keep)
}
