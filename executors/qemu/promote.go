package qemu

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/sbxlog/sbxlog/executors"
	"github.com/sbxlog/sbxlog/executors/fsx"
	"github.com/sbxlog/sbxlog/executors/layout"
	"github.com/sbxlog/sbxlog/fsm"
)

// Promote implements executors.Driver: the sandbox's snapshot becomes the
// golden of in.Target under layout.GoldenRel(in.Target, op). A running VM
// is snapshotted and runs on (Recipes.SnapshotLive); a hibernated one is
// copied from its image (Recipes.CopySnapshot) without waking.
func (d *Driver) Promote(ctx context.Context, in fsm.PromoteVM) (executors.Result, error) {
	runDir, err := d.roots.InstanceRunDir(d.instance, in.RunDir)
	if err != nil {
		return executors.Result{}, err
	}
	rel := layout.GoldenRel(in.Target, in.OpID)
	final := filepath.Join(d.roots.Store, rel)
	var r RecipeResult
	if in.SnapshotDir != "" {
		src, err := d.roots.SnapshotIn(layout.HibernateStore, in.SnapshotDir)
		if err != nil {
			return executors.Result{}, err
		}
		r, err = d.q.CopySnapshot(ctx, src, filepath.Dir(final), filepath.Base(final), sourcePromote)
		if errors.Is(err, ErrNoSnapshot) {
			return executors.Result{}, executors.AsUnrecoverable(fmt.Errorf("promote %s: %w", in.VM, err))
		}
		if err != nil {
			return executors.Result{}, fmt.Errorf("promote %s: %w", in.VM, classify(err))
		}
	} else {
		spec := Spec{RunDir: runDir, StoreDir: filepath.Dir(final)}
		r, err = d.q.SnapshotLive(ctx, spec, filepath.Base(final), sourcePromote)
		if err != nil {
			if errors.Is(err, ErrNotRunning) {
				return executors.Result{}, &executors.Unrecoverable{Err: fmt.Errorf("promote %s: %w", in.VM, err), Lost: true}
			}
			return executors.Result{}, fmt.Errorf("promote %s: %w", in.VM, classify(err))
		}
		if err := d.ranOn(in.VM, runDir, r, final); err != nil {
			return executors.Result{}, fmt.Errorf("promote %s: %w", in.VM, err)
		}
	}
	res := executors.Result{Report: d.report(r), SnapshotDir: rel}
	if res.Digest, err = fsx.ContentDigest(final, FileMeta); err != nil {
		return executors.Result{}, err
	}
	return res, nil
}

// CollectSnapshot implements executors.Driver: layout's Collect (a
// retired snapshot nothing references or maps).
func (d *Driver) CollectSnapshot(_ context.Context, in fsm.CollectSnapshot) (executors.Result, error) {
	if err := d.roots.Collect(d.fs, in.Dir, in.OpID.String()); err != nil {
		return executors.Result{}, err
	}
	d.log.Info().Str("snapshot", in.Dir).Str("owner", in.Owner).Msg("collected a snapshot nothing references")
	return executors.Result{}, nil
}

// SweepStore implements reconcile.StoreSweeper (layout's SweepStore).
func (d *Driver) SweepStore(ctx context.Context, keep func(rel, op string) bool) (layout.StoreSweep, error) {
	return d.roots.SweepStore(ctx, d.fs, d.instance, keep)
}

// SnapshotLive is the step sequence of every snapshot of a running VM that
// runs on (checkpoint, promote): the hibernate's order (stop, device state
// into a temp dir in the store, clone RAM and disk), then cont as soon as
// the clones are taken, then meta.json, SyncTree and rename while the VM
// runs. It reports the pause window. A failure removes the temp dir and
// resumes the VM; a snapshot already under name (a re-run past the rename,
// so past the cont) is made durable again (Already).
func (q *Recipes) SnapshotLive(ctx context.Context, spec Spec, name, source string) (RecipeResult, error) {
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
	pid, c, err := q.dialVM(ctx, spec, "snapshot")
	r.PID = pid
	if err != nil {
		return r, err
	}
	defer c.Close()
	stopped := q.now()
	resumed := false
	err = q.snapshot(ctx, c, spec, name, source, &r, func(t *timer) error {
		if err := c.Execute(ctx, "cont", nil, nil); err != nil {
			return fmt.Errorf("qemu: snapshot: cont: %w", err)
		}
		resumed = true
		t.mark(StepCont)
		r.Steps = append(r.Steps, Step{Name: StepPauseWindow, Dur: q.now().Sub(stopped)})
		return nil
	})
	if err != nil && !resumed {
		// Whatever state a crash or this failure left it in (stopped,
		// postmigrate), a VM snapshotted live runs on.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), q.stopGrace)
		defer cancel()
		if cerr := c.Execute(rctx, "cont", nil, nil); cerr != nil {
			err = errors.Join(err, fmt.Errorf("qemu: resuming after a failed snapshot: %w", cerr))
		}
	}
	return r, err
}

// CopySnapshot makes snapshot name in storeDir a copy of the snapshot in
// src (a hibernated VM's image) without a VMM: every file cloned into a
// temp dir in the store (reflinks where the filesystem has them), a new
// meta.json (source, instance, time), SyncTree, rename. src is not
// modified. A snapshot already under name is made durable again (Already).
func (q *Recipes) CopySnapshot(_ context.Context, src, storeDir, name, source string) (RecipeResult, error) {
	var r RecipeResult
	if err := validateName(name); err != nil {
		return r, err
	}
	final := filepath.Join(storeDir, name)
	if _, err := ReadMeta(final); err == nil {
		r.Already = true
		return r, q.fs.SyncTree(final)
	}
	m, err := checkSnapshot(src)
	if err != nil {
		return r, err
	}
	t := q.recipeTimer(&r, source)
	tmp, err := q.fs.MkTempDir(storeDir, name)
	if err != nil {
		return r, err
	}
	fail := func(err error) (RecipeResult, error) {
		if rerr := q.fs.RemoveAll(tmp); rerr != nil {
			err = errors.Join(err, rerr)
		}
		return r, err
	}
	ents, err := os.ReadDir(src)
	if err != nil {
		return fail(err)
	}
	for _, e := range ents {
		if !e.Type().IsRegular() || e.Name() == FileMeta {
			continue
		}
		res, err := q.fs.Clone(filepath.Join(tmp, e.Name()), filepath.Join(src, e.Name()))
		if err != nil {
			return fail(err)
		}
		r.addClone(res)
	}
	t.mark(StepClone)
	m.Source, m.Instance, m.Created = source, q.instance, q.now().UTC()
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return fail(err)
	}
	if err := q.fs.WriteFileAtomic(filepath.Join(tmp, FileMeta), append(b, '\n'), 0o600); err != nil {
		return fail(err)
	}
	t.mark(StepMeta)
	if err := q.fs.SyncTree(tmp); err != nil {
		return fail(err)
	}
	t.mark(StepSync)
	if err := q.fs.RenameDir(tmp, final); err != nil {
		return fail(err)
	}
	t.mark(StepRename)
	return r, nil
}
