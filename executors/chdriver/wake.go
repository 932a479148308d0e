package chdriver

import (
	"context"
	"errors"

	"github.com/sbxlog/sbxlog/executors"
	"github.com/sbxlog/sbxlog/executors/layout"
	"github.com/sbxlog/sbxlog/fsm"
)

// Wake implements executors.Driver. The run dir gets its own hard link to
// the snapshot's memory-ranges (which the VM maps copy-on-write) and a
// reflink of its cow.raw, so once the wake is durable the snapshot's names
// can go: Result.AfterCommit removes the snapshot dir.
func (d *Driver) Wake(ctx context.Context, in fsm.WakeVM) (executors.Result, error) {
	runDir, err := d.roots.InstanceRunDir(d.instance, in.RunDir)
	if err != nil {
		return executors.Result{}, err
	}
	src, err := d.roots.SnapshotIn(layout.HibernateStore, in.SnapshotDir)
	if err != nil {
		return executors.Result{}, err
	}
	r := d.begin(ctx, string(fsm.KindWake), in.OpID, runDir)
	if err := d.restoreInto(r, in.VM, in.Key, runDir, src, false); err != nil {
		if errors.Is(err, ErrNoSnapshot) {
			err = &executors.Unrecoverable{Err: err, Lost: true}
		}
		return executors.Result{}, err
	}
	res := r.result("")
	res.AfterCommit = func(context.Context) error {
		if err := d.fs.RemoveAll(src); err != nil {
			return err
		}
		d.log.Debug().Str("snapshot", src).Str("vm", in.VM).Msg("dropped the snapshot of a woken VM")
		return nil
	}
	return res, nil
}
