package nodetest

import (
	"context"

	"github.com/sbxlog/sbxlog/executors"
	"github.com/sbxlog/sbxlog/fsm"
)

// AttachVolume implements executors.VolumeAttacher: the disk is "attached"
// at once, or fails for good under FailAttaches.
func (f *FakeDriver) AttachVolume(ctx context.Context, in fsm.AttachVolume) (executors.Result, error) {
	if err := f.held(ctx); err != nil {
		return executors.Result{}, err
	}
	f.attaches.Add(1)
	if f.FailAttaches.Load() {
		return executors.Result{}, executors.Unrecoverablef("nodetest: attach of %s failed as asked", in.Disk.Name)
	}
	return executors.Result{}, nil
}

// DetachVolume implements executors.VolumeAttacher.
func (f *FakeDriver) DetachVolume(ctx context.Context, _ fsm.DetachVolume) (executors.Result, error) {
	if err := f.held(ctx); err != nil {
		return executors.Result{}, err
	}
	f.detaches.Add(1)
	return executors.Result{}, nil
}
