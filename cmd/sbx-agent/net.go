package main

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/vishvananda/netlink"

	"github.com/sbxlog/sbxlog/executors/guest/agent"
)

// netMu serialises applications of a net config (the serial port's
// requests come one at a time; this keeps a second caller honest too).
var netMu sync.Mutex

// applyNet gives the guest the egress network of c (agent.VerbNet): the
// NIC at c.PCI gets c's MAC and only c's address, is brought up, and the
// default route goes via the door; then the trust store and the profile
// are written (agent.InstallTrust) and the agent's own environment gets
// c.Env(), which every process it starts inherits. Netlink from Go, not
// the image's ip(8): the busybox and Debian guests alike.
func applyNet(c agent.NetConfig) error {
	netMu.Lock()
	defer netMu.Unlock()
	link, err := linkByPCI(c.PCI)
	if err != nil {
		return err
	}
	mac, _ := net.ParseMAC(c.MAC)
	p, _ := netip.ParsePrefix(c.Addr)
	gw, _ := netip.ParseAddr(c.Gateway)
	if link.Attrs().HardwareAddr.String() != mac.String() {
		// The MAC changes only on a downed link (virtio-net tells the device
		// through its control queue, so QEMU's receive filter follows).
		if err := netlink.LinkSetDown(link); err != nil {
			return fmt.Errorf("link %s down: %w", link.Attrs().Name, err)
		}
		if err := netlink.LinkSetHardwareAddr(link, mac); err != nil {
			return fmt.Errorf("link %s address %s: %w", link.Attrs().Name, mac, err)
		}
	}
	addrs, err := netlink.AddrList(link, netlink.FAMILY_V4)
	if err != nil {
		return err
	}
	want := &netlink.Addr{IPNet: &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), 32)}}
	have := false
	for _, a := range addrs {
		if a.IPNet.String() == want.IPNet.String() {
			have = true
			continue
		}
		// The golden's (or the hibernated VM's old) address: the lock
		// drops anything sent from it.
		if err := netlink.AddrDel(link, &a); err != nil {
			return fmt.Errorf("link %s: remove %s: %w", link.Attrs().Name, a.IPNet, err)
		}
	}
	if !have {
		if err := netlink.AddrAdd(link, want); err != nil {
			return fmt.Errorf("link %s: add %s: %w", link.Attrs().Name, p, err)
		}
	}
	if err := netlink.LinkSetUp(link); err != nil {
		return fmt.Errorf("link %s up: %w", link.Attrs().Name, err)
	}
	if err := netlink.RouteReplace(&netlink.Route{LinkIndex: link.Attrs().Index, Gw: gw.AsSlice()}); err != nil {
		return fmt.Errorf("default route via %s: %w", gw, err)
	}
	if err := agent.InstallTrust("/", c); err != nil {
		return fmt.Errorf("trust store: %w", err)
	}
	for k, v := range c.Env() {
		if err := os.Setenv(k, v); err != nil {
			return err
		}
	}
	fmt.Fprintf(os.Stderr, "sbx-agent: egress network: %s %s on %s via %s, proxy %s\n", link.Attrs().Name, p, mac, gw, c.Proxy)
	return nil
}

// linkByPCI finds the network interface of the PCI device pci:
// /sys/class/net/<name>/device links to its device, under the PCI
// device's directory (a virtio NIC's device is the virtio device, a child
// of the PCI function: .../0000:00:10.0/virtio1).
func linkByPCI(pci string) (netlink.Link, error) {
	ents, err := os.ReadDir("/sys/class/net")
	if err != nil {
		return nil, err
	}
	for _, e := range ents {
		dev, err := filepath.EvalSymlinks(filepath.Join("/sys/class/net", e.Name(), "device"))
		if err != nil || !strings.Contains(dev+"/", "/"+pci+"/") {
			continue
		}
		return netlink.LinkByName(e.Name())
	}
	return nil, fmt.Errorf("no network interface on PCI device %s", pci)
}
