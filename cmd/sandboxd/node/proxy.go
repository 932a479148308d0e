package node

// Guarded egress's enforcement: the node's egress proxy (its doors, one
// set per VM) and the egress lane (the nftables locks of the egress taps).
// Both are made in step 6, before the driver opens, and handed to a
// hypervisor that can use them (GuardedOpener); the driver then locks taps
// and opens doors as VMs are made and stopped, and the reconcile of step 7
// repairs the locks before anything is served. The proxy asks the egress
// view (egress.go, Node.Egress) about every request: the sandbox a VM
// serves, its effective policy, secrets and credentials, and it connects
// only where the view's guard admits and counts into the view's meter.

import (
	"fmt"
	"net/netip"
	"path/filepath"

	"github.com/sbxlog/sbxlog/executors/egress/nft"
	"github.com/sbxlog/sbxlog/executors/egress/proxy"
	"github.com/sbxlog/sbxlog/executors/layout"
	"github.com/sbxlog/sbxlog/projections/api"
)

// ProxyConfig configures guarded egress.
type ProxyConfig struct {
	// Bridge is the egress lane's bridge; empty: no lane (no egress pools,
	// only vsock doors).
	Bridge string
	// DoorPorts are the lane's TCP door ports (default nft.DefaultPorts).
	DoorPorts nft.PortRange
	// Intercept loads (or makes, on the first start) the node CA in
	// <data dir>/egress-ca, so rules that intercept can (and the API
	// accepts pool policies with them: Config.Egress.CanIntercept).
	Intercept bool
	// Proxy configures the proxy; the node sets its Policies, Meter and
	// Guard (the egress view's), CA and Log.
	Proxy proxy.Config
	// LaneOps, when set, replaces the lane's kernel operations (tests).
	LaneOps *nft.Ops
	// DoorAddr, when valid, is the lane's door address instead of the
	// bridge's (tests).
	DoorAddr netip.Addr
}

// Guarded is what a GuardedOpener's driver gets: the lane (nil without a
// bridge) and the proxy.
type Guarded struct {
	Lane  *nft.Lane
	Proxy *proxy.Server
}

// GuardedOpener is a Hypervisor whose driver locks egress taps and opens
// proxy doors.
type GuardedOpener interface {
	OpenGuarded(roots layout.Roots, instance string, eg Guarded) (Driver, error)
}

// ProxyCADir is where the node CA is kept, under the data dir.
const ProxyCADir = "egress-ca"

// openGuarded makes the proxy and the lane of cfg.
func (n *Node) openGuarded(cfg *ProxyConfig) (Guarded, error) {
	pc := cfg.Proxy
	if cfg.Intercept {
		ca, err := proxy.LoadOrCreateCA(filepath.Join(n.cfg.DataDir, ProxyCADir))
		if err != nil {
			return Guarded{}, fmt.Errorf("egress CA: %w", err)
		}
		pc.CA = ca
		n.cfg.Egress.CanIntercept = true
	}
	pc.Policies, pc.Meter, pc.Guard = n.Egress, n.Egress.Meter(), n.Egress.Guard()
	pc.Log = n.zl
	var eg Guarded
	if cfg.Bridge != "" {
		lane, err := nft.NewLane(nft.LaneConfig{Bridge: cfg.Bridge, Instance: n.Instance, Ports: cfg.DoorPorts, Ops: cfg.LaneOps, Addr: cfg.DoorAddr})
		if err != nil {
			return Guarded{}, err
		}
		eg.Lane = lane
	}
	eg.Proxy = proxy.New(pc)
	return eg, nil
}

// Doors adapts a proxy to the chdriver's Doors: a TCP door when the VM's
// lock has one, else the vsock doors next to its hybrid-vsock socket.
type Doors struct{ Proxy *proxy.Server }

// Open implements chdriver.Doors.
func (d Doors) Open(vm string, tcp netip.AddrPort, vsockSocket string) error {
	if tcp.IsValid() {
		return d.Proxy.Open(vm, proxy.Doors{TCP: tcp})
	}
	return d.Proxy.Open(vm, proxy.VsockDoors(vsockSocket))
}

// Close implements chdriver.Doors.
func (d Doors) Close(vm string) { d.Proxy.CloseDoors(vm) }

// openDriver opens the hypervisor's driver, with guarded egress when it is
// configured and the hypervisor can use it.
func (n *Node) openDriver(hv Hypervisor, roots layout.Roots) (Driver, error) {
	cfg := n.cfg.Proxy
	if cfg == nil {
		return hv.Open(roots, n.Instance)
	}
	eo, ok := hv.(GuardedOpener)
	if !ok {
		if cfg.Bridge != "" {
			return nil, fmt.Errorf("hypervisor %s cannot lock egress taps: remove the bridge or use cloud-hypervisor", hv.Name())
		}
		n.zl.Warn().Str("hypervisor", hv.Name()).Msg("this hypervisor opens no egress proxy doors")
		return hv.Open(roots, n.Instance)
	}
	eg, err := n.openGuarded(cfg)
	if err != nil {
		return nil, err
	}
	n.Proxy, n.Lane = eg.Proxy, eg.Lane
	ev := n.zl.Info().Bool("intercept", cfg.Intercept)
	if eg.Lane != nil {
		ev = ev.Str("bridge", cfg.Bridge).Str("door_addr", eg.Lane.Addr().String())
	}
	ev.Msg("guarded egress: proxy doors per VM; egress taps locked with nftables")
	return eo.OpenGuarded(roots, n.Instance, eg)
}

// apiEgress is guarded egress as the API needs it: the env key and the
// secret registry, whether intercept rules are possible (the CA loaded),
// and what a claim's net_route says (the lane locks egress taps; the
// proxy's doors are open).
func (n *Node) apiEgress() api.EgressOptions {
	o := api.EgressOptions{Key: n.EnvKey, Secrets: n.cfg.Egress.Secrets, CanIntercept: n.cfg.Egress.CanIntercept, Locked: n.Lane != nil}
	if p := n.Proxy; p != nil {
		o.Doors = func(vm string) bool { _, ok := p.OpenDoors(vm); return ok }
	}
	return o
}
