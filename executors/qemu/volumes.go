package qemu

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/sbxlog/sbxlog/executors"
	"github.com/sbxlog/sbxlog/executors/fsx"
	"github.com/sbxlog/sbxlog/executors/guest/agent"
	"github.com/sbxlog/sbxlog/executors/qemu/qmp"
	"github.com/sbxlog/sbxlog/fsm"
)

// Volumes (executors.VolumeAttacher): a volume's backing file is hot-plugged
// into the running VM over QMP: blockdev-add of a raw node on the file
// (read-only unless RW; QEMU's file locking then shares a read-only image and
// keeps a read-write one to this process), device_add of a virtio-blk-pci
// device with the volume's name as its serial at a fixed PCI slot, then the
// guest agent mounts it (agent.VolumeMount). The attached volumes are kept in
// the run dir's vm.json (Meta.Volumes), which is what a hibernate records in
// its snapshot: a restore launches QEMU with the same disks at the same slots
// (-blockdev/-device), as the migration stream needs, and the guest's mount
// comes back with its memory. A detach unmounts in the guest (refused while
// files are open there), device_del and waits for the guest to release the
// device (DEVICE_DELETED), then blockdev-del. A cold restart boots without
// them and the driver attaches them again.

// MetaVolume is an attached volume of a machine (Meta.Volumes).
type MetaVolume struct {
	Name string `json:"name"`
	Path string `json:"path"`
	RW   bool   `json:"rw,omitempty"`
	// Slot is the device's PCI slot (VolumeFirstSlot + n).
	Slot int `json:"slot"`
}

// VolumeFirstSlot is the PCI slot of the first volume; fsm.MaxClaimVolumes
// slots from it are theirs (the egress NIC is at EgressPCISlot, the devices
// launched without an address take the low ones).
const VolumeFirstSlot = 0x18

// volumeTimeout bounds the guest's release of an unplugged disk.
const volumeTimeout = 30 * time.Second

func volumeNode(name string) string { return "vol-" + name }

// volumeArgs are the -blockdev/-device arguments of a machine's volumes.
func volumeArgs(vs []MetaVolume) []string {
	var args []string
	for _, v := range vs {
		ro := "on"
		if v.RW {
			ro = "off"
		}
		args = append(args,
			"-blockdev", fmt.Sprintf("driver=raw,node-name=%s,read-only=%s,file.driver=file,file.filename=%s", volumeNode(v.Name), ro, escape(v.Path)),
			"-device", fmt.Sprintf("virtio-blk-pci,drive=%s,id=%s,serial=%s,addr=%#x", volumeNode(v.Name), volumeNode(v.Name), v.Name, v.Slot))
	}
	return args
}

// freeSlot returns the first volume slot vs does not use.
func freeSlot(vs []MetaVolume) (int, error) {
	for s := VolumeFirstSlot; s < VolumeFirstSlot+fsm.MaxClaimVolumes; s++ {
		if !slices.ContainsFunc(vs, func(v MetaVolume) bool { return v.Slot == s }) {
			return s, nil
		}
	}
	return 0, fmt.Errorf("%w: no free volume slot (%d volumes)", ErrInvalidSpec, len(vs))
}

// AttachVolume hot-plugs v into the VM running in runDir and has the guest
// mount it at v.Mount (none when empty). A re-run finds what is done.
func (q *Recipes) AttachVolume(ctx context.Context, runDir string, v fsm.VolumeDisk) error {
	q.rearmMu.Lock() // one user of the guest's serial port at a time
	defer q.rearmMu.Unlock()
	if _, err := q.adopt(runDir); err != nil {
		return err
	}
	m, err := launchedMeta(runDir)
	if err != nil {
		return err
	}
	i := slices.IndexFunc(m.Volumes, func(x MetaVolume) bool { return x.Name == v.Name })
	if i < 0 {
		slot, err := freeSlot(m.Volumes)
		if err != nil {
			return err
		}
		mv := MetaVolume{Name: v.Name, Path: v.Path, RW: v.RW, Slot: slot}
		if err := q.plug(ctx, runDir, mv); err != nil {
			return err
		}
		m.Volumes = append(m.Volumes, mv)
		if err := writeLaunchedMeta(runDir, m); err != nil {
			return err
		}
	} else if m.Volumes[i].Path != v.Path || m.Volumes[i].RW != v.RW {
		return fmt.Errorf("%w: volume %s is attached from %s (rw %v), not %s (rw %v)", ErrInvalidSpec, v.Name, m.Volumes[i].Path, m.Volumes[i].RW, v.Path, v.RW)
	}
	if v.Mount == "" {
		return nil
	}
	if err := q.guestVolume(ctx, runDir, v, (*agent.Client).Mount); err != nil {
		// Roll back: no disk is left behind a failed attach.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), volumeTimeout)
		defer cancel()
		return errors.Join(err, q.unplugVolume(rctx, runDir, v.Name))
	}
	return nil
}

// DetachVolume unmounts v in the guest and unplugs it; a re-run finds it
// gone. A failed unmount (files open) leaves it attached and mounted.
func (q *Recipes) DetachVolume(ctx context.Context, runDir string, v fsm.VolumeDisk) error {
	q.rearmMu.Lock()
	defer q.rearmMu.Unlock()
	if _, err := q.adopt(runDir); err != nil {
		return err
	}
	if v.Mount != "" {
		if err := q.guestVolume(ctx, runDir, v, (*agent.Client).Unmount); err != nil {
			return err
		}
	}
	return q.unplugVolume(ctx, runDir, v.Name)
}

func (q *Recipes) guestVolume(ctx context.Context, runDir string, v fsm.VolumeDisk, do func(*agent.Client, context.Context, agent.VolumeMount) error) error {
	a, err := agent.Dial(ctx, AgentSocket(runDir))
	if err != nil {
		return fmt.Errorf("qemu: volume %s: %w", v.Name, err)
	}
	defer a.Close()
	return do(a, ctx, agent.VolumeMount{Serial: v.Name, Path: v.Mount, RW: v.RW})
}

// plug adds mv's block node and device; either already there (a re-run)
// counts as done.
func (q *Recipes) plug(ctx context.Context, runDir string, mv MetaVolume) error {
	c, err := qmp.Dial(ctx, QMPSocket(runDir))
	if err != nil {
		return fmt.Errorf("qemu: attach %s: %w", mv.Name, err)
	}
	defer c.Close()
	node := volumeNode(mv.Name)
	err = c.Execute(ctx, "blockdev-add", map[string]any{
		"driver": "raw", "node-name": node, "read-only": !mv.RW,
		"file": map[string]any{"driver": "file", "filename": mv.Path},
	}, nil)
	if err != nil && !qmpSays(err, "Duplicate node") {
		return fmt.Errorf("qemu: attach %s: %w", mv.Name, err)
	}
	err = c.Execute(ctx, "device_add", map[string]any{
		"driver": "virtio-blk-pci", "id": node, "drive": node, "serial": mv.Name, "addr": fmt.Sprintf("%#x", mv.Slot),
	}, nil)
	if err != nil && !qmpSays(err, "Duplicate ID", "duplicate ID") {
		_ = c.Execute(ctx, "blockdev-del", map[string]any{"node-name": node}, nil)
		return fmt.Errorf("qemu: attach %s: %w", mv.Name, err)
	}
	return nil
}

// unplugVolume removes volume name's device (waiting for the guest to let
// it go) and block node, and drops it from vm.json.
func (q *Recipes) unplugVolume(ctx context.Context, runDir, name string) error {
	c, err := qmp.Dial(ctx, QMPSocket(runDir))
	if err != nil {
		return fmt.Errorf("qemu: detach %s: %w", name, err)
	}
	defer c.Close()
	node := volumeNode(name)
	sub := c.Subscribe("DEVICE_DELETED")
	defer sub.Close()
	err = c.Execute(ctx, "device_del", map[string]any{"id": node}, nil)
	switch {
	case err == nil:
		wctx, cancel := context.WithTimeout(ctx, volumeTimeout)
		_, err = sub.Wait(wctx, func(ev qmp.Event) bool {
			var d struct {
				Device string `json:"device"`
			}
			return json.Unmarshal(ev.Data, &d) == nil && d.Device == node
		})
		cancel()
		if err != nil {
			return fmt.Errorf("qemu: detach %s: the guest did not release the disk: %w", name, err)
		}
	case !qmpSays(err, "not found"):
		return fmt.Errorf("qemu: detach %s: %w", name, err)
	}
	if err := c.Execute(ctx, "blockdev-del", map[string]any{"node-name": node}, nil); err != nil && !qmpSays(err, "Failed to find node", "not found") {
		return fmt.Errorf("qemu: detach %s: %w", name, err)
	}
	m, err := launchedMeta(runDir)
	if err != nil {
		return err
	}
	if n := len(m.Volumes); n > 0 {
		m.Volumes = slices.DeleteFunc(m.Volumes, func(v MetaVolume) bool { return v.Name == name })
		if len(m.Volumes) != n {
			return writeLaunchedMeta(runDir, m)
		}
	}
	return nil
}

func qmpSays(err error, what ...string) bool {
	var qe *qmp.Error
	if !errors.As(err, &qe) {
		return false
	}
	return slices.ContainsFunc(what, func(w string) bool { return strings.Contains(qe.Desc, w) })
}

// writeLaunchedMeta rewrites vm.json (the machine as it runs now).
func writeLaunchedMeta(runDir string, m Meta) error {
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	if err := fsx.WriteFileAtomic(filepath.Join(runDir, FileVM), b, 0o600); err != nil {
		return fmt.Errorf("qemu: %w", err)
	}
	return nil
}

// AttachVolume implements executors.VolumeAttacher.
func (d *Driver) AttachVolume(ctx context.Context, in fsm.AttachVolume) (executors.Result, error) {
	runDir, err := d.roots.InstanceRunDir(d.instance, in.RunDir)
	if err != nil {
		return executors.Result{}, err
	}
	if err := checkVolumeFile(in.Disk); err != nil {
		return executors.Result{}, err
	}
	if err := d.q.AttachVolume(ctx, runDir, in.Disk); err != nil {
		return executors.Result{}, fmt.Errorf("attach volume %s to %s: %w", in.Disk.Name, in.VM, classify(err))
	}
	return executors.Result{}, nil
}

// DetachVolume implements executors.VolumeAttacher.
func (d *Driver) DetachVolume(ctx context.Context, in fsm.DetachVolume) (executors.Result, error) {
	runDir, err := d.roots.InstanceRunDir(d.instance, in.RunDir)
	if err != nil {
		return executors.Result{}, err
	}
	if err := d.q.DetachVolume(ctx, runDir, in.Disk); err != nil {
		return executors.Result{}, fmt.Errorf("detach volume %s from %s: %w", in.Disk.Name, in.VM, classify(err))
	}
	return executors.Result{}, nil
}

// reattachVolumes attaches a cold-restarted VM's volumes again.
func (d *Driver) reattachVolumes(ctx context.Context, runDir string, vs []fsm.VolumeDisk) error {
	for _, v := range vs {
		if err := d.q.AttachVolume(ctx, runDir, v); err != nil {
			return fmt.Errorf("volume %s: %w", v.Name, classify(err))
		}
	}
	return nil
}

// checkVolumeFile refuses a backing file that is not there (an operator's
// catalog pointing nowhere): retrying cannot help.
func checkVolumeFile(v fsm.VolumeDisk) error {
	st, err := os.Stat(v.Path)
	switch {
	case err != nil:
		return executors.Unrecoverablef("volume %s: %v", v.Name, err)
	case !st.Mode().IsRegular() && st.Mode()&os.ModeDevice == 0:
		return executors.Unrecoverablef("volume %s: %s is not a file or block device", v.Name, v.Path)
	}
	return nil
}
