// Package netnstest gives tests network namespaces to stand in for a host and
// its guests: each NS is a fresh namespace held by one OS thread, with
// loopback up, that every call made through it runs on; veth pairs join two
// of them. A namespace and everything a test left in it (links, nftables
// tables, sockets' routes) disappear when its thread retires in t.Cleanup,
// so nothing reaches the machine's own namespace.
//
// Namespaces need root. Without it the test is skipped with the reason,
// unless SBX_REQUIRE_NETNS=1 (set by CI), which turns the skip into a
// failure so CI can never pass by silently not running them.
package netnstest

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// TB is what the helpers need of a test: testing.TB, or a benchmark's
// stand-in (Runner).
type TB interface {
	Helper()
	Fatalf(format string, args ...any)
	Skip(args ...any)
	Cleanup(func())
}

// RequireEnv is the variable that turns skips into failures.
const RequireEnv = "SBX_REQUIRE_NETNS"

// Unavailable skips t with the reason, or fails it when SBX_REQUIRE_NETNS=1.
func Unavailable(t TB, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if os.Getenv(RequireEnv) == "1" {
		t.Fatalf("%s (required: %s=1)", msg, RequireEnv)
	}
	t.Skip(msg)
}

// Require skips (or fails, see Unavailable) t unless network namespaces can
// be made: it runs as root and unshare(CLONE_NEWNET) works.
func Require(t TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		Unavailable(t, "netnstest: network namespaces need root (euid %d)", os.Geteuid())
	}
}

// NS is a network namespace held by one locked OS thread.
type NS struct {
	Name  string
	calls chan func()
	done  chan struct{}
	path  string
}

// New makes a namespace with loopback up. Name is for messages only.
func New(t TB, name string) *NS {
	t.Helper()
	Require(t)
	n := &NS{Name: name, calls: make(chan func()), done: make(chan struct{})}
	ready := make(chan error, 1)
	go func() {
		// Never unlocked: when this goroutine ends the runtime retires the
		// thread, and the namespace with it (its last reference).
		runtime.LockOSThread()
		defer close(n.done)
		ns, err := netns.New()
		if err != nil {
			ready <- fmt.Errorf("new netns: %w", err)
			return
		}
		defer ns.Close()
		n.path = fmt.Sprintf("/proc/%d/task/%d/ns/net", os.Getpid(), unix.Gettid())
		lo, err := netlink.LinkByName("lo")
		if err == nil {
			err = netlink.LinkSetUp(lo)
		}
		ready <- err
		for f := range n.calls {
			f()
		}
	}()
	if err := <-ready; err != nil {
		Unavailable(t, "netnstest: %s: %v", name, err)
	}
	t.Cleanup(func() { close(n.calls); <-n.done })
	return n
}

// Do runs f on the namespace's thread.
func (n *NS) Do(f func() error) error {
	errc := make(chan error, 1)
	n.calls <- func() { errc <- f() }
	return <-errc
}

// Path is the namespace's file (for nsenter --net=, or setns).
func (n *NS) Path() string { return n.path }

// MustDo runs f on the namespace's thread and fails t on error.
func (n *NS) MustDo(t TB, f func() error) {
	t.Helper()
	if err := n.Do(f); err != nil {
		t.Fatalf("%s: %v", n.Name, err)
	}
}

// DialContext opens a connection from inside the namespace: the socket is
// made on its thread and stays in it whichever thread later uses it.
func (n *NS) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	var c net.Conn
	err := n.Do(func() error {
		var d net.Dialer
		var err error
		c, err = d.DialContext(ctx, network, addr)
		return err
	})
	return c, err
}

// Listen listens inside the namespace.
func (n *NS) Listen(network, addr string) (net.Listener, error) {
	var ln net.Listener
	err := n.Do(func() error {
		var err error
		ln, err = net.Listen(network, addr)
		return err
	})
	return ln, err
}

// AddrAdd gives link name the address prefix (e.g. 10.9.0.1/24) and brings it up.
func (n *NS) AddrAdd(t TB, name string, prefix netip.Prefix) {
	t.Helper()
	n.MustDo(t, func() error {
		l, err := netlink.LinkByName(name)
		if err != nil {
			return err
		}
		a := &netlink.Addr{IPNet: &net.IPNet{IP: prefix.Addr().AsSlice(), Mask: net.CIDRMask(prefix.Bits(), prefix.Addr().BitLen())}}
		if err := netlink.AddrAdd(l, a); err != nil {
			return fmt.Errorf("addr add %s %s: %w", name, prefix, err)
		}
		return netlink.LinkSetUp(l)
	})
}

// RouteDefault routes everything not on a link via gw.
func (n *NS) RouteDefault(t TB, gw netip.Addr) {
	t.Helper()
	n.MustDo(t, func() error {
		return netlink.RouteAdd(&netlink.Route{Gw: gw.AsSlice()})
	})
}

// Veth makes a veth pair, aName in a and bName in b, both up.
func Veth(t TB, a *NS, aName string, b *NS, bName string) {
	t.Helper()
	var bFd int
	b.MustDo(t, func() error {
		h, err := netns.Get()
		if err != nil {
			return err
		}
		bFd = int(h)
		return nil
	})
	defer unix.Close(bFd)
	a.MustDo(t, func() error {
		v := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: aName}, PeerName: bName, PeerNamespace: netlink.NsFd(bFd)}
		if err := netlink.LinkAdd(v); err != nil {
			return fmt.Errorf("veth %s/%s: %w", aName, bName, err)
		}
		l, err := netlink.LinkByName(aName)
		if err != nil {
			return err
		}
		return netlink.LinkSetUp(l)
	})
	b.MustDo(t, func() error {
		l, err := netlink.LinkByName(bName)
		if err != nil {
			return err
		}
		return netlink.LinkSetUp(l)
	})
}

// Bridge makes bridge name in n, up, with the address prefix when valid.
func (n *NS) Bridge(t TB, name string, prefix netip.Prefix) {
	t.Helper()
	n.MustDo(t, func() error {
		if err := netlink.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: name}}); err != nil {
			return fmt.Errorf("bridge %s: %w", name, err)
		}
		l, err := netlink.LinkByName(name)
		if err != nil {
			return err
		}
		return netlink.LinkSetUp(l)
	})
	if prefix.IsValid() {
		n.AddrAdd(t, name, prefix)
	}
}

// Enslave attaches link to bridge.
func (n *NS) Enslave(t TB, link, bridge string) {
	t.Helper()
	n.MustDo(t, func() error {
		l, err := netlink.LinkByName(link)
		if err != nil {
			return err
		}
		br, err := netlink.LinkByName(bridge)
		if err != nil {
			return err
		}
		return netlink.LinkSetMaster(l, br)
	})
}

// SetMAC sets link's hardware address.
func (n *NS) SetMAC(t TB, link string, mac net.HardwareAddr) {
	t.Helper()
	n.MustDo(t, func() error {
		l, err := netlink.LinkByName(link)
		if err != nil {
			return err
		}
		return netlink.LinkSetHardwareAddr(l, mac)
	})
}

// Lane is the test stand-in of an egress lane: a host namespace with a
// bridge holding the door address, and guests, each its own namespace on
// the guest end of a veth whose host end is a bridge port (the VM's tap: its
// ingress sees what the guest sends, as a tap's sees what the VMM writes).
type Lane struct {
	Host   *NS
	Bridge string
	// HostAddr is the bridge's address (the door's), in Subnet.
	HostAddr netip.Addr
	Subnet   netip.Prefix
}

// Guest is one guest on a Lane.
type Guest struct {
	*NS
	// Tap is the host end of its veth, on the bridge.
	Tap  string
	MAC  net.HardwareAddr
	Addr netip.Addr
}

// NewLane makes the host namespace with bridge sbxbr0 at 10.77.0.1/24.
func NewLane(t TB) *Lane {
	t.Helper()
	l := &Lane{Host: New(t, "host"), Bridge: "sbxbr0", Subnet: netip.MustParsePrefix("10.77.0.0/24"), HostAddr: netip.MustParseAddr("10.77.0.1")}
	l.Host.Bridge(t, l.Bridge, netip.PrefixFrom(l.HostAddr, 24))
	return l
}

// BridgeMAC is the bridge's hardware address (the door's L2 address).
func (l *Lane) BridgeMAC(t TB) net.HardwareAddr {
	t.Helper()
	var mac net.HardwareAddr
	l.Host.MustDo(t, func() error {
		br, err := netlink.LinkByName(l.Bridge)
		if err != nil {
			return err
		}
		mac = br.Attrs().HardwareAddr
		return nil
	})
	return mac
}

// AddGuest puts guest number i (1..200) on the lane: tap is the host end's
// name, mac the guest NIC's, its address 10.77.0.(i+1) with the bridge as
// its default route.
func (l *Lane) AddGuest(t TB, i int, tap string, mac net.HardwareAddr) *Guest {
	t.Helper()
	g := &Guest{NS: New(t, fmt.Sprintf("guest%d", i)), Tap: tap, MAC: mac, Addr: netip.AddrFrom4([4]byte{10, 77, 0, byte(i + 1)})}
	Veth(t, l.Host, tap, g.NS, "eth0")
	l.Host.Enslave(t, tap, l.Bridge)
	g.SetMAC(t, "eth0", mac)
	g.AddrAdd(t, "eth0", netip.PrefixFrom(g.Addr, 24))
	g.RouteDefault(t, l.HostAddr)
	return g
}

// Internet makes the namespace "internet" beside the lane's host one, for
// upstreams the egress proxy may reach (its guard refuses the host's own
// addresses): on a veth whose host end, wan0, has address wan, and whose
// end in it, eth0, has addrs.
func (l *Lane) Internet(t TB, wan netip.Prefix, addrs ...netip.Prefix) *NS {
	t.Helper()
	inet := New(t, "internet")
	Veth(t, l.Host, "wan0", inet, "eth0")
	l.Host.AddrAdd(t, "wan0", wan)
	for _, a := range addrs {
		inet.AddrAdd(t, "eth0", a)
	}
	return inet
}

// Readdress moves the guest to address p (its old one removed), routed
// via gw: the address a lane leased it.
func (g *Guest) Readdress(t TB, p netip.Prefix, gw netip.Addr) {
	t.Helper()
	if p.Addr() == g.Addr {
		return
	}
	// The old address goes first: a second one in its subnet would be
	// secondary, and removing the primary removes its secondaries.
	old := netip.PrefixFrom(g.Addr, p.Bits())
	g.MustDo(t, func() error {
		l, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		a := &netlink.Addr{IPNet: &net.IPNet{IP: old.Addr().AsSlice(), Mask: net.CIDRMask(old.Bits(), 32)}}
		if err := netlink.AddrDel(l, a); err != nil {
			return fmt.Errorf("addr del %s: %w", old, err)
		}
		return nil
	})
	g.AddrAdd(t, "eth0", p)
	g.MustDo(t, func() error { return netlink.RouteReplace(&netlink.Route{Gw: gw.AsSlice()}) })
	g.Addr = p.Addr()
}

// Runner is a TB for code that is not a test (benchmarks): Fatalf and Skip
// end Run with the error, Cleanup runs at its end.
type Runner struct {
	cleanups []func()
}

type runnerStop struct{ err error }

func (*Runner) Helper() {}

// Fatalf ends Run with the error.
func (*Runner) Fatalf(format string, args ...any) { panic(runnerStop{fmt.Errorf(format, args...)}) }

// Skip ends Run with the reason as its error.
func (*Runner) Skip(args ...any) { panic(runnerStop{fmt.Errorf("%s", fmt.Sprint(args...))}) }

// Cleanup registers f, run (last first) when Run returns.
func (r *Runner) Cleanup(f func()) { r.cleanups = append(r.cleanups, f) }

// Run calls f with a fresh Runner and returns its error, or the one a
// Fatalf or Skip ended it with, after the cleanups.
func Run(f func(r *Runner) error) (err error) {
	r := &Runner{}
	defer func() {
		for i := len(r.cleanups) - 1; i >= 0; i-- {
			r.cleanups[i]()
		}
	}()
	defer func() {
		if v := recover(); v != nil {
			s, ok := v.(runnerStop)
			if !ok {
				panic(v)
			}
			err = s.err
		}
	}()
	return f(r)
}
