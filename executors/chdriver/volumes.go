package chdriver

import (
	"context"
	"fmt"
	"path/filepath"

	"github.com/sbxlog/sbxlog/executors"
	"github.com/sbxlog/sbxlog/executors/ch"
	"github.com/sbxlog/sbxlog/executors/vmm"
	"github.com/sbxlog/sbxlog/fsm"
)

// Volumes (executors.VolumeAttacher) on Cloud Hypervisor: the backing file
// is hot-plugged with vm.add-disk (read-only unless RW, the volume's name
// as its serial, id "vol-<name>") and unplugged with vm.remove-device. CH
// keeps a hot-plugged disk in the VM's config, so a hibernate's config.json
// names it and a restore reopens it (the restore rewrites only the VM's own
// disk, disks[0]). The guest's mount is not made here: a CH guest's agent
// speaks only the data plane, so a volume is attached as the old daemon's
// attach-only volumes were (found by its serial under /sys/block).

// diskAPI is the part of the CH client the volume calls need.
type diskAPI interface {
	AddDisk(ctx context.Context, dc ch.DiskConfig) (*ch.PciDeviceInfo, error)
	RemoveDevice(ctx context.Context, id string) error
}

func (d *Driver) diskAPI(runDir string) diskAPI {
	if a, ok := d.api(runDir).(diskAPI); ok {
		return a
	}
	return ch.New(filepath.Join(runDir, vmm.SocketFile))
}

func volumeDevice(name string) string { return "vol-" + name }

// AttachVolume implements executors.VolumeAttacher: vm.add-disk; a disk of
// that id already there (a re-run) is done.
func (d *Driver) AttachVolume(ctx context.Context, in fsm.AttachVolume) (executors.Result, error) {
	runDir, err := d.roots.InstanceRunDir(d.instance, in.RunDir)
	if err != nil {
		return executors.Result{}, err
	}
	_, err = d.diskAPI(runDir).AddDisk(ctx, ch.DiskConfig{Path: in.Disk.Path, Readonly: !in.Disk.RW, Serial: in.Disk.Name, ID: volumeDevice(in.Disk.Name)})
	if err != nil && !ch.IsConflict(err) {
		return executors.Result{}, fmt.Errorf("attach volume %s to %s: %w", in.Disk.Name, in.VM, err)
	}
	return executors.Result{}, nil
}

// DetachVolume implements executors.VolumeAttacher: vm.remove-device; a
// device already gone is done.
func (d *Driver) DetachVolume(ctx context.Context, in fsm.DetachVolume) (executors.Result, error) {
	runDir, err := d.roots.InstanceRunDir(d.instance, in.RunDir)
	if err != nil {
		return executors.Result{}, err
	}
	if err := d.diskAPI(runDir).RemoveDevice(ctx, volumeDevice(in.Disk.Name)); err != nil && !ch.IsNotFound(err) {
		return executors.Result{}, fmt.Errorf("detach volume %s from %s: %w", in.Disk.Name, in.VM, err)
	}
	return executors.Result{}, nil
}

// reattachVolumes hot-plugs a cold-restarted VM's volumes again (its new
// VMM booted from the template's config, without them).
func (d *Driver) reattachVolumes(ctx context.Context, in fsm.RestartVM) error {
	for _, v := range in.Volumes {
		vi := fsm.VolumeIntent{OpID: in.OpID, Claim: in.Claim, VM: in.VM, Key: in.Key, Instance: in.Instance, RunDir: in.RunDir, Disk: v}
		if _, err := d.AttachVolume(ctx, fsm.AttachVolume{VolumeIntent: vi}); err != nil {
			return fmt.Errorf("restart %s: %w", in.VM, err)
		}
	}
	return nil
}
