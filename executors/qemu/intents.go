package qemu

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"

	"github.com/sbxlog/sbxlog/eventlog/event"
	"github.com/sbxlog/sbxlog/executors"
	"github.com/sbxlog/sbxlog/executors/layout"
	"github.com/sbxlog/sbxlog/fsm"
)

// StepRemoveSnapshot is the driver's own step in a destroy's report: removing
// the VM's hibernate snapshot.
const StepRemoveSnapshot = "remove_snap"

// BuildGolden implements executors.Driver: Recipes.Golden of the configured guest
// at the pool size's memory into golden/<key>-<op>.
func (d *Driver) BuildGolden(ctx context.Context, in fsm.BuildGolden) (executors.Result, error) {
	rel := layout.GoldenRel(in.Key, in.OpID)
	final := filepath.Join(d.roots.Store, rel)
	runDir := d.roots.GoldenRunDir(d.instance, in.OpID)
	if _, err := checkSnapshot(final); err == nil {
		// A re-run after a crash past the rename: keep the golden, stop the
		// build VM if it outlived the crash.
		r, err := d.q.Destroy(ctx, Spec{RunDir: runDir, StoreDir: filepath.Dir(final)})
		if err != nil {
			return executors.Result{}, fmt.Errorf("golden %s: stopping the build VM: %w", in.Key, classify(err))
		}
		r.Already = true
		return executors.Result{Report: d.report(r), SnapshotDir: rel}, nil
	}
	spec, err := d.bootSpec(ctx, runDir, filepath.Dir(final), in.Key)
	if err != nil {
		return executors.Result{}, fmt.Errorf("golden %s: %w", in.Key, err)
	}
	r, err := d.q.Golden(ctx, spec, filepath.Base(final))
	if err != nil {
		d.teardown(ctx, spec)
		return executors.Result{}, fmt.Errorf("golden %s: %w", in.Key, classify(err))
	}
	if _, err := checkSnapshot(final); err != nil {
		return executors.Result{}, fmt.Errorf("golden %s: built but unusable: %w", in.Key, err)
	}
	return executors.Result{Report: d.report(r), SnapshotDir: rel}, nil
}

// teardown stops whatever QEMU runs in spec's run dir and removes the run dir,
// after a failed recipe.
func (d *Driver) teardown(ctx context.Context, spec Spec) {
	d.unwatch(spec.RunDir)
	d.cleanup(ctx, "tear down "+spec.RunDir, func(ctx context.Context) error {
		_, err := d.q.Destroy(ctx, spec)
		return err
	})
}

// Clone implements executors.Driver: Recipes.Clone from the golden
// in.GoldenDir, or Recipes.Boot of the configured guest when in.Cold.
func (d *Driver) Clone(ctx context.Context, in fsm.CloneVM) (executors.Result, error) {
	runDir, err := d.roots.InstanceRunDir(d.instance, in.RunDir)
	if err != nil {
		return executors.Result{}, err
	}
	// A clone from a golden needs no template of its key's name (a
	// promoted template's key names none), only the net; a cold boot both.
	check := in.Key
	if !in.Cold {
		check.Template = ""
	}
	if err := d.checkPool(check); err != nil {
		return executors.Result{}, executors.AsUnrecoverable(fmt.Errorf("clone %s: pool %s: %w", in.VM, in.Key, err))
	}
	var eg *EgressNet
	if in.Key.Net == NetEgress {
		if eg, err = d.attachEgress(in.VM); err != nil {
			return executors.Result{}, err
		}
	}
	var spec Spec
	var r RecipeResult
	if in.Cold {
		// Boot clones nothing from the store; StoreDir only has to be valid.
		if spec, err = d.bootSpec(ctx, runDir, d.roots.Store, in.Key); err != nil {
			d.dropEgress(ctx, in.VM)
			return executors.Result{}, fmt.Errorf("cold boot %s: %w", in.VM, err)
		}
		spec.Egress = eg
		r, err = d.q.Boot(ctx, spec)
	} else {
		if in.GoldenDir == "" {
			d.dropEgress(ctx, in.VM)
			return executors.Result{}, executors.Unrecoverablef("clone %s: no golden to clone from", in.VM)
		}
		golden, gerr := d.roots.CloneSource(in.GoldenDir)
		if gerr != nil {
			d.dropEgress(ctx, in.VM)
			return executors.Result{}, gerr
		}
		spec = Spec{RunDir: runDir, StoreDir: filepath.Dir(golden), Egress: eg}
		if _, err = checkSnapshot(golden); err == nil {
			r, err = d.q.Clone(ctx, spec, filepath.Base(golden))
		}
	}
	if err != nil {
		d.teardown(ctx, spec)
		d.dropEgress(ctx, in.VM)
		if errors.Is(err, ErrNoSnapshot) {
			err = executors.AsUnrecoverable(err)
		}
		return executors.Result{}, fmt.Errorf("clone %s: %w", in.VM, classify(err))
	}
	d.watch(runDir, r.PID)
	d.openDoors(in.VM)
	return executors.Result{Report: d.report(r)}, nil
}

// dropEgress undoes attachEgress after a failed recipe whose QEMU is gone.
func (d *Driver) dropEgress(ctx context.Context, vm string) {
	d.cleanup(ctx, "detach the egress tap of "+vm, func(context.Context) error { return d.detachEgress(vm) })
}

// Hibernate implements executors.Driver: Recipes.Hibernate into
// hibernate/<vm>-<op>.
func (d *Driver) Hibernate(ctx context.Context, in fsm.HibernateVM) (executors.Result, error) {
	runDir, err := d.roots.InstanceRunDir(d.instance, in.RunDir)
	if err != nil {
		return executors.Result{}, err
	}
	rel := layout.HibernateRel(in.VM, in.OpID)
	final := filepath.Join(d.roots.Store, rel)
	spec := Spec{RunDir: runDir, StoreDir: filepath.Dir(final)}
	// The hibernate stops QEMU itself; a failure hands it back (hibernateFailed).
	d.unwatch(runDir)
	r, err := d.q.Hibernate(ctx, spec, filepath.Base(final))
	if err != nil {
		return executors.Result{}, d.hibernateFailed(ctx, in.VM, spec, final, fmt.Errorf("hibernate %s: %w", in.VM, err))
	}
	// QEMU is gone: its tap and lock go too (a wake makes them again).
	if in.Key.Net == NetEgress {
		if err := d.detachEgress(in.VM); err != nil {
			return executors.Result{}, fmt.Errorf("hibernate %s: %w", in.VM, err)
		}
	}
	return executors.Result{Report: d.report(r), SnapshotDir: rel}, nil
}

// hibernateFailed classifies a failed hibernate and restores the contract:
// before the rename the VM runs again (or is lost), after it the snapshot
// stands and a re-run finishes stopping the VM.
func (d *Driver) hibernateFailed(ctx context.Context, vm string, spec Spec, final string, err error) error {
	if errors.Is(err, ErrInvalidSpec) {
		return classify(err)
	}
	if _, serr := checkSnapshot(final); serr == nil {
		return classify(err)
	}
	pid, aerr := d.q.Adopt(spec)
	if errors.Is(aerr, ErrNotRunning) {
		// Its memory existed only in that QEMU's RAM file, which no snapshot holds.
		return &executors.Unrecoverable{Err: fmt.Errorf("%w; VM %s has no QEMU and no snapshot was taken", err, vm), Lost: true}
	}
	defer d.watch(spec.RunDir, pid)
	// Recipes.Hibernate resumes a VM it stopped, but one stopped by a daemon that
	// crashed mid-hibernate (paused, or in postmigrate) it leaves as found.
	d.cleanup(ctx, "resume "+vm+" after a failed hibernate", func(ctx context.Context) error {
		_, rerr := d.q.Resume(ctx, spec)
		return rerr
	})
	// The VM runs on: after a restart nothing else opens its egress door
	// (the reconcile leaves a VM in flight to this re-run), and a guest
	// without it reaches nothing. Opening an open door changes nothing.
	d.openDoors(vm)
	return classify(err)
}

// Wake implements executors.Driver: Recipes.Wake from in.SnapshotDir. The run
// dir gets its own clone of the RAM file, so the snapshot backs nothing once
// the wake is durable: Result.AfterCommit removes it.
func (d *Driver) Wake(ctx context.Context, in fsm.WakeVM) (executors.Result, error) {
	runDir, err := d.roots.InstanceRunDir(d.instance, in.RunDir)
	if err != nil {
		return executors.Result{}, err
	}
	src, err := d.roots.SnapshotIn(layout.HibernateStore, in.SnapshotDir)
	if err != nil {
		return executors.Result{}, err
	}
	spec := Spec{RunDir: runDir, StoreDir: filepath.Dir(src)}
	if _, err := checkSnapshot(src); err != nil {
		d.teardown(ctx, spec)
		return executors.Result{}, &executors.Unrecoverable{Err: fmt.Errorf("wake %s: %w", in.VM, err), Lost: true}
	}
	egress, err := d.checkEgress(in.Key)
	if err != nil {
		return executors.Result{}, fmt.Errorf("wake %s: %w", in.VM, err)
	}
	if egress {
		if spec.Egress, err = d.attachEgress(in.VM); err != nil {
			return executors.Result{}, err
		}
	}
	r, err := d.q.Wake(ctx, spec, filepath.Base(src))
	if err != nil {
		d.teardown(ctx, spec)
		if egress {
			d.dropEgress(ctx, in.VM)
		}
		if errors.Is(err, ErrNoSnapshot) {
			return executors.Result{}, &executors.Unrecoverable{Err: fmt.Errorf("wake %s: %w", in.VM, err), Lost: true}
		}
		return executors.Result{}, fmt.Errorf("wake %s: %w", in.VM, classify(err))
	}
	d.watch(runDir, r.PID)
	d.openDoors(in.VM)
	res := executors.Result{Report: d.report(r)}
	res.AfterCommit = func(context.Context) error {
		if err := d.fs.RemoveAll(src); err != nil {
			return err
		}
		d.log.Debug().Str("snapshot", src).Str("vm", in.VM).Msg("dropped the snapshot of a woken VM")
		return nil
	}
	return res, nil
}

// Destroy implements executors.Driver: Recipes.Destroy, then the VM's hibernate
// snapshot when in.SnapshotDir is set. Everything tolerates what is already
// gone, so a re-run finishes the job.
func (d *Driver) Destroy(ctx context.Context, in fsm.DestroyVM) (executors.Result, error) {
	runDir, err := d.roots.OwnedRunDir(d.instance, in.Instance, in.VM, in.RunDir, string(in.Kind()))
	if err != nil {
		return executors.Result{}, err
	}
	var snap string
	if in.SnapshotDir != "" {
		if snap, err = d.roots.SnapshotIn(layout.HibernateStore, in.SnapshotDir); err != nil {
			return executors.Result{}, err
		}
	}
	d.unwatch(runDir)
	d.closeDoors(in.VM)
	r, err := d.q.Destroy(ctx, Spec{RunDir: runDir, StoreDir: d.roots.Store})
	if err != nil {
		return executors.Result{}, fmt.Errorf("destroy %s: %w", in.VM, classify(err))
	}
	if in.Key.Net == NetEgress {
		if err := d.detachEgress(in.VM); err != nil {
			return executors.Result{}, fmt.Errorf("destroy %s: %w", in.VM, err)
		}
	}
	var extra []event.Step
	if snap != "" {
		t0 := d.now()
		if err := d.fs.RemoveAll(snap); err != nil {
			return executors.Result{}, fmt.Errorf("destroy %s: remove snapshot: %w", in.VM, classify(err))
		}
		extra = append(extra, event.Step{Name: StepRemoveSnapshot, NS: int64(d.now().Sub(t0))})
	}
	return executors.Result{Report: d.report(r, extra...)}, nil
}
