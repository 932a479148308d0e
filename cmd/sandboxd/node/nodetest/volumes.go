package nodetest

import (
	"context"

	"github.com/sbxlog/sbxlog/executors"
	"github.com/sbxlog/sbxlog/fsm"
)

// AttachVolume implements executors.VolumeAttacher: the disk is "attached"
// at once, or fails for good under FailAttaches.
func (f *FakeDriver) AttachVolume(ctx context.Context, _ fsm.AttachVolume) (executors.Result, error) {
	return executors.Result{}, f.answer(ctx, &f.attaches, &f.FailAttaches)
}

// DetachVolume implements executors.VolumeAttacher.
func (f *FakeDriver) DetachVolume(ctx context.Context, _ fsm.DetachVolume) (executors.Result, error) {
	return executors.Result{}, f.answer(ctx, &f.detaches, nil)
}
