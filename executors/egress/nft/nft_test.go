package nft

import (
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/sbxlog/sbxlog/executors/egress/netnstest"
)

var guestMAC = net.HardwareAddr{0x02, 0xaa, 0xbb, 0xcc, 0xdd, 0x01}

// owner is the instance the tests' tables belong to.
var owner = OwnerOf("i-nfttest")

// echo serves ln, answering every connection with "hi" and closing it.
func echo(t *testing.T, ln net.Listener) {
	t.Helper()
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte("hi"))
			c.Close()
		}
	}()
}

// reach reports whether the guest gets "hi" from addr within d.
func reach(g *netnstest.Guest, addr string, d time.Duration) bool {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	c, err := g.DialContext(ctx, "tcp", addr)
	if err != nil {
		return false
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(d))
	b, _ := io.ReadAll(c)
	return string(b) == "hi"
}

// forgetNeighbours empties g's neighbour table, so its next packet ARPs.
func forgetNeighbours(t *testing.T, g *netnstest.Guest) {
	t.Helper()
	g.MustDo(t, func() error {
		ns, err := Dumped(func() ([]netlink.Neigh, error) { return netlink.NeighList(0, netlink.FAMILY_V4) })
		if err != nil {
			return err
		}
		for _, n := range ns {
			if err := netlink.NeighDel(&n); err != nil {
				return err
			}
		}
		return nil
	})
}

// takeLease moves g to the address its lane leased it.
func takeLease(t *testing.T, g *netnstest.Guest, ls Lease) {
	t.Helper()
	g.Readdress(t, ls.Guest, ls.Door.Addr())
}

func inspectIn(t *testing.T, ns *netnstest.NS, tap string) State {
	t.Helper()
	var st State
	ns.MustDo(t, func() error {
		var err error
		st, err = owner.Inspect(tap)
		return err
	})
	return st
}

// TestLockFiltersGuest: with a lock, the guest reaches its door and nothing
// else (another port of the host, another address, a spoofed MAC), and each
// refused attempt moves a drop counter; without one it reaches everything.
func TestLockFiltersGuest(t *testing.T) {
	lane := netnstest.NewLane(t)
	g := lane.AddGuest(t, 1, "sbxtest0000001", guestMAC)
	door := netip.AddrPortFrom(lane.HostAddr, 20001)
	for _, a := range []string{door.String(), lane.HostAddr.String() + ":20002"} {
		ln, err := lane.Host.Listen("tcp", a)
		if err != nil {
			t.Fatal(err)
		}
		echo(t, ln)
	}
	other := lane.HostAddr.String() + ":20002"
	if !reach(g, door.String(), 2*time.Second) || !reach(g, other, 2*time.Second) {
		t.Fatal("the guest does not reach the host before any lock")
	}

	l := Lock{Tap: g.Tap, GuestMAC: guestMAC, GuestIP: g.Addr, Door: door, DoorMAC: lane.BridgeMAC(t)}
	lane.Host.MustDo(t, func() error { return owner.Install(l) })
	st := inspectIn(t, lane.Host, g.Tap)
	if !st.OK || !st.Lock.Equal(l) {
		t.Fatalf("inspect after install: %+v, want OK with %s", st, l)
	}
	// The guest forgets the door's MAC: it must ARP through the lock.
	forgetNeighbours(t, g)
	if !reach(g, door.String(), 2*time.Second) {
		t.Fatal("the guest does not reach its door through the lock")
	}
	before := inspectIn(t, lane.Host, g.Tap).Counters
	if before[RoleDoor].Packets == 0 || before[RoleARP].Packets == 0 {
		t.Fatalf("door/arp counters did not move: %+v", before)
	}
	if reach(g, other, 500*time.Millisecond) {
		t.Fatal("the guest reached another port of the host through the lock")
	}
	after := inspectIn(t, lane.Host, g.Tap).Counters
	if after.Dropped().Packets <= before.Dropped().Packets {
		t.Fatalf("drop counter did not move on a bypass attempt: %+v -> %+v", before.Dropped(), after.Dropped())
	}

	// A spoofed source MAC is dropped before anything else.
	g.SetMAC(t, "eth0", net.HardwareAddr{0x02, 0, 0, 0, 0, 0x66})
	if reach(g, door.String(), 500*time.Millisecond) {
		t.Fatal("a spoofed MAC reached the door")
	}
	if c := inspectIn(t, lane.Host, g.Tap).Counters[RoleSpoof]; c.Packets == 0 {
		t.Fatal("spoof counter did not move")
	}
	g.SetMAC(t, "eth0", guestMAC)

	// Removing the lock opens the tap again; removing twice is fine.
	lane.Host.MustDo(t, func() error { return owner.Remove(g.Tap) })
	lane.Host.MustDo(t, func() error { return owner.Remove(g.Tap) })
	lane.Host.MustDo(t, func() error {
		if _, err := owner.Inspect(g.Tap); !errors.Is(err, ErrNotLocked) {
			t.Errorf("inspect after remove: %v, want ErrNotLocked", err)
		}
		return nil
	})
	if !reach(g, other, 2*time.Second) {
		t.Fatal("the guest does not reach the host after the lock was removed")
	}
}

// TestLockDropsDHCP: a guest's DHCP broadcast (UDP 68 to
// 255.255.255.255:67) reaches the host without a lock and is dropped by one,
// moving the drop counter: guests' addresses are static, so a lock admits no
// DHCP (the bridge would flood it to every port).
func TestLockDropsDHCP(t *testing.T) {
	lane := netnstest.NewLane(t)
	g := lane.AddGuest(t, 1, "sbxdhcp0000001", guestMAC)
	var srv, cli net.PacketConn
	lane.Host.MustDo(t, func() error {
		var err error
		srv, err = net.ListenPacket("udp4", ":67")
		return err
	})
	t.Cleanup(func() { srv.Close() })
	g.MustDo(t, func() error {
		lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
			var serr error
			err := c.Control(func(fd uintptr) {
				if serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_BROADCAST, 1); serr == nil {
					serr = unix.BindToDevice(int(fd), "eth0")
				}
			})
			return errors.Join(err, serr)
		}}
		var err error
		cli, err = lc.ListenPacket(context.Background(), "udp4", ":68")
		return err
	})
	t.Cleanup(func() { cli.Close() })
	discover := func(d time.Duration) bool {
		if _, err := cli.WriteTo([]byte("discover"), &net.UDPAddr{IP: net.IPv4bcast, Port: 67}); err != nil {
			t.Fatal(err)
		}
		_ = srv.SetReadDeadline(time.Now().Add(d))
		buf := make([]byte, 64)
		n, _, err := srv.ReadFrom(buf)
		return err == nil && string(buf[:n]) == "discover"
	}
	if !discover(2 * time.Second) {
		t.Fatal("the guest's DHCP broadcast does not reach the host before any lock")
	}
	l := Lock{Tap: g.Tap, GuestMAC: guestMAC, GuestIP: g.Addr, Door: netip.AddrPortFrom(lane.HostAddr, 20001), DoorMAC: lane.BridgeMAC(t)}
	lane.Host.MustDo(t, func() error { return owner.Install(l) })
	before := inspectIn(t, lane.Host, g.Tap).Counters.Dropped()
	if discover(500 * time.Millisecond) {
		t.Fatal("a DHCP broadcast got through the lock")
	}
	if after := inspectIn(t, lane.Host, g.Tap).Counters.Dropped(); after.Packets <= before.Packets {
		t.Fatalf("drop counter did not move on a DHCP broadcast: %+v -> %+v", before, after)
	}
}

// TestInspectFindsTampering: a rule removed, a chain policy changed or a
// lock for another door are all reported as not OK, and Install repairs
// them; Tables lists only this package's tables.
func TestInspectFindsTampering(t *testing.T) {
	lane := netnstest.NewLane(t)
	g := lane.AddGuest(t, 1, "sbxtest0000002", guestMAC)
	l := Lock{Tap: g.Tap, GuestMAC: guestMAC, GuestIP: g.Addr, Door: netip.AddrPortFrom(lane.HostAddr, 20001), DoorMAC: lane.BridgeMAC(t)}
	tamper := map[string]func(c *nftables.Conn) error{
		"rule deleted": func(c *nftables.Conn) error {
			tb := owner.table(l.Tap)
			rules, err := c.GetRules(tb, &nftables.Chain{Name: ChainName, Table: tb})
			if err != nil {
				return err
			}
			if err := c.DelRule(rules[3]); err != nil {
				return err
			}
			return c.Flush()
		},
		"policy accept": func(c *nftables.Conn) error {
			tb := owner.table(l.Tap)
			ch := chain(tb, l.Tap)
			accept := nftables.ChainPolicyAccept
			ch.Policy = &accept
			c.AddChain(ch)
			return c.Flush()
		},
		"other door": func(*nftables.Conn) error {
			o := l
			o.Door = netip.AddrPortFrom(lane.HostAddr, 20009)
			return owner.Install(o)
		},
	}
	for name, f := range tamper {
		lane.Host.MustDo(t, func() error { return owner.Install(l) })
		lane.Host.MustDo(t, func() error {
			c, err := nftables.New()
			if err != nil {
				return err
			}
			return f(c)
		})
		st := inspectIn(t, lane.Host, g.Tap)
		if name == "other door" {
			if !st.OK || st.Lock.Equal(l) {
				t.Fatalf("%s: %+v, want an OK lock of another door", name, st)
			}
		} else if st.OK || st.Problem == "" {
			t.Fatalf("%s: inspect says OK: %+v", name, st)
		}
		lane.Host.MustDo(t, func() error { return owner.Install(l) })
		if st := inspectIn(t, lane.Host, g.Tap); !st.OK || !st.Lock.Equal(l) {
			t.Fatalf("%s: not repaired: %+v", name, st)
		}
	}

	// A foreign table is not listed.
	lane.Host.MustDo(t, func() error {
		c, err := nftables.New()
		if err != nil {
			return err
		}
		c.AddTable(&nftables.Table{Name: "someone_else", Family: nftables.TableFamilyNetdev})
		return c.Flush()
	})
	lane.Host.MustDo(t, func() error {
		all, err := owner.Tables()
		if err != nil {
			return err
		}
		if len(all) != 1 || !all[g.Tap].OK {
			t.Errorf("tables: %+v, want just %s", all, g.Tap)
		}
		return nil
	})
}

func TestValidateAndRuleset(t *testing.T) {
	good := Lock{Tap: "sbxabc", GuestMAC: guestMAC, GuestIP: netip.MustParseAddr("10.0.0.7"), Door: netip.MustParseAddrPort("10.0.0.1:3128"), DoorMAC: guestMAC}
	if err := good.Validate(); err != nil {
		t.Fatal(err)
	}
	for name, mut := range map[string]func(*Lock){
		"no tap":    func(l *Lock) { l.Tap = "" },
		"long tap":  func(l *Lock) { l.Tap = strings.Repeat("x", 16) },
		"bad mac":   func(l *Lock) { l.GuestMAC = nil },
		"no ip":     func(l *Lock) { l.GuestIP = netip.Addr{} },
		"ipv6 ip":   func(l *Lock) { l.GuestIP = netip.MustParseAddr("fd00::7") },
		"door mac":  func(l *Lock) { l.DoorMAC = net.HardwareAddr{1} },
		"ipv6 door": func(l *Lock) { l.Door = netip.MustParseAddrPort("[::1]:3128") },
		"port 0":    func(l *Lock) { l.Door = netip.MustParseAddrPort("10.0.0.1:0") },
	} {
		l := good
		mut(&l)
		if err := l.Validate(); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, err)
		}
	}
	rs := owner.Ruleset(good)
	for _, want := range []string{"table netdev sbx_egress_" + owner.Tag() + "_sbxabc", `device "sbxabc"`, "policy drop", "tcp dport 3128", "ip daddr 10.0.0.1", "arp saddr ip 10.0.0.7", "ip saddr 10.0.0.7"} {
		if !strings.Contains(rs, want) {
			t.Errorf("ruleset lacks %q:\n%s", want, rs)
		}
	}
}

// TestGuardKeepsDoorsToTaps: a bridge port that is not a VM tap reaches no
// door port (its other ports it still does); a tap reaches its door.
func TestGuardKeepsDoorsToTaps(t *testing.T) {
	lane := netnstest.NewLane(t)
	tapGuest := lane.AddGuest(t, 1, "sbxguard000001", guestMAC)
	other := lane.AddGuest(t, 2, "uplink0", net.HardwareAddr{0x02, 0xaa, 0xbb, 0xcc, 0xdd, 0x02})
	door, svc := lane.HostAddr.String()+":20001", lane.HostAddr.String()+":8080"
	for _, a := range []string{door, svc} {
		ln, err := lane.Host.Listen("tcp", a)
		if err != nil {
			t.Fatal(err)
		}
		echo(t, ln)
	}
	if !reach(other, door, 2*time.Second) {
		t.Fatal("no reach before the guard")
	}
	g := Guard{Bridge: lane.Bridge, Addr: lane.HostAddr, Ports: PortRange{First: 20000, Last: 20010}, TapPrefix: "sbx"}
	lane.Host.MustDo(t, func() error { return owner.InstallGuard(g) })
	lane.Host.MustDo(t, func() error { return owner.InstallGuard(g) }) // replaces
	if !reach(tapGuest, door, 2*time.Second) {
		t.Fatal("a tap does not reach the door through the guard")
	}
	if reach(other, door, 500*time.Millisecond) {
		t.Fatal("a bridge port that is not a tap reached a door")
	}
	if !reach(other, svc, 2*time.Second) {
		t.Fatal("the guard closed a port outside the door range")
	}
	lane.Host.MustDo(t, func() error {
		c, err := owner.GuardDrops()
		if err == nil && c.Packets == 0 {
			t.Error("guard counter did not move")
		}
		return err
	})
}

// TestLockPinsGuestAddress: a lane's locks pin each guest to the address
// it leased. A guest that takes another's address (as its source and in
// its ARP) reaches nothing, not even its own door, and moves its drop
// counter; the host's neighbour entry of the address stays permanent at
// its owner's MAC, so the owner keeps reaching its door.
func TestLockPinsGuestAddress(t *testing.T) {
	lane := netnstest.NewLane(t)
	ga := lane.AddGuest(t, 1, "sbxpina000001", mac(1))
	gb := lane.AddGuest(t, 2, "sbxpinb000001", mac(2))
	var l *Lane
	var la, lb Lease
	lane.Host.MustDo(t, func() error {
		var err error
		if l, err = NewLane(LaneConfig{Bridge: lane.Bridge, Instance: "i-nfttest", Ports: PortRange{First: 20001, Last: 20002}}); err != nil {
			return err
		}
		if la, err = l.Lock("vm-a", ga.Tap, ga.MAC); err != nil {
			return err
		}
		lb, err = l.Lock("vm-b", gb.Tap, gb.MAC)
		return err
	})
	if la.Guest.Addr() == lb.Guest.Addr() || !lane.Subnet.Contains(la.Guest.Addr()) || la.Guest.Bits() != 24 {
		t.Fatalf("leases %+v %+v", la, lb)
	}
	for _, d := range []netip.AddrPort{la.Door, lb.Door} {
		ln, err := lane.Host.Listen("tcp", d.String())
		if err != nil {
			t.Fatal(err)
		}
		echo(t, ln)
	}
	takeLease(t, ga, la)
	takeLease(t, gb, lb)
	if !reach(ga, la.Door.String(), 2*time.Second) || !reach(gb, lb.Door.String(), 2*time.Second) {
		t.Fatal("the guests do not reach their doors on their leased addresses")
	}
	pinnedTo := func(ip netip.Addr) net.HardwareAddr {
		var m net.HardwareAddr
		lane.Host.MustDo(t, func() error {
			p, err := Pins(lane.Bridge)
			m = p[ip]
			return err
		})
		return m
	}
	if got := pinnedTo(la.Guest.Addr()); !slices.Equal(got, ga.MAC) {
		t.Fatalf("a's address pinned to %s, want %s", got, ga.MAC)
	}
	before := inspectIn(t, lane.Host, gb.Tap).Counters.Dropped()
	// B takes A's address.
	gb.Readdress(t, la.Guest, lane.HostAddr)
	forgetNeighbours(t, gb)
	if reach(gb, lb.Door.String(), 500*time.Millisecond) || reach(gb, la.Door.String(), 500*time.Millisecond) {
		t.Fatal("a guest on another guest's address reached a door")
	}
	if after := inspectIn(t, lane.Host, gb.Tap).Counters.Dropped(); after.Packets <= before.Packets {
		t.Fatalf("the spoofer's drop counter did not move: %+v -> %+v", before, after)
	}
	if got := pinnedTo(la.Guest.Addr()); !slices.Equal(got, ga.MAC) {
		t.Fatalf("after the spoof, a's address points at %s, want %s", got, ga.MAC)
	}
	forgetNeighbours(t, ga)
	if !reach(ga, la.Door.String(), 2*time.Second) {
		t.Fatal("the owner of the address lost its door to a spoofer")
	}
	// Unlock unpins (the tap first, as the drivers do).
	lane.Host.MustDo(t, func() error { return l.Unlock("vm-a", ga.Tap, ga.MAC) })
	if got := pinnedTo(la.Guest.Addr()); got != nil {
		t.Fatalf("unlocked, a's address is still pinned to %s", got)
	}
}

// TestGuardRefusesLocalConnections: with the guard, a connection to a door
// port of the door address that does not come through the bridge (one from
// the host itself) is reset by the kernel, counted; a port outside the door
// range is not touched, and a tap's guest still reaches its door.
func TestGuardRefusesLocalConnections(t *testing.T) {
	lane := netnstest.NewLane(t)
	g := lane.AddGuest(t, 1, "sbxlocal00001", guestMAC)
	door, svc := lane.HostAddr.String()+":20001", lane.HostAddr.String()+":8080"
	for _, a := range []string{door, svc} {
		ln, err := lane.Host.Listen("tcp", a)
		if err != nil {
			t.Fatal(err)
		}
		echo(t, ln)
	}
	hostReach := func(addr string) (bool, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		c, err := lane.Host.DialContext(ctx, "tcp", addr)
		if err != nil {
			return false, err
		}
		c.Close()
		return true, nil
	}
	if ok, err := hostReach(door); !ok {
		t.Fatalf("the host does not reach the door before the guard: %v", err)
	}
	gd := Guard{Bridge: lane.Bridge, Addr: lane.HostAddr, Ports: PortRange{First: 20000, Last: 20010}, TapPrefix: "sbx"}
	lane.Host.MustDo(t, func() error { return owner.InstallGuard(gd) })
	if ok, err := hostReach(door); ok || !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("a local connection to a door: reached %v, %v; want refused by the kernel", ok, err)
	}
	if ok, err := hostReach(svc); !ok {
		t.Fatalf("the guard refused a port outside the door range: %v", err)
	}
	if !reach(g, door, 2*time.Second) {
		t.Fatal("a tap's guest does not reach the door through the guard")
	}
	lane.Host.MustDo(t, func() error {
		c, err := owner.LocalRefusals()
		if err == nil && c.Packets == 0 {
			t.Error("the refusal counter did not move")
		}
		return err
	})
}
