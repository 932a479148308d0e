package chdriver

import (
	"context"
	"fmt"
	"path/filepath"

	"github.com/sbxlog/sbxlog/executors"
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
	var res executors.Result
	if in.SnapshotDir != "" {
		src, serr := d.roots.SnapshotIn(layout.HibernateStore, in.SnapshotDir)
		if serr != nil {
			return executors.Result{}, serr
		}
		if res, err = d.copyImage(r, src, rel, m); err != nil {
			return executors.Result{}, fmt.Errorf("promote %s: %w", in.VM, err)
		}
	} else if res, err = d.snapshotLive(r, "promote", in.VM, runDir, rel, m); err != nil {
		return executors.Result{}, err // liveVM and the steps name the promote
	}
	if err := r.step(StepDigest, func() error {
		var err error
		res.Digest, err = fsx.ContentDigest(final, MetaFile)
		return err
	}); err != nil {
		return executors.Result{}, err
	}
	return res, nil
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
