package main

// The egress_proxy section of the config, and the Cloud Hypervisor driver opened
// with guarded egress (node.GuardedOpener).

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/sbxlog/sbxlog/cmd/sandboxd/node"
	"github.com/sbxlog/sbxlog/executors/chdriver"
	"github.com/sbxlog/sbxlog/executors/egress/nft"
	"github.com/sbxlog/sbxlog/executors/layout"
	"github.com/sbxlog/sbxlog/executors/qemu"
)

// ProxyConfig is the egress_proxy section. Guarded egress runs whenever a bridge
// is configured (every egress tap is locked to its VM's proxy door) or the
// section is present (vsock doors for every VM).
type ProxyConfig struct {
	// DoorPorts is the egress lane's TCP door ports, "first-last" (default
	// 20000-29999: below Linux's ephemeral range).
	DoorPorts string `json:"door_ports,omitempty"`
	// Intercept makes the node CA (<data_dir>/egress-ca) so that rules may
	// intercept HTTPS; its certificate is what guests install.
	Intercept bool `json:"intercept,omitempty"`
}

func (e *ProxyConfig) ports() (nft.PortRange, error) {
	if e == nil || e.DoorPorts == "" {
		return nft.DefaultPorts, nil
	}
	a, b, ok := strings.Cut(e.DoorPorts, "-")
	first, err1 := strconv.ParseUint(a, 10, 16)
	last, err2 := strconv.ParseUint(b, 10, 16)
	if !ok || err1 != nil || err2 != nil || first == 0 || last < first {
		return nft.PortRange{}, fmt.Errorf("egress_proxy.door_ports %q: want first-last, 1 <= first <= last <= 65535", e.DoorPorts)
	}
	return nft.PortRange{First: uint16(first), Last: uint16(last)}, nil
}

// nodeProxy is the node's egress proxy configuration (nil: off).
func (c *Config) nodeProxy() (*node.ProxyConfig, error) {
	if c.Bridge == "" && c.EgressProxy == nil {
		return nil, nil
	}
	ports, err := c.EgressProxy.ports()
	if err != nil {
		return nil, err
	}
	return &node.ProxyConfig{Bridge: c.Bridge, DoorPorts: ports, Intercept: c.EgressProxy != nil && c.EgressProxy.Intercept}, nil
}

// OpenGuarded implements node.GuardedOpener for Cloud Hypervisor and chsim.
func (h chHV) OpenGuarded(roots layout.Roots, instance string, eg node.Guarded) (node.Driver, error) {
	return h.openWith(roots, instance, func(c *chdriver.Config) {
		if eg.Lane != nil {
			c.Egress = eg.Lane
		}
		if eg.Proxy != nil {
			c.Doors = node.Doors{Proxy: eg.Proxy}
		}
	})
}

// OpenGuarded implements node.GuardedOpener for QEMU: with a lane, egress
// pools run (taps locked, doors opened, the node CA given to the guests).
func (h qemuHV) OpenGuarded(roots layout.Roots, instance string, eg node.Guarded) (node.Driver, error) {
	var egress *qemu.Egress
	if eg.Lane != nil {
		egress = &qemu.Egress{Bridge: h.cfg.Bridge, Lane: eg.Lane}
		if eg.Proxy != nil {
			egress.Doors = node.Doors{Proxy: eg.Proxy}
			egress.CAPEM = eg.Proxy.CAPEM()
		}
	}
	d, err := newQEMUDriver(h.cfg, h.bin, roots, instance, egress, h.zl)
	if err != nil {
		return nil, err
	}
	return qemuNode{d}, nil
}
