// Package tap manages the tap devices of VMs in `net: egress` pools: one persistent
// tap per VM, up and enslaved to the pool's bridge, created before the VMM opens it
// and deleted with the VM.
//
// Contract:
//   - Name(instance, vmID) derives the tap's interface name from the sandboxd
//     instance and the VM id: deterministic (a restarted daemon finds the same
//     tap), unique in practice (60 bits of SHA-256) across VMs and instances (two
//     sandboxd on one host may hold VMs of the same id: a VM id is unique in one
//     instance's log only), a valid Linux interface name of exactly 15 bytes,
//     starting with Prefix.
//   - Create(name, bridge) leaves a tap `name` up with master `bridge`. It is
//     idempotent: an existing tap already on that bridge is left as is, and a tap a
//     crashed earlier Create made but did not attach is attached and brought up. An
//     existing interface that is not a tap, or is a tap on another bridge, is
//     ErrConflict and is not touched.
//   - MAC(instance, vmID) is the MAC of the VM's NIC on its tap, derived the
//     same way (the QEMU driver's; the Cloud Hypervisor driver keeps its own,
//     from the VM id).
//   - Delete(name) removes the tap; a missing one is success. A non-tap interface of
//     that name is ErrConflict and is not removed, so a bad name never deletes
//     someone else's interface.
//
// The taps are single-queue with IFF_NO_PI|IFF_VNET_HDR, matching how Cloud
// Hypervisor opens a tap for one queue pair (its default). All calls act in the
// network namespace of the calling OS thread.
package tap

import (
	"crypto/sha256"
	"encoding/base32"
	"errors"
	"fmt"
	"net"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Prefix starts every name Name derives, so an operator (or a reconcile pass) can
// tell this daemon's taps apart.
const Prefix = "sbx"

// maxName is IFNAMSIZ-1: the kernel's limit on interface names.
const maxName = 15

var (
	// ErrInvalidName: the name cannot be a Linux interface name.
	ErrInvalidName = errors.New("tap: invalid interface name")
	// ErrConflict: an interface of that name exists and is not a tap this package
	// would have made (not a tap, or a tap on another bridge).
	ErrConflict = errors.New("tap: interface exists with another role")
	// ErrNotBridge: the named master is not a bridge.
	ErrNotBridge = errors.New("tap: master is not a bridge")
)

var nameEncoding = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// Name returns the tap name of VM vmID of the sandboxd instance.
func Name(instance, vmID string) string {
	sum := sha256.Sum256([]byte("tap/" + instance + "/" + vmID))
	return Prefix + nameEncoding.EncodeToString(sum[:])[:maxName-len(Prefix)]
}

// ValidName reports whether name is acceptable to the kernel as an interface name
// (the rules of dev_valid_name).
func ValidName(name string) error {
	if name == "" || len(name) > maxName || name == "." || name == ".." ||
		strings.ContainsAny(name, "/: \t\n\v\f\r") {
		return fmt.Errorf("%w: %q", ErrInvalidName, name)
	}
	return nil
}

func notFound(err error) bool {
	var nf netlink.LinkNotFoundError
	return errors.As(err, &nf)
}

// Create makes (or finishes making) tap `name` on `bridge`; see the package doc.
func Create(name, bridge string) error {
	if err := ValidName(name); err != nil {
		return err
	}
	br, err := netlink.LinkByName(bridge)
	if err != nil {
		return fmt.Errorf("tap: bridge %q: %w", bridge, err)
	}
	if _, ok := br.(*netlink.Bridge); !ok {
		return fmt.Errorf("%w: %q is %s", ErrNotBridge, bridge, br.Type())
	}
	link, err := netlink.LinkByName(name)
	switch {
	case err == nil:
		if err := ownTap(link); err != nil {
			return err
		}
	case notFound(err):
		t := &netlink.Tuntap{
			LinkAttrs: netlink.LinkAttrs{Name: name},
			Mode:      netlink.TUNTAP_MODE_TAP,
			// TUN_EXCL: if another creator won a race for the name, fail rather
			// than silently share its device.
			Flags: netlink.TUNTAP_NO_PI | netlink.TUNTAP_VNET_HDR | netlink.TUNTAP_TUN_EXCL | netlink.TUNTAP_ONE_QUEUE,
		}
		if err := netlink.LinkAdd(t); err != nil {
			return fmt.Errorf("tap: create %s: %w", name, err)
		}
		if link, err = netlink.LinkByName(name); err != nil {
			return fmt.Errorf("tap: created %s but cannot find it: %w", name, err)
		}
	default:
		return fmt.Errorf("tap: look up %s: %w", name, err)
	}
	switch m := link.Attrs().MasterIndex; m {
	case br.Attrs().Index:
	case 0:
		if err := netlink.LinkSetMaster(link, br); err != nil {
			return fmt.Errorf("tap: attach %s to %s: %w", name, bridge, err)
		}
	default:
		return fmt.Errorf("%w: tap %s is attached to ifindex %d, not bridge %s", ErrConflict, name, m, bridge)
	}
	if err := netlink.LinkSetUp(link); err != nil {
		return fmt.Errorf("tap: up %s: %w", name, err)
	}
	return nil
}

// ownTap reports ErrConflict unless link is a tap device.
func ownTap(link netlink.Link) error {
	t, ok := link.(*netlink.Tuntap)
	if !ok {
		return fmt.Errorf("%w: %s is a %s device, not a tap", ErrConflict, link.Attrs().Name, link.Type())
	}
	if t.Mode != netlink.TUNTAP_MODE_TAP {
		return fmt.Errorf("%w: %s is a %s device, not a tap", ErrConflict, t.Name, t.Mode)
	}
	return nil
}

// Delete removes tap `name`; see the package doc.
func Delete(name string) error {
	if err := ValidName(name); err != nil {
		return err
	}
	link, err := netlink.LinkByName(name)
	if notFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("tap: look up %s: %w", name, err)
	}
	if err := ownTap(link); err != nil {
		return err
	}
	if err := netlink.LinkDel(link); err != nil {
		if notFound(err) || errors.Is(err, unix.ENODEV) {
			return nil // deleted concurrently
		}
		return fmt.Errorf("tap: delete %s: %w", name, err)
	}
	return nil
}

// MAC returns the MAC of the NIC VM vmID of the sandboxd instance has on its
// tap: locally administered, unicast, derived like Name, so clones of one
// golden (whose memory holds the golden's MAC until the host gives them
// theirs) and VMs of one id in two instances never share one on the
// bridge, whose forwarding database learns ports by MAC.
func MAC(instance, vmID string) net.HardwareAddr {
	sum := sha256.Sum256([]byte("mac/" + instance + "/" + vmID))
	return net.HardwareAddr{0x02, sum[0], sum[1], sum[2], sum[3], sum[4]}
}

// Maker creates and deletes taps: Kernel, or a test's fake. The drivers
// take one.
type Maker interface {
	Create(name, bridge string) error
	Delete(name string) error
}

// Kernel is the Maker of this package's functions.
type Kernel struct{}

// Create implements Maker with Create.
func (Kernel) Create(name, bridge string) error { return Create(name, bridge) }

// Delete implements Maker with Delete.
func (Kernel) Delete(name string) error { return Delete(name) }
