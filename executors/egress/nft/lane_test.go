package nft

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/sbxlog/sbxlog/executors/egress/netnstest"
)

// fakeKernel is Ops over a map: the tables and taps a test says exist.
type fakeKernel struct {
	mu        sync.Mutex
	tables    map[string]State
	taps      map[string]bool
	isolated  map[string]bool
	failOn    string // tap whose Install fails
	noIsolate string // tap whose Isolate fails
	noDelete  string // tap whose DeleteTap fails
	install   int
	pins      map[netip.Addr]net.HardwareAddr
}

func newFakeKernel() *fakeKernel {
	return &fakeKernel{tables: map[string]State{}, taps: map[string]bool{}, isolated: map[string]bool{}, pins: map[netip.Addr]net.HardwareAddr{}}
}

func (k *fakeKernel) ops() *Ops {
	return &Ops{
		Install: func(l Lock) error {
			k.mu.Lock()
			defer k.mu.Unlock()
			if l.Tap == k.failOn {
				return errors.New("injected")
			}
			if !k.taps[l.Tap] {
				return fmt.Errorf("no device %s", l.Tap)
			}
			k.install++
			k.tables[l.Tap] = State{Tap: l.Tap, Lock: l, OK: true}
			return nil
		},
		Remove: func(tap string) error {
			k.mu.Lock()
			defer k.mu.Unlock()
			delete(k.tables, tap)
			return nil
		},
		Tables: func() (map[string]State, error) {
			k.mu.Lock()
			defer k.mu.Unlock()
			out := map[string]State{}
			for t, s := range k.tables {
				out[t] = s
			}
			return out, nil
		},
		TapExists: func(tap string) (bool, error) {
			k.mu.Lock()
			defer k.mu.Unlock()
			return k.taps[tap], nil
		},
		Isolate: func(tap string) error {
			k.mu.Lock()
			defer k.mu.Unlock()
			if tap == k.noIsolate || !k.taps[tap] {
				return fmt.Errorf("cannot isolate %s", tap)
			}
			k.isolated[tap] = true
			return nil
		},
		DeleteTap: func(tap string) error {
			k.mu.Lock()
			defer k.mu.Unlock()
			if tap == k.noDelete {
				return fmt.Errorf("cannot delete %s", tap)
			}
			if _, locked := k.tables[tap]; !locked && k.taps[tap] {
				return fmt.Errorf("%s deleted after its lock", tap)
			}
			delete(k.taps, tap)
			return nil
		},
		Pins: func(string) (map[netip.Addr]net.HardwareAddr, error) {
			k.mu.Lock()
			defer k.mu.Unlock()
			out := map[netip.Addr]net.HardwareAddr{}
			for a, m := range k.pins {
				out[a] = m
			}
			return out, nil
		},
		Pin: func(_ string, ip netip.Addr, mac net.HardwareAddr) error {
			k.mu.Lock()
			defer k.mu.Unlock()
			k.pins[ip] = mac
			return nil
		},
		Unpin: func(_ string, ip netip.Addr, mac net.HardwareAddr) error {
			k.mu.Lock()
			defer k.mu.Unlock()
			if slices.Equal(k.pins[ip], mac) {
				delete(k.pins, ip)
			}
			return nil
		},
	}
}

var doorMAC = net.HardwareAddr{0x02, 0, 0, 0, 0, 0xd0}

func fakeLane(t *testing.T, k *fakeKernel, ports PortRange) *Lane {
	t.Helper()
	l, err := NewLane(LaneConfig{Bridge: "br", Addr: netip.MustParseAddr("10.1.0.1"), MAC: doorMAC, Ports: ports, Ops: k.ops()})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func mac(i int) net.HardwareAddr { return net.HardwareAddr{0x02, 0, 0, 0, 1, byte(i)} }

// numbered is members vm<i> on tap<i> with mac(i), for i below n.
func numbered(n int) []Member {
	var out []Member
	for i := range n {
		out = append(out, Member{VM: fmt.Sprintf("vm%d", i), Tap: fmt.Sprintf("tap%d", i), MAC: mac(i)})
	}
	return out
}

// TestLanePorts: every VM gets its own port; a VM that unlocks and locks
// again gets the same one; a full range is ErrPortsExhausted; Door reads
// what Lock gave.
func TestLanePorts(t *testing.T) {
	k := newFakeKernel()
	l := fakeLane(t, k, PortRange{First: 30000, Last: 30009})
	seen := map[netip.AddrPort]string{}
	for i := range 10 {
		vm, tap := fmt.Sprintf("vm%d", i), fmt.Sprintf("tap%d", i)
		k.taps[tap] = true
		ls, err := l.Lock(vm, tap, mac(i))
		if err != nil {
			t.Fatal(err)
		}
		d := ls.Door
		if prev, dup := seen[d]; dup {
			t.Fatalf("%s and %s share door %s", prev, vm, d)
		}
		seen[d] = vm
		if got, ok := l.Door(vm); !ok || got != d {
			t.Fatalf("Door(%s) = %s %v, want %s", vm, got, ok, d)
		}
		if k.tables[tap].Lock.Door != d {
			t.Fatalf("installed door %s, want %s", k.tables[tap].Lock.Door, d)
		}
		if !k.isolated[tap] {
			t.Fatalf("%s locked but not isolated", tap)
		}
	}
	k.taps["tap10"] = true
	if _, err := l.Lock("vm10", "tap10", mac(10)); !errors.Is(err, ErrPortsExhausted) {
		t.Fatalf("11th lock: %v, want ErrPortsExhausted", err)
	}
	d3, _ := l.Door("vm3")
	if err := l.Unlock("vm3", "tap3", mac(3)); err != nil {
		t.Fatal(err)
	}
	if _, ok := l.Door("vm3"); ok {
		t.Fatal("door kept after unlock")
	}
	if _, ok := k.tables["tap3"]; ok {
		t.Fatal("table kept after unlock")
	}
	again, err := l.Lock("vm3", "tap3", mac(3))
	if err != nil || again.Door != d3 {
		t.Fatalf("relock: %s %v, want %s", again.Door, err, d3)
	}
	// Locking again keeps the port (a recipe re-run).
	if d, err := l.Lock("vm3", "tap3", mac(3)); err != nil || d != again {
		t.Fatalf("re-run lock: %+v %v, want %+v", d, err, again)
	}
}

// TestLaneReconcile: right locks are kept with their ports, wrong or
// missing ones repaired, tables of unknown taps removed, members without a
// tap reported, and a failed repair reported for the caller to act on.
func TestLaneReconcile(t *testing.T) {
	k := newFakeKernel()
	addr := netip.MustParseAddr("10.1.0.1")
	for i := range 6 {
		k.taps[fmt.Sprintf("tap%d", i)] = true
	}
	lock := func(i int, port uint16) Lock {
		return Lock{Tap: fmt.Sprintf("tap%d", i), GuestMAC: mac(i), GuestIP: netip.AddrFrom4([4]byte{10, 1, 0, byte(10 + i)}), Door: netip.AddrPortFrom(addr, port), DoorMAC: doorMAC}
	}
	k.tables["tap0"] = State{Tap: "tap0", Lock: lock(0, 30005), OK: true} // right: kept on 30005
	k.tables["tap1"] = State{Tap: "tap1", Problem: "rule deleted"}        // broken: repaired
	bad := lock(2, 30006)
	bad.GuestMAC = mac(99)
	k.tables["tap2"] = State{Tap: "tap2", Lock: bad, OK: true}            // other MAC: repaired, keeps 30006
	k.tables["tap9"] = State{Tap: "tap9", Lock: lock(9, 30007), OK: true} // nobody's: removed
	k.tables["tap7"] = State{Tap: "tap7", Lock: lock(7, 30005), OK: true} // nobody's either
	// Nobody's, but their taps are still there (a run dir the state does
	// not own): tap8 is deleted, then unlocked; tap11 cannot be deleted and
	// stays locked.
	k.tables["tap8"] = State{Tap: "tap8", Lock: lock(8, 30009), OK: true}
	k.tables["tap11"] = State{Tap: "tap11", Lock: lock(11, 30001), OK: true}
	k.taps["tap8"], k.taps["tap11"] = true, true
	k.noDelete = "tap11"
	// tap3: no table, tap exists: repaired. tap4: no tap at all. tap5: install fails.
	// tap6: a right table, but its tap is gone (deleted, not yet unlocked).
	delete(k.taps, "tap4")
	delete(k.taps, "tap6")
	k.tables["tap6"] = State{Tap: "tap6", Lock: lock(6, 30008), OK: true}
	k.failOn = "tap5"

	l := fakeLane(t, k, PortRange{First: 30000, Last: 30009})
	rep, err := l.Reconcile(numbered(7))
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := k.tables["tap6"]; ok {
		t.Fatal("the lock of a tap that is gone was kept")
	}
	if d, ok := l.Door("vm6"); ok {
		t.Fatalf("vm6 (no tap) keeps door %s", d)
	}
	if rep.Kept != 1 || !slices.Equal(rep.Repaired, []string{"vm1", "vm2", "vm3"}) || !slices.Equal(rep.NoTap, []string{"vm4", "vm6"}) ||
		!slices.Equal(rep.Removed, []string{"tap7", "tap8", "tap9"}) || len(rep.Failed) != 1 || rep.Failed["vm5"] == nil ||
		len(rep.Stray) != 1 || rep.Stray["tap11"] == nil {
		t.Fatalf("report %+v", rep)
	}
	if k.taps["tap8"] {
		t.Fatal("tap8, no member's, still there")
	}
	if _, ok := k.tables["tap11"]; !ok || !k.taps["tap11"] {
		t.Fatal("tap11 could not be deleted, yet its lock was removed")
	}
	if d, _ := l.Door("vm0"); d.Port() != 30005 {
		t.Fatalf("vm0 door %s, want its port 30005 kept", d)
	}
	if d, _ := l.Door("vm2"); d.Port() != 30006 {
		t.Fatalf("vm2 door %s, want its port 30006 kept through the repair", d)
	}
	for i := range 4 {
		tap := fmt.Sprintf("tap%d", i)
		ls, _ := l.Lease(fmt.Sprintf("vm%d", i))
		want := lock(i, ls.Door.Port())
		want.GuestIP = ls.Guest.Addr()
		if st := k.tables[tap]; !st.OK || !st.Lock.Equal(want) {
			t.Fatalf("%s after reconcile: %+v", tap, st)
		}
		if !slices.Equal(k.pins[ls.Guest.Addr()], mac(i)) {
			t.Fatalf("%s: guest address %s not pinned to %s: %v", tap, ls.Guest, mac(i), k.pins)
		}
	}
	// The kept and the repaired keep the addresses their locks named.
	for _, i := range []int{0, 2} {
		if ls, _ := l.Lease(fmt.Sprintf("vm%d", i)); ls.Guest.Addr() != lock(i, 0).GuestIP {
			t.Fatalf("vm%d's guest address moved to %s, want %s", i, ls.Guest, lock(i, 0).GuestIP)
		}
	}
	if _, ok := k.tables["tap9"]; ok {
		t.Fatal("foreign table kept")
	}
}

// TestLaneReconcileIsolates: every member's tap is isolated, kept or
// repaired; a tap that cannot be isolated is a failure (its guest could
// reach other guests), and a lock that cannot isolate its tap is refused.
func TestLaneReconcileIsolates(t *testing.T) {
	k := newFakeKernel()
	addr := netip.MustParseAddr("10.1.0.1")
	for i := range 3 {
		k.taps[fmt.Sprintf("tap%d", i)] = true
	}
	k.tables["tap0"] = State{Tap: "tap0", Lock: Lock{Tap: "tap0", GuestMAC: mac(0), GuestIP: netip.MustParseAddr("10.1.0.20"), Door: netip.AddrPortFrom(addr, 30001), DoorMAC: doorMAC}, OK: true}
	k.tables["tap2"] = State{Tap: "tap2", Lock: Lock{Tap: "tap2", GuestMAC: mac(2), GuestIP: netip.MustParseAddr("10.1.0.22"), Door: netip.AddrPortFrom(addr, 30002), DoorMAC: doorMAC}, OK: true}
	k.noIsolate = "tap2"
	l := fakeLane(t, k, PortRange{First: 30000, Last: 30009})
	rep, err := l.Reconcile(numbered(3))
	if err != nil {
		t.Fatal(err)
	}
	if rep.Kept != 1 || !slices.Equal(rep.Repaired, []string{"vm1"}) || len(rep.Failed) != 1 || rep.Failed["vm2"] == nil {
		t.Fatalf("report %+v", rep)
	}
	if !k.isolated["tap0"] || !k.isolated["tap1"] {
		t.Fatalf("isolated taps %v, want tap0 (kept) and tap1 (repaired)", k.isolated)
	}
	k.taps["tap3"], k.noIsolate = true, "tap3"
	if _, err := l.Lock("vm3", "tap3", mac(3)); err == nil {
		t.Fatal("a tap that cannot be isolated was locked")
	}
}

// TestNewLaneReadsBridge: the door address and MAC are the bridge's; a
// bridge without an IPv4 address is ErrNoAddress.
func TestNewLaneReadsBridge(t *testing.T) {
	lane := netnstest.NewLane(t)
	lane.Host.Bridge(t, "bare0", netip.Prefix{})
	want := lane.BridgeMAC(t)
	lane.Host.MustDo(t, func() error {
		if _, err := NewLane(LaneConfig{Bridge: lane.Bridge}); !errors.Is(err, ErrNoOwner) {
			t.Errorf("lane without an instance: %v, want ErrNoOwner", err)
		}
		l, err := NewLane(LaneConfig{Bridge: lane.Bridge, Instance: "i-nfttest"})
		if err != nil {
			return err
		}
		if l.Addr() != lane.HostAddr || !slices.Equal(l.mac, want) {
			t.Errorf("lane %s %s, want %s %s", l.Addr(), l.mac, lane.HostAddr, want)
		}
		if _, err := NewLane(LaneConfig{Bridge: "bare0", Instance: "i-nfttest"}); !errors.Is(err, ErrNoAddress) {
			t.Errorf("bridge without address: %v", err)
		}
		return nil
	})
	// A port with a lower MAC joining does not move the door's MAC.
	lane.AddGuest(t, 1, "sbxlow", net.HardwareAddr{0x02, 0, 0, 0, 0, 0x42})
	lane.Host.MustDo(t, func() error {
		l, err := netlink.LinkByName("sbxlow")
		if err != nil {
			return err
		}
		if err := netlink.LinkSetHardwareAddr(l, net.HardwareAddr{0x00, 0, 0, 0, 0, 1}); err != nil {
			return err
		}
		return nil
	})
	if got := lane.BridgeMAC(t); !slices.Equal(got, want) {
		t.Fatalf("bridge MAC moved to %s, want %s pinned", got, want)
	}
}

// TestLanesOfTwoInstances: two sandboxd instances' lanes in one namespace,
// on one bridge, each with its own guard and locks. Each one's Reconcile
// sees only its own tables: it removes its own stray lock and never
// another instance's, whose guest stays locked.
func TestLanesOfTwoInstances(t *testing.T) {
	lane := netnstest.NewLane(t)
	ga := lane.AddGuest(t, 1, "sbxinsta000001", mac(1))
	gb := lane.AddGuest(t, 2, "sbxinstb000001", mac(2))
	a, b := OwnerOf("i-aaaa"), OwnerOf("i-bbbb")
	if a == b || a.Tag() == "" || a.TableName(ga.Tap) == b.TableName(ga.Tap) || a.GuardTableName() == b.GuardTableName() {
		t.Fatalf("owners %q and %q share names", a.Tag(), b.Tag())
	}
	doorA := netip.AddrPortFrom(lane.HostAddr, 20001)
	other := lane.HostAddr.String() + ":20150"
	for _, addr := range []string{doorA.String(), other} {
		ln, err := lane.Host.Listen("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		echo(t, ln)
	}
	var la, lb *Lane
	var leaseA, leaseB Lease
	lane.Host.MustDo(t, func() error {
		var err error
		if la, err = NewLane(LaneConfig{Bridge: lane.Bridge, Instance: "i-aaaa", Ports: PortRange{First: 20001, Last: 20001}}); err != nil {
			return err
		}
		lb, err = NewLane(LaneConfig{Bridge: lane.Bridge, Instance: "i-bbbb", Ports: PortRange{First: 20100, Last: 20199}})
		return err
	})
	lane.Host.MustDo(t, func() error {
		if _, err := la.Reconcile(nil); err != nil {
			return err
		}
		d, err := la.Lock("vm-a", ga.Tap, ga.MAC)
		if err != nil || d.Door != doorA {
			return fmt.Errorf("lock a: %+v %v", d, err)
		}
		leaseA = d
		leaseB, err = lb.Lock("vm-b", gb.Tap, gb.MAC)
		return err
	})
	if leaseA.Guest.Addr() == leaseB.Guest.Addr() {
		t.Fatalf("two instances gave one guest address: %s", leaseA.Guest)
	}
	takeLease(t, ga, leaseA)
	// B starts again and owns no VM: it removes its own lock, none of A's.
	lane.Host.MustDo(t, func() error {
		rep, err := lb.Reconcile(nil)
		if err != nil {
			return err
		}
		if !slices.Equal(rep.Removed, []string{gb.Tap}) || rep.Kept != 0 {
			t.Errorf("b's reconcile: %+v, want only its own %s removed", rep, gb.Tap)
		}
		if all, err := b.Tables(); err != nil || len(all) != 0 {
			t.Errorf("b's tables after its reconcile: %v %v", all, err)
		}
		all, err := a.Tables()
		if err != nil {
			return err
		}
		if len(all) != 1 || !all[ga.Tap].OK || all[ga.Tap].Lock.Door != doorA {
			t.Errorf("a's tables after b's reconcile: %+v, want its lock of %s", all, ga.Tap)
		}
		// Both guards are in place, each under its own name.
		for _, o := range []Owner{a, b} {
			if _, err := o.GuardDrops(); err != nil {
				t.Errorf("guard of %s: %v", o.Tag(), err)
			}
		}
		return nil
	})
	// A's guest is still locked: its door only.
	if !reach(ga, doorA.String(), 2*time.Second) {
		t.Fatal("a's guest does not reach its door")
	}
	if reach(ga, other, 500*time.Millisecond) {
		t.Fatal("a's guest got past its lock after b's reconcile")
	}
	// A restarts too: its lock is kept as it was, on its door.
	lane.Host.MustDo(t, func() error {
		again, err := NewLane(LaneConfig{Bridge: lane.Bridge, Instance: "i-aaaa", Ports: PortRange{First: 20001, Last: 20001}})
		if err != nil {
			return err
		}
		rep, err := again.Reconcile([]Member{{VM: "vm-a", Tap: ga.Tap, MAC: ga.MAC}})
		if err != nil {
			return err
		}
		if rep.Kept != 1 || len(rep.Removed) != 0 || len(rep.Repaired) != 0 {
			t.Errorf("a's reconcile: %+v, want its lock kept", rep)
		}
		return nil
	})
}

// TestIsolatedTaps: two guests whose taps are isolated reach no frame of
// each other (not even ARP), and each still reaches the host (the door is
// the bridge device); a lane's Lock isolates the tap it locks, and the
// guest reaches its door through both.
func TestIsolatedTaps(t *testing.T) {
	lane := netnstest.NewLane(t)
	ga := lane.AddGuest(t, 1, "sbxisola000001", mac(1))
	gb := lane.AddGuest(t, 2, "sbxisolb000001", mac(2))
	svc := lane.HostAddr.String() + ":20001"
	ln, err := lane.Host.Listen("tcp", svc)
	if err != nil {
		t.Fatal(err)
	}
	echo(t, ln)
	peer := netip.AddrPortFrom(gb.Addr, 8080).String()
	pl, err := gb.Listen("tcp", peer)
	if err != nil {
		t.Fatal(err)
	}
	echo(t, pl)
	if !reach(ga, peer, 2*time.Second) {
		t.Fatal("the guests do not reach each other before isolation")
	}
	lane.Host.MustDo(t, func() error { return errors.Join(Isolate(ga.Tap), Isolate(gb.Tap), Isolate(gb.Tap)) })
	forgetNeighbours(t, ga)
	forgetNeighbours(t, gb)
	if reach(ga, peer, 500*time.Millisecond) {
		t.Fatal("a guest reached another through isolated taps")
	}
	if !reach(ga, svc, 2*time.Second) || !reach(gb, svc, 2*time.Second) {
		t.Fatal("an isolated tap's guest does not reach the host")
	}

	// A lane's lock isolates its tap; the guest reaches its door.
	gc := lane.AddGuest(t, 3, "sbxisolc000001", mac(3))
	var leaseC Lease
	lane.Host.MustDo(t, func() error {
		l, err := NewLane(LaneConfig{Bridge: lane.Bridge, Instance: "i-isolate", Ports: PortRange{First: 20001, Last: 20001}})
		if err != nil {
			return err
		}
		ls, err := l.Lock("vm-c", gc.Tap, gc.MAC)
		if err != nil {
			return err
		}
		leaseC = ls
		link, err := netlink.LinkByName(gc.Tap)
		if err != nil {
			return err
		}
		pi, err := netlink.LinkGetProtinfo(link)
		if err != nil {
			return err
		}
		if !pi.Isolated {
			t.Errorf("locked tap %s is not isolated: %+v", gc.Tap, pi)
		}
		return nil
	})
	takeLease(t, gc, leaseC)
	forgetNeighbours(t, gc)
	if !reach(gc, svc, 2*time.Second) {
		t.Fatal("a locked, isolated tap's guest does not reach its door")
	}
}

// TestLaneGuestAddrs: each VM gets its own address in the subnet (never the
// network's, the broadcast or the door's), pinned to its MAC; an address
// another instance pinned is skipped; Unlock unpins and a relock gets the
// same address; Reconcile unpins the address of a lock no VM owns.
func TestLaneGuestAddrs(t *testing.T) {
	k := newFakeKernel()
	l, err := NewLane(LaneConfig{Bridge: "br", Addr: netip.MustParseAddr("10.1.0.1"), Bits: 29, MAC: doorMAC, Ports: PortRange{First: 30000, Last: 30009}, Ops: k.ops()})
	if err != nil {
		t.Fatal(err)
	}
	// 10.1.0.0/29: .2 to .6 are guests' (.0 network, .1 door, .7 broadcast);
	// another instance holds .4.
	foreign := netip.MustParseAddr("10.1.0.4")
	k.pins[foreign] = mac(99)
	seen := map[netip.Addr]string{}
	for i := range 4 {
		vm, tap := fmt.Sprintf("vm%d", i), fmt.Sprintf("tap%d", i)
		k.taps[tap] = true
		ls, err := l.Lock(vm, tap, mac(i))
		if err != nil {
			t.Fatal(err)
		}
		a := ls.Guest.Addr()
		if ls.Guest.Bits() != 29 || a == foreign || !l.guestUsable(a) {
			t.Fatalf("%s got %s", vm, ls.Guest)
		}
		if prev, dup := seen[a]; dup {
			t.Fatalf("%s and %s share %s", prev, vm, a)
		}
		seen[a] = vm
		if k.tables[tap].Lock.GuestIP != a || !slices.Equal(k.pins[a], mac(i)) {
			t.Fatalf("%s: lock %s, pins %v", vm, k.tables[tap].Lock, k.pins)
		}
	}
	k.taps["tap4"] = true
	if _, err := l.Lock("vm4", "tap4", mac(4)); !errors.Is(err, ErrAddrsExhausted) {
		t.Fatalf("a fifth guest in a /29 with one address pinned elsewhere: %v, want ErrAddrsExhausted", err)
	}
	if _, ok := l.Door("vm4"); ok {
		t.Fatal("a VM without an address kept a door")
	}
	l1, _ := l.Lease("vm1")
	if err := l.Unlock("vm1", "tap1", mac(1)); err != nil {
		t.Fatal(err)
	}
	if _, ok := k.pins[l1.Guest.Addr()]; ok {
		t.Fatal("unlocked, the address stays pinned")
	}
	if again, err := l.Lock("vm1", "tap1", mac(1)); err != nil || again != l1 {
		t.Fatalf("relock: %+v %v, want %+v", again, err, l1)
	}
	// A restart owning vm0 only: vm0 keeps its address, the others' locks
	// (their taps gone) are removed with their pins, the foreign pin stays.
	l0, _ := l.Lease("vm0")
	for _, tap := range []string{"tap1", "tap2", "tap3"} {
		delete(k.taps, tap)
	}
	again, err := NewLane(LaneConfig{Bridge: "br", Addr: netip.MustParseAddr("10.1.0.1"), Bits: 29, MAC: doorMAC, Ports: PortRange{First: 30000, Last: 30009}, Ops: k.ops()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := again.Reconcile(numbered(1)); err != nil {
		t.Fatal(err)
	}
	if got, _ := again.Lease("vm0"); got != l0 {
		t.Fatalf("vm0 after the restart: %+v, want %+v", got, l0)
	}
	if len(k.pins) != 2 || !slices.Equal(k.pins[l0.Guest.Addr()], mac(0)) || !slices.Equal(k.pins[foreign], mac(99)) {
		t.Fatalf("pins after the reconcile: %v, want vm0's and the foreign one", k.pins)
	}
}

func TestDumpedRereadsInterruptedDumps(t *testing.T) {
	other := errors.New("no such device")
	for _, tc := range []struct {
		name        string
		interrupted int // dumps answered ErrDumpInterrupted before a whole one
		last        error
		want        error
		reads       int
	}{
		{"whole at once", 0, nil, nil, 1},
		{"whole at the third read", 2, nil, nil, 3},
		{"another error is not retried", 0, other, other, 1},
		{"never whole", dumpTries + 5, nil, netlink.ErrDumpInterrupted, dumpTries},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reads := 0
			v, err := Dumped(func() (int, error) {
				reads++
				if reads <= tc.interrupted {
					return -reads, netlink.ErrDumpInterrupted
				}
				return 7, tc.last
			})
			if !errors.Is(err, tc.want) || (tc.want == nil && err != nil) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
			if reads != tc.reads {
				t.Fatalf("%d reads, want %d", reads, tc.reads)
			}
			if err == nil && v != 7 {
				t.Fatalf("value %d, want the whole dump's 7", v)
			}
		})
	}
}
