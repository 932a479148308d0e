package qemu

import (
	"context"
	"fmt"
	"net"

	"github.com/sbxlog/sbxlog/executors"
	"github.com/sbxlog/sbxlog/executors/egress/nft"
	"github.com/sbxlog/sbxlog/executors/guest/agent"
	"github.com/sbxlog/sbxlog/executors/reconcile"
	"github.com/sbxlog/sbxlog/executors/tap"
	"github.com/sbxlog/sbxlog/fsm"
)

// Egress pools (see the package doc, "Egress network"): every machine of a
// `net: egress` pool has a second virtio NIC at a fixed PCI slot; a VM's
// is on its own tap, attached to the egress bridge and locked by the lane
// before QEMU opens it, and its guest is given its MAC, address, gateway,
// proxy and CA over the serial port after every boot and restore.

// EgressPCISlot is the PCI slot of the egress NIC (bus 0, function 0),
// out of the way of the slots QEMU assigns by itself.
const EgressPCISlot = 0x10

// egressPCI is the NIC's PCI address as the guest's sysfs names it.
var egressPCI = fmt.Sprintf("0000:00:%02x.0", EgressPCISlot)

const (
	egressNetDev = "egress"
	egressNIC    = "egressnic"
)

// EgressNet is a VM's egress NIC: the tap QEMU opens and what the guest
// is told (agent.NetConfig: MAC, address, gateway, proxy, CA).
type EgressNet struct {
	Tap   string          `json:"tap"`
	Guest agent.NetConfig `json:"guest"`
}

// egressArgs is QEMU's side of the egress NIC of a machine with m.EgressNIC:
// on the VM's tap (no script, no vnet header, so the device offers the same
// features whatever its backend), or, with no EgressNet (a golden build),
// a NIC with no backend, whose device state a clone restores onto its tap.
func egressArgs(eg *EgressNet) []string {
	dev := fmt.Sprintf("virtio-net-pci,id=%s,addr=0x%x,romfile=", egressNIC, EgressPCISlot)
	if eg == nil {
		return []string{"-device", dev}
	}
	return []string{
		"-netdev", fmt.Sprintf("tap,id=%s,ifname=%s,script=no,downscript=no,vnet_hdr=off", egressNetDev, escape(eg.Tap)),
		"-device", fmt.Sprintf("%s,netdev=%s,mac=%s", dev, egressNetDev, eg.Guest.MAC),
	}
}

// Lane locks the taps of egress VMs (executors/egress/nft.Lane).
type Lane interface {
	Lock(vm, tap string, mac net.HardwareAddr) (nft.Lease, error)
	Unlock(vm, tap string, mac net.HardwareAddr) error
	Lease(vm string) (nft.Lease, bool)
	Reconcile(members []nft.Member) (nft.Report, error)
}

// Doors is executors.EgressDoors; QEMU VMs have TCP doors only.
type Doors = executors.EgressDoors

// Egress configures egress pools (Config.Egress).
type Egress struct {
	// Bridge is the egress bridge the taps attach to.
	Bridge string
	// Lane locks them (required).
	Lane Lane
	// Doors opens the VMs' proxy doors (nil: none).
	Doors Doors
	// CAPEM is the node CA guests trust (nil: no intercepted TLS).
	CAPEM []byte
	// NoProxy is the guests' NO_PROXY (default agent.DefaultNoProxy).
	NoProxy string
	// Taps defaults to tap.Kernel.
	Taps tap.Maker
}

func (d *Driver) tapName(vm string) string { return tap.Name(d.instance, vm) }

func (d *Driver) guestMAC(vm string) net.HardwareAddr { return tap.MAC(d.instance, vm) }

// checkEgress reports whether pool k is an egress pool, and an
// *executors.Unrecoverable when this driver has no lane for it.
func (d *Driver) checkEgress(k fsm.PoolKey) (bool, error) {
	if k.Net != NetEgress {
		return false, nil
	}
	if d.egress == nil || d.egress.Lane == nil {
		return true, executors.AsUnrecoverable(fmt.Errorf("pool %s: %w", k, executors.ErrNoBridge))
	}
	return true, nil
}

// attachEgress gives vm its tap on the bridge, locked before QEMU can open
// it, and returns its NIC (the lease the lock gave, told to the guest).
func (d *Driver) attachEgress(vm string) (*EgressNet, error) {
	name, mac := d.tapName(vm), d.guestMAC(vm)
	if err := d.egress.Taps.Create(name, d.egress.Bridge); err != nil {
		return nil, fmt.Errorf("egress tap of %s: %w", vm, err)
	}
	ls, err := d.egress.Lane.Lock(vm, name, mac)
	if err != nil {
		// The tap goes before anything could open it unlocked.
		if derr := d.egress.Taps.Delete(name); derr != nil {
			d.log.Error().Err(derr).Str("tap", name).Msg("could not delete an egress tap whose lock failed")
		}
		return nil, fmt.Errorf("egress lock of %s: %w", vm, err)
	}
	nc := agent.NetConfig{
		V: agent.NetConfigVersion, PCI: egressPCI, MAC: mac.String(),
		Addr: ls.Guest.String(), Gateway: ls.Door.Addr().String(),
		Proxy: "http://" + ls.Door.String(), NoProxy: d.egress.NoProxy, CA: string(d.egress.CAPEM),
	}
	return &EgressNet{Tap: name, Guest: nc}, nil
}

// detachEgress closes vm's doors, deletes its tap and then unlocks it (the
// tap first, so it never exists unlocked). QEMU is gone.
func (d *Driver) detachEgress(vm string) error {
	if d.egress == nil {
		return nil
	}
	d.closeDoors(vm)
	if err := d.egress.Taps.Delete(d.tapName(vm)); err != nil {
		return fmt.Errorf("egress tap of %s: %w", vm, err)
	}
	if err := d.egress.Lane.Unlock(vm, d.tapName(vm), d.guestMAC(vm)); err != nil {
		return fmt.Errorf("egress unlock of %s: %w", vm, err)
	}
	return nil
}

// openDoors opens vm's TCP door once its guest runs. A failure is logged:
// the VM is sound, and without doors its guest reaches nothing.
func (d *Driver) openDoors(vm string) {
	if d.egress == nil || d.egress.Doors == nil {
		return
	}
	ls, ok := d.egress.Lane.Lease(vm)
	if !ok {
		return
	}
	if err := d.egress.Doors.Open(vm, ls.Door, ""); err != nil {
		d.log.Error().Err(err).Str("vm", vm).Msg("could not open the VM's egress proxy door; its guest reaches nothing")
	}
}

func (d *Driver) closeDoors(vm string) {
	if d.egress != nil && d.egress.Doors != nil {
		d.egress.Doors.Close(vm)
	}
}

var _ reconcile.EgressLocker = (*Driver)(nil)

// ReconcileEgress implements reconcile.EgressLocker, as the Cloud
// Hypervisor driver does: the locks of the egress VMs among vms are checked
// and repaired (their addresses re-pinned), every other lock of the
// instance removed after its tap; a VM whose tap cannot be locked has its
// QEMU stopped. AdoptVM then opens the doors of the VMs that hold a lease.
func (d *Driver) ReconcileEgress(ctx context.Context, vms []reconcile.VMRef) (reconcile.EgressReport, error) {
	if d.egress == nil || d.egress.Lane == nil {
		return reconcile.EgressReport{}, nil
	}
	member := func(vm string) nft.Member { return nft.Member{VM: vm, Tap: d.tapName(vm), MAC: d.guestMAC(vm)} }
	stop := func(ctx context.Context, vm, runDir string) error {
		dir, err := d.roots.VMRunDir(d.instance, vm, runDir)
		if err != nil {
			return nil // not this instance's: nothing of it is touched
		}
		return d.q.Stop(ctx, Spec{RunDir: dir, StoreDir: d.roots.Store})
	}
	return reconcile.LockEgress(ctx, d.egress.Lane, vms, NetEgress, member, stop, d.log)
}
