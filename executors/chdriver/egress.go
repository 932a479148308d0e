package chdriver

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"path/filepath"

	"github.com/sbxlog/sbxlog/executors"
	"github.com/sbxlog/sbxlog/executors/egress/nft"
	"github.com/sbxlog/sbxlog/executors/reconcile"
)

// EgressLane locks the taps of egress VMs (executors/egress/nft.Lane).
type EgressLane interface {
	// Lock gives vm a door and a guest address and locks its tap to them;
	// the tap exists, the VMM has not opened it yet.
	Lock(vm, tap string, mac net.HardwareAddr) (nft.Lease, error)
	// Unlock removes the tap's lock and its address's pin; the VMM is gone
	// and the tap deleted.
	Unlock(vm, tap string, mac net.HardwareAddr) error
	// Door is vm's door, from memory.
	Door(vm string) (netip.AddrPort, bool)
	// Reconcile checks and repairs the locks of members at start-up and
	// removes every other lock.
	Reconcile(members []nft.Member) (nft.Report, error)
}

// Doors is executors.EgressDoors (one contract for both drivers).
type Doors = executors.EgressDoors

// Step names of the egress lane.
const (
	StepEgressLock   = "egress_lock"   // lock the tap (nftables, netlink)
	StepEgressUnlock = "egress_unlock" // remove the tap's lock
	StepDoors        = "doors"         // open the VM's proxy doors
)

func (d *Driver) guestMAC(vm string) net.HardwareAddr {
	m, err := net.ParseMAC(MAC(vm))
	if err != nil {
		panic(fmt.Sprintf("chdriver: MAC(%q) = %q: %v", vm, MAC(vm), err))
	}
	return m
}

// lockTap locks an egress VM's tap: after the tap exists, before the VMM
// can write to it. Without a lane it does nothing (taps stay open).
func (d *Driver) lockTap(r *run, vm string) error {
	if d.egress == nil {
		return nil
	}
	return r.step(StepEgressLock, func() error {
		_, err := d.egress.Lock(vm, d.tapName(vm), d.guestMAC(vm))
		return err
	})
}

// unlockTap removes the lock and frees the door port once the VMM is gone
// and the tap deleted: the driver never unlocks a tap that still exists.
func (d *Driver) unlockTap(vm string) error {
	if d.egress == nil {
		return nil
	}
	return d.egress.Unlock(vm, d.tapName(vm), d.guestMAC(vm))
}

// openDoors opens the VM's proxy doors once it runs: the TCP door of its
// lock when it is on the egress lane, else its vsock doors. A failure is
// logged, not the recipe's: the VM is sound, and without doors its guest
// reaches nothing, which is the safe side.
func (d *Driver) openDoors(r *run, vm, runDir string) {
	if d.doors == nil {
		return
	}
	_ = r.step(StepDoors, func() error {
		if err := d.openDoorsOf(vm, runDir); err != nil {
			r.log.Error().Err(err).Str("vm", vm).Msg("could not open the VM's egress proxy doors; its guest reaches nothing")
		}
		return nil
	})
}

// adoptDoors opens the doors of a VM adopted at start-up (after
// ReconcileEgress gave the lane its doors back).
func (d *Driver) adoptDoors(vm, runDir string) {
	if d.doors == nil {
		return
	}
	if err := d.openDoorsOf(vm, runDir); err != nil {
		d.log.Error().Err(err).Str("vm", vm).Msg("could not open the egress proxy doors of an adopted VM; its guest reaches nothing")
	}
}

func (d *Driver) openDoorsOf(vm, runDir string) error {
	var tcp netip.AddrPort
	if d.egress != nil {
		tcp, _ = d.egress.Door(vm)
	}
	return d.doors.Open(vm, tcp, filepath.Join(runDir, VsockFile))
}

func (d *Driver) closeDoors(vm string) {
	if d.doors != nil {
		d.doors.Close(vm)
	}
}

var _ reconcile.EgressLocker = (*Driver)(nil)

// ReconcileEgress implements reconcile.EgressLocker: the locks of the
// egress VMs among vms are checked and repaired, every other lock removed
// (after its tap, when that is still there).
// A VM whose tap cannot be locked has its VMM stopped (its guest would
// otherwise have open egress) and is listed as failed; the adoption that
// follows reports it dead.
func (d *Driver) ReconcileEgress(ctx context.Context, vms []reconcile.VMRef) (reconcile.EgressReport, error) {
	if d.egress == nil {
		return reconcile.EgressReport{}, nil
	}
	member := func(vm string) nft.Member { return nft.Member{VM: vm, Tap: d.tapName(vm), MAC: d.guestMAC(vm)} }
	stop := func(ctx context.Context, vm, runDir string) error {
		dir, err := d.roots.VMRunDir(d.instance, vm, runDir)
		if err != nil {
			return nil // not this instance's: nothing of it is touched
		}
		p, _ := d.attach(ctx, dir, vm)
		if p == nil {
			return nil // no VMM runs
		}
		return d.terminate(ctx, dir, p)
	}
	return reconcile.LockEgress(ctx, d.egress, vms, NetEgress, member, stop, d.log)
}
