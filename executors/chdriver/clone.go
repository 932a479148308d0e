package chdriver

import (
	"context"
	"errors"
	"path/filepath"

	"github.com/sbxlog/sbxlog/executors"
	"github.com/sbxlog/sbxlog/executors/ch"
	"github.com/sbxlog/sbxlog/executors/fsx"
	"github.com/sbxlog/sbxlog/executors/templates"
	"github.com/sbxlog/sbxlog/fsm"
)

// Clone implements executors.Driver: restore from the golden (hard-linked
// memory-ranges, reflinked cow.raw, rewritten config), or a cold boot of the
// template when in.Cold.
func (d *Driver) Clone(ctx context.Context, in fsm.CloneVM) (executors.Result, error) {
	runDir, err := d.roots.InstanceRunDir(d.instance, in.RunDir)
	if err != nil {
		return executors.Result{}, err
	}
	if in.Cold {
		return d.coldBoot(ctx, in, runDir)
	}
	r := d.begin(ctx, string(fsm.KindClone), in.OpID, runDir)
	if in.GoldenDir == "" {
		return executors.Result{}, executors.Unrecoverablef("clone %s: no golden to clone from", in.VM)
	}
	src, err := d.roots.CloneSource(in.GoldenDir)
	if err != nil {
		return executors.Result{}, err
	}
	if err := d.restoreInto(r, in.VM, in.Key, runDir, src, true); err != nil {
		if errors.Is(err, ErrNoSnapshot) {
			err = executors.AsUnrecoverable(err)
		}
		return executors.Result{}, err
	}
	return r.result(""), nil
}

// templateConfig loads the pool's template and derives the config of a VM
// of the pool's size running in runDir. Under chsim a missing template is
// made up when synth says a configured pool names it (a golden build, a
// pool's cold boot): under chsim a pool's template exists. A cold boot of
// a template no pool names fails as it would on Cloud Hypervisor without
// that template, which is what a claim for an unknown template answers
// (the old daemon's 500).
func (d *Driver) templateConfig(r *run, k fsm.PoolKey, runDir string, synth bool) (*templates.Template, *ch.VmConfig, error) {
	res, err := d.sizes.Lookup(k.Size)
	if err != nil {
		return nil, nil, executors.AsUnrecoverable(err)
	}
	dir, err := d.roots.TemplateDir(k.Template)
	if err != nil {
		return nil, nil, err
	}
	var t *templates.Template
	err = r.step(StepTemplate, func() error {
		var err error
		t, err = templates.Load(dir)
		if errors.Is(err, templates.ErrNotFound) && d.hv == CHSim && synth {
			r.log.Info().Str("template", dir).Msg("template missing; synthesizing one for chsim")
			if err := templates.Synthesize(dir, d.synth); err != nil {
				return err
			}
			t, err = templates.Load(dir)
		}
		if errors.Is(err, templates.ErrNotFound) || errors.Is(err, templates.ErrInvalid) {
			return executors.AsUnrecoverable(err)
		}
		return err
	})
	if err != nil {
		return nil, nil, err
	}
	cfg, err := t.VMConfig(res, d.vmPaths(runDir))
	if err != nil {
		return nil, nil, executors.AsUnrecoverable(err)
	}
	return t, cfg, nil
}

func (d *Driver) vmPaths(runDir string) templates.Paths {
	return templates.Paths{
		Disk:        filepath.Join(runDir, DiskFile),
		VsockSocket: filepath.Join(runDir, VsockFile),
		Console:     filepath.Join(runDir, ConsoleFile),
		Serial:      filepath.Join(runDir, SerialFile),
	}
}

// coldBoot boots the template directly into the VM's run dir (the cold
// tier, when no golden is ready).
func (d *Driver) coldBoot(ctx context.Context, in fsm.CloneVM, runDir string) (executors.Result, error) {
	r := d.begin(ctx, RecipeCold, in.OpID, runDir)
	egress, err := d.checkEgress(in.Key)
	if err != nil {
		return executors.Result{}, err
	}
	if done, err := d.finishExisting(r, in.VM, runDir, egress, false); err != nil || done {
		if done {
			d.openDoors(r, in.VM, runDir)
		}
		return r.result(""), err
	}
	t, cfg, err := d.templateConfig(r, in.Key, runDir, in.Pooled)
	if err != nil {
		return executors.Result{}, err
	}
	if egress {
		_ = cfg.Set([]any{map[string]any{"id": NICID, "tap": d.tapName(in.VM), "mac": MAC(in.VM)}}, "net")
	}
	if err := d.resetRun(r, in.VM, runDir, runDir); err != nil {
		return executors.Result{}, err
	}
	fail := func(err error) (executors.Result, error) {
		d.teardown(r, in.VM, runDir, egress)
		return executors.Result{}, err
	}
	if err := r.step(StepCloneTemplate, func() error {
		cr, err := d.fs.Clone(filepath.Join(runDir, DiskFile), t.Disk, fsx.Overwrite())
		r.noteClone(cr.Method)
		return err
	}); err != nil {
		return fail(err)
	}
	if egress {
		if err := r.step(StepTapCreate, func() error { return d.taps.Create(d.tapName(in.VM), d.bridge) }); err != nil {
			return fail(err)
		}
		if err := d.lockTap(r, in.VM); err != nil {
			return fail(err)
		}
	}
	if err := d.boot(r, runDir, in.VM, cfg); err != nil {
		return fail(err)
	}
	d.openDoors(r, in.VM, runDir)
	return r.result(""), nil
}

// boot launches a VMM and cold-boots cfg in it, up to readiness.
func (d *Driver) boot(r *run, runDir, id string, cfg *ch.VmConfig) error {
	if err := r.step(StepLaunch, func() error { _, err := d.launch(r.ctx, runDir, id); return err }); err != nil {
		return err
	}
	api := d.api(runDir)
	if err := r.step(StepCreate, func() error { return api.Create(r.ctx, cfg) }); err != nil {
		return err
	}
	if err := r.step(StepBoot, func() error { return api.Boot(r.ctx) }); err != nil {
		return err
	}
	return d.probe(r, api, runDir, d.bootTO)
}
