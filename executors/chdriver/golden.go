package chdriver

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"github.com/sbxlog/sbxlog/executors"
	"github.com/sbxlog/sbxlog/executors/fsx"
	"github.com/sbxlog/sbxlog/executors/layout"
	"github.com/sbxlog/sbxlog/fsm"
)

// BuildGolden implements executors.Driver: cold boot of the template (no
// NICs: clones get their own), readiness, optional warmup, balloon settle,
// pause, snapshot into the store, stop.
func (d *Driver) BuildGolden(ctx context.Context, in fsm.BuildGolden) (executors.Result, error) {
	runDir := d.roots.GoldenRunDir(d.instance, in.OpID)
	id := filepath.Base(runDir)
	r := d.begin(ctx, string(fsm.KindGolden), in.OpID, runDir)
	rel := layout.GoldenRel(in.Key, in.OpID)
	final := filepath.Join(d.roots.Store, rel)
	if res, done, err := d.finishStored(r, rel, id, runDir, false); done || err != nil {
		return res, err
	}

	t, cfg, err := d.templateConfig(r, in.Key, runDir, true)
	if err != nil {
		return executors.Result{}, err
	}
	if err := d.resetRun(r, id, runDir, runDir); err != nil {
		return executors.Result{}, err
	}
	fail := func(err error) (executors.Result, error) {
		d.teardown(r, id, runDir, false)
		return executors.Result{}, fmt.Errorf("golden %s: %w", in.Key, err)
	}
	if err := r.step(StepCloneTemplate, func() error {
		cr, err := d.fs.Clone(filepath.Join(runDir, DiskFile), t.Disk, fsx.Overwrite())
		r.noteClone(cr.Method)
		return err
	}); err != nil {
		return fail(err)
	}
	if err := d.boot(r, runDir, id, cfg); err != nil {
		return fail(err)
	}
	if d.warmup != nil {
		if err := r.step(StepWarmup, func() error { return d.warmup(r.ctx, filepath.Join(runDir, VsockFile)) }); err != nil {
			return fail(err)
		}
	}
	api := d.api(runDir)
	info, err := r.info(api)
	if err != nil {
		return fail(err)
	}
	if err := r.step(StepBalloon, func() error { return d.settleBalloon(r.ctx, api, info, r.log) }); err != nil {
		return fail(err)
	}
	if err := r.step(StepPause, func() error { return api.Pause(r.ctx) }); err != nil {
		return fail(err)
	}
	proc, err := d.attach(r.ctx, runDir, id)
	if proc == nil {
		if err == nil {
			err = fmt.Errorf("build VMM in %s is gone", runDir)
		}
		return fail(err)
	}
	mode, err := d.snapshotInto(r, api, proc, runDir, final, Meta{Kind: fsm.KindGolden, Op: in.OpID.String(), Key: in.Key}, false, time.Time{})
	if err != nil {
		if executors.IsLost(err) {
			// Lost means nothing for a golden: the build is simply redone.
			err = fmt.Errorf("build VMM died: %w", err)
		}
		return fail(err)
	}
	if err := d.stopVM(r, id, runDir, false); err != nil {
		return executors.Result{}, err
	}
	res := r.result(rel)
	if r.copied == fsx.Copy {
		res.Report.CopyMode = fsx.Copy.String()
	} else {
		res.Report.CopyMode = mode
	}
	return res, nil
}
