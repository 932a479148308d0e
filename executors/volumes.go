package executors

import (
	"context"

	"github.com/sbxlog/sbxlog/fsm"
)

// VolumeAttacher is implemented by drivers that hot-plug volumes into a
// running VM (fsm.AttachVolume, fsm.DetachVolume): a disk image attached
// as a virtio-blk disk whose serial is the volume's name, read-only unless
// the intent says RW, then mounted by the guest agent at the intent's mount
// (none for attach-only). Both are idempotent under the op id like every
// Driver method: an attach finding the disk attached (and mounted) and a
// detach finding it gone succeed. On error an attach leaves no disk behind;
// a detach whose unmount failed (files open) leaves the volume attached and
// mounted. The dispatch table fails the volume intents of a driver without
// it (a claim asking for volumes then fails).
type VolumeAttacher interface {
	AttachVolume(ctx context.Context, in fsm.AttachVolume) (Result, error)
	DetachVolume(ctx context.Context, in fsm.DetachVolume) (Result, error)
}

func attachVolume(d Driver, ctx context.Context, in fsm.AttachVolume) (Result, error) {
	if v, ok := d.(VolumeAttacher); ok {
		return v.AttachVolume(ctx, in)
	}
	return Result{}, Unrecoverablef("attach volume %s to %s: this hypervisor driver cannot attach volumes", in.Disk.Name, in.VM)
}

func detachVolume(d Driver, ctx context.Context, in fsm.DetachVolume) (Result, error) {
	if v, ok := d.(VolumeAttacher); ok {
		return v.DetachVolume(ctx, in)
	}
	return Result{}, Unrecoverablef("detach volume %s from %s: this hypervisor driver cannot attach volumes", in.Disk.Name, in.VM)
}
