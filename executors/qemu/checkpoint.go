package qemu

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/sbxlog/sbxlog/eventlog/event"
	"github.com/sbxlog/sbxlog/executors"
	"github.com/sbxlog/sbxlog/executors/layout"
	"github.com/sbxlog/sbxlog/executors/qemu/qmp"
	"github.com/sbxlog/sbxlog/fsm"
)

// Checkpoints: a running VM's state captured into the store, the VM left
// running; or a hibernated VM's snapshot exported as a checkpoint.

// sourceCheckpoint is Meta.Source of a checkpoint taken of a running VM.
const sourceCheckpoint = "checkpoint"

// StepPauseWindow is not a step but a measure in a checkpoint's report: the
// time the vCPUs were stopped, from QMP stop to the end of cont.
const StepPauseWindow = "pause_window"

// Checkpoint saves the running VM of spec as snapshot name and lets it run
// on: the hibernate's order (stop, state into a temp dir in the store, clone
// RAM and disk), then cont as soon as the clones are taken, then meta.json,
// SyncTree and rename while the VM runs. It reports the pause window. A
// failure removes the temp dir and resumes the VM; a snapshot already under
// name (a re-run past the rename) is made durable again (Already).
func (q *Recipes) Checkpoint(ctx context.Context, spec Spec, name string) (RecipeResult, error) {
	var r RecipeResult
	if err := validateName(name); err != nil {
		return r, err
	}
	if err := spec.validateDirs(); err != nil {
		return r, err
	}
	if _, err := ReadMeta(spec.SnapshotDir(name)); err == nil {
		r.Already = true
		return r, q.fs.SyncTree(spec.SnapshotDir(name))
	}
	if _, err := q.adopt(spec.RunDir); err != nil {
		return r, err
	}
	c, err := qmp.Dial(ctx, QMPSocket(spec.RunDir))
	if err != nil {
		return r, fmt.Errorf("qemu: checkpoint: %w", err)
	}
	defer c.Close()
	m, err := launchedMeta(spec.RunDir)
	if err != nil {
		return r, err
	}
	m.StateBytes, m.Created = 0, time.Time{}
	m.Source = sourceCheckpoint
	m.QEMUVersion = c.Version().String()
	stopped := q.now()
	resumed := false
	err = q.snapshot(ctx, c, spec, name, m, &r, func(t *timer) error {
		if err := c.Execute(ctx, "cont", nil, nil); err != nil {
			return fmt.Errorf("qemu: checkpoint: cont: %w", err)
		}
		resumed = true
		t.mark(StepCont)
		r.Steps = append(r.Steps, Step{Name: StepPauseWindow, Dur: q.now().Sub(stopped)})
		return nil
	})
	if err != nil && !resumed {
		// Whatever state a crash or this failure left it in (stopped,
		// postmigrate), a checkpointed VM runs on.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), q.stopGrace)
		defer cancel()
		if cerr := c.Execute(rctx, "cont", nil, nil); cerr != nil {
			err = errors.Join(err, fmt.Errorf("qemu: resuming after a failed checkpoint: %w", cerr))
		}
	}
	return r, err
}

// Export copies snapshot src (a hibernated VM's) into the store as snapshot
// name, by way of a temp dir: every file cloned (reflinked where the store
// can), SyncTree, rename. No QEMU runs; src is not modified. A snapshot
// already under name is made durable again (Already).
func (q *Recipes) Export(spec Spec, src, name string) (RecipeResult, error) {
	var r RecipeResult
	if err := validateName(name); err != nil {
		return r, err
	}
	if _, err := ReadMeta(spec.SnapshotDir(name)); err == nil {
		r.Already = true
		return r, q.fs.SyncTree(spec.SnapshotDir(name))
	}
	if _, err := checkSnapshot(src); err != nil {
		return r, err
	}
	t := q.timer(&r)
	tmp, err := q.fs.MkTempDir(spec.StoreDir, name)
	if err != nil {
		return r, err
	}
	fail := func(err error) (RecipeResult, error) {
		if rerr := q.fs.RemoveAll(tmp); rerr != nil {
			q.log.Error().Err(rerr).Str("dir", tmp).Msg("qemu: removing a failed export's temp dir")
		}
		return r, err
	}
	for _, f := range []string{FileState, FileRAM, FileDisk, FileMeta} {
		if _, err := os.Stat(filepath.Join(src, f)); errors.Is(err, os.ErrNotExist) && f == FileDisk {
			continue
		}
		res, err := q.fs.Clone(filepath.Join(tmp, f), filepath.Join(src, f))
		if err != nil {
			return fail(err)
		}
		r.addClone(res)
	}
	t.mark(StepClone)
	if err := q.fs.SyncTree(tmp); err != nil {
		return fail(err)
	}
	t.mark(StepSync)
	if err := q.fs.RenameDir(tmp, spec.SnapshotDir(name)); err != nil {
		return fail(err)
	}
	t.mark(StepRename)
	return r, nil
}

// Checkpoint implements executors.Checkpointer: Recipes.Checkpoint of the
// running VM into checkpoint/<id>, or Recipes.Export of its hibernate
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
		r, err = d.q.Export(Spec{RunDir: src, StoreDir: filepath.Dir(final)}, src, filepath.Base(final))
		if errors.Is(err, ErrNoSnapshot) {
			err = executors.AsUnrecoverable(err)
		}
	} else {
		runDir, rerr := d.roots.VMRunDir(d.instance, in.VM, in.RunDir)
		if rerr != nil {
			return executors.Result{}, rerr
		}
		r, err = d.q.Checkpoint(ctx, Spec{RunDir: runDir, StoreDir: filepath.Dir(final)}, filepath.Base(final))
		if errors.Is(err, ErrNotRunning) {
			err = &executors.Unrecoverable{Err: err, Lost: true}
		}
	}
	if err != nil {
		return executors.Result{}, fmt.Errorf("checkpoint %s: %w", in.VM, classify(err))
	}
	return executors.Result{Report: d.report(r), SnapshotDir: rel}, nil
}

// RemoveCheckpoint implements executors.Checkpointer: the checkpoint's dir
// goes (clones of it hold their own copies of RAM and disk).
func (d *Driver) RemoveCheckpoint(_ context.Context, in fsm.RemoveCheckpoint) (executors.Result, error) {
	dir, err := d.roots.SnapshotIn(layout.CheckpointStore, in.SnapshotDir)
	if err != nil {
		return executors.Result{}, err
	}
	t0 := d.q.now()
	if err := d.fs.RemoveAll(dir); err != nil {
		return executors.Result{}, err
	}
	return executors.Result{Report: event.ExecReport{Steps: []event.Step{{Name: StepRemoveSnapshot, NS: int64(d.q.now().Sub(t0))}}}}, nil
}

var _ executors.Checkpointer = (*Driver)(nil)
