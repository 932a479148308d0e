package nft

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"net"
	"net/netip"
	"sort"
	"sync"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Lane is a node's egress lane: the bridge egress taps attach to, the door
// address on it (the bridge's IPv4 address: the tap's host address as the
// guest sees it), and one Lock per egress VM, whose door port and guest
// address it allocates.
//
// A guest's address is the host's choice, in the bridge's subnet: derived
// from the VM id (like its MAC), moved on past addresses taken by another
// VM of the lane or pinned by anyone else on the bridge (another instance),
// kept until Unlock and preferred again at the next Lock. The lock admits
// only that address, and the lane pins it on the bridge with a permanent
// neighbour entry (address -> the guest's MAC), so no ARP (a guest's, or
// anyone's) redirects the door's answers meant for it. The driver gives
// the guest its address (Lease).
//
// Each VM's door is its own port, so the proxy knows the sandbox by the
// listener a connection reaches, and a guest can reach no other VM's door:
// its tap admits only its own port. Every tap the lane locks is also an
// isolated bridge port (IFLA_BRPORT_ISOLATED): the bridge forwards no frame
// from one tap to another, so the ARP a lock admits reaches the host (the
// door is the bridge device itself) and never another guest. A port is kept
// by the VM until Unlock and preferred again at the next Lock (a wake), so
// the door seldom moves.
//
// Lock and Unlock are the refill and destroy halves (netlink, a few
// hundred microseconds); Door only reads memory, for the proxy and the
// claim path. Reconcile is the start-up half: it reads the kernel's tables
// once, keeps the locks that are right (their ports with them), repairs the
// rest and removes the tables of taps no VM owns.
//
// Every table a lane sees is its instance's (LaneConfig.Instance, Owner):
// another sandboxd on the same host, on the same bridge or another, keeps
// its locks and its guard through this lane's Reconcile, and the other way
// round.
type Lane struct {
	bridge string
	addr   netip.Addr
	subnet netip.Prefix // the bridge's, holding addr
	mac    net.HardwareAddr
	ports  PortRange
	ops    Ops
	prefix string

	mu      sync.Mutex
	doors   map[string]uint16     // VM -> port
	used    map[uint16]string     // port -> VM
	guests  map[string]netip.Addr // VM -> guest address
	guestOf map[netip.Addr]string // guest address -> VM
}

// Lease is what a lock gives a VM: its door and the address its guest
// must take on the tap (the subnet's prefix length; its gateway is the
// door's address).
type Lease struct {
	Door  netip.AddrPort
	Guest netip.Prefix
}

// PortRange is the door ports of a lane, First..Last inclusive.
type PortRange struct{ First, Last uint16 }

// DefaultPorts sits below Linux's default ephemeral range (32768-60999), so
// an outgoing connection never holds a door's port.
var DefaultPorts = PortRange{First: 20000, Last: 29999}

func (r PortRange) size() int { return int(r.Last) - int(r.First) + 1 }

// Ops are the kernel operations a Lane performs (this package's functions by
// default; tests of the callers substitute them).
type Ops struct {
	Install func(Lock) error
	Remove  func(tap string) error
	Tables  func() (map[string]State, error)
	// TapExists reports whether the device exists (a lock hooks a device).
	TapExists func(tap string) (bool, error)
	// Isolate makes the tap an isolated port of its bridge (nil: taps are
	// left as they are, for tests of the callers that have no bridge).
	Isolate func(tap string) error
	// Guard installs the bridge's guard (nil: none).
	Guard func(Guard) error
	// DeleteTap deletes a device that is gone already or must go (nil:
	// the lock of a tap no member owns stays while the tap exists).
	DeleteTap func(tap string) error
	// Pins lists the permanent IPv4 neighbour entries of the bridge;
	// Pin sets one (replacing), Unpin removes one if it still names mac
	// (nil: no pins, for tests of the callers that have no bridge).
	Pins  func(bridge string) (map[netip.Addr]net.HardwareAddr, error)
	Pin   func(bridge string, ip netip.Addr, mac net.HardwareAddr) error
	Unpin func(bridge string, ip netip.Addr, mac net.HardwareAddr) error
}

// KernelOps act on o's tables in the calling thread's network namespace.
func KernelOps(o Owner) Ops {
	return Ops{Install: o.Install, Remove: o.Remove, Tables: o.Tables, TapExists: linkExists, Isolate: Isolate, Guard: o.InstallGuard, DeleteTap: deleteLink,
		Pins: Pins, Pin: Pin, Unpin: Unpin}
}

// dumpTries bounds the retries of an interrupted dump: a table that changes
// faster than it can be read for this long is an error worth seeing.
const dumpTries = 10

// Dumped runs a netlink dump until the kernel answers it whole. A dump that
// raced a change of the table it reads (a tap joining, a neighbour pinned by
// another lane) ends with netlink.ErrDumpInterrupted and a partial result,
// which is neither trusted nor an error: it is read again.
func Dumped[T any](dump func() (T, error)) (T, error) {
	var v T
	var err error
	for range dumpTries {
		if v, err = dump(); !errors.Is(err, netlink.ErrDumpInterrupted) {
			return v, err
		}
	}
	return v, fmt.Errorf("%w (%d reads)", err, dumpTries)
}

// Pins lists the permanent IPv4 neighbour entries on bridge: the guest
// addresses pinned by every lane of the bridge (and by the operator).
func Pins(bridge string) (map[netip.Addr]net.HardwareAddr, error) {
	br, err := netlink.LinkByName(bridge)
	if err != nil {
		return nil, fmt.Errorf("nft: pins of %s: %w", bridge, err)
	}
	ns, err := Dumped(func() ([]netlink.Neigh, error) { return netlink.NeighList(br.Attrs().Index, netlink.FAMILY_V4) })
	if err != nil {
		return nil, fmt.Errorf("nft: pins of %s: %w", bridge, err)
	}
	out := map[netip.Addr]net.HardwareAddr{}
	for _, n := range ns {
		if n.State&netlink.NUD_PERMANENT == 0 {
			continue
		}
		if a, ok := netip.AddrFromSlice(n.IP.To4()); ok && len(n.HardwareAddr) == 6 {
			out[a] = n.HardwareAddr
		}
	}
	return out, nil
}

// Pin makes ip's neighbour entry on bridge permanent, at mac: the host
// sends ip's packets to mac whatever ARP says later.
func Pin(bridge string, ip netip.Addr, mac net.HardwareAddr) error {
	br, err := netlink.LinkByName(bridge)
	if err != nil {
		return fmt.Errorf("nft: pin %s: %w", ip, err)
	}
	n := &netlink.Neigh{LinkIndex: br.Attrs().Index, Family: netlink.FAMILY_V4, State: netlink.NUD_PERMANENT, IP: ip.AsSlice(), HardwareAddr: mac}
	if err := netlink.NeighSet(n); err != nil {
		return fmt.Errorf("nft: pin %s at %s on %s: %w", ip, mac, bridge, err)
	}
	return nil
}

// Unpin removes ip's neighbour entry on bridge if it names mac (another
// instance's pin of the address, or none, is left alone).
func Unpin(bridge string, ip netip.Addr, mac net.HardwareAddr) error {
	pins, err := Pins(bridge)
	if err != nil {
		return err
	}
	if got, ok := pins[ip]; !ok || !bytes.Equal(got, mac) {
		return nil
	}
	br, err := netlink.LinkByName(bridge)
	if err != nil {
		return fmt.Errorf("nft: unpin %s: %w", ip, err)
	}
	n := &netlink.Neigh{LinkIndex: br.Attrs().Index, Family: netlink.FAMILY_V4, IP: ip.AsSlice(), HardwareAddr: mac}
	if err := netlink.NeighDel(n); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("nft: unpin %s on %s: %w", ip, bridge, err)
	}
	return nil
}

// Isolate makes tap an isolated port of the bridge it is attached to: the
// bridge forwards nothing between two isolated ports, while frames to and
// from the bridge device itself (the door) and non-isolated ports pass.
// Setting it again is a no-op.
func Isolate(tap string) error {
	l, err := netlink.LinkByName(tap)
	if err != nil {
		return fmt.Errorf("nft: isolate %s: %w", tap, err)
	}
	if err := netlink.LinkSetIsolated(l, true); err != nil {
		return fmt.Errorf("nft: isolate %s: %w", tap, err)
	}
	return nil
}

// deleteLink deletes the device name; one that is gone is no error.
func deleteLink(name string) error {
	l, err := netlink.LinkByName(name)
	var nf netlink.LinkNotFoundError
	switch {
	case errors.As(err, &nf):
		return nil
	case err != nil:
		return fmt.Errorf("nft: delete %s: %w", name, err)
	}
	if err := netlink.LinkDel(l); err != nil {
		return fmt.Errorf("nft: delete %s: %w", name, err)
	}
	return nil
}

func linkExists(name string) (bool, error) {
	_, err := netlink.LinkByName(name)
	var nf netlink.LinkNotFoundError
	switch {
	case err == nil:
		return true, nil
	case errors.As(err, &nf):
		return false, nil
	}
	return false, err
}

// LaneConfig configures a Lane.
type LaneConfig struct {
	Bridge string
	// Instance is the sandboxd instance id whose tables the lane installs,
	// reconciles and removes (KernelOps(OwnerOf(Instance))); required
	// unless Ops is set.
	Instance string
	// Addr and MAC are the door's address and hardware address (default:
	// the bridge's first IPv4 address and its MAC, read once by NewLane).
	Addr netip.Addr
	MAC  net.HardwareAddr
	// Bits is the prefix length of the guests' subnet, which holds Addr
	// (default: the bridge address's; 24 with Addr set).
	Bits int
	// Ports defaults to DefaultPorts.
	Ports PortRange
	// Ops defaults to KernelOps.
	Ops *Ops
	// TapPrefix starts the name of every VM tap on the bridge (the guard
	// closes the door ports to other ports); default "sbx".
	TapPrefix string
}

var (
	// ErrNoAddress: the bridge has no IPv4 address to serve doors on.
	ErrNoAddress = errors.New("nft: the egress bridge has no IPv4 address for the proxy doors")
	// ErrPortsExhausted: every door port of the lane is taken.
	ErrPortsExhausted = errors.New("nft: no free door port")
	// ErrAddrsExhausted: every guest address of the bridge's subnet is taken.
	ErrAddrsExhausted = errors.New("nft: no free guest address")
)

// NewLane returns the lane of cfg.Bridge. Without Addr and MAC it reads the
// bridge (netlink, once, at start-up), and pins the bridge's MAC (sets it to
// itself), so that ports joining never change the door's MAC.
func NewLane(cfg LaneConfig) (*Lane, error) {
	l := &Lane{bridge: cfg.Bridge, addr: cfg.Addr, mac: cfg.MAC, ports: cfg.Ports, prefix: cfg.TapPrefix,
		doors: map[string]uint16{}, used: map[uint16]string{}, guests: map[string]netip.Addr{}, guestOf: map[netip.Addr]string{}}
	bits := cfg.Bits
	if l.prefix == "" {
		l.prefix = "sbx"
	}
	if l.ports == (PortRange{}) {
		l.ports = DefaultPorts
	}
	if l.ports.First == 0 || l.ports.Last < l.ports.First {
		return nil, fmt.Errorf("nft: door ports %d-%d", l.ports.First, l.ports.Last)
	}
	switch {
	case cfg.Ops != nil:
		l.ops = *cfg.Ops
	case cfg.Instance == "":
		return nil, fmt.Errorf("%w: the lane of bridge %q has no instance id", ErrNoOwner, cfg.Bridge)
	default:
		l.ops = KernelOps(OwnerOf(cfg.Instance))
	}
	if !l.addr.IsValid() || len(l.mac) == 0 {
		br, err := netlink.LinkByName(cfg.Bridge)
		if err != nil {
			return nil, fmt.Errorf("nft: bridge %q: %w", cfg.Bridge, err)
		}
		if len(l.mac) == 0 {
			// A bridge whose MAC was never set takes its ports' lowest:
			// a tap joining would move the door's MAC from under every
			// lock. Setting it to itself pins it.
			l.mac = br.Attrs().HardwareAddr
			if err := netlink.LinkSetHardwareAddr(br, l.mac); err != nil {
				return nil, fmt.Errorf("nft: pin the MAC of bridge %q: %w", cfg.Bridge, err)
			}
		}
		if !l.addr.IsValid() {
			addrs, err := Dumped(func() ([]netlink.Addr, error) { return netlink.AddrList(br, netlink.FAMILY_V4) })
			if err != nil {
				return nil, fmt.Errorf("nft: addresses of %q: %w", cfg.Bridge, err)
			}
			if len(addrs) == 0 {
				return nil, fmt.Errorf("%w: %s", ErrNoAddress, cfg.Bridge)
			}
			l.addr, _ = netip.AddrFromSlice(addrs[0].IP.To4())
			if ones, _ := addrs[0].Mask.Size(); bits == 0 {
				bits = ones
			}
		}
	}
	if !l.addr.Is4() {
		return nil, fmt.Errorf("%w: %s has %s", ErrNoAddress, cfg.Bridge, l.addr)
	}
	if bits == 0 {
		bits = 24
	}
	if bits < 8 || bits > 30 {
		return nil, fmt.Errorf("%w: the bridge's subnet %s/%d leaves no room for guests (want a prefix of 8 to 30 bits)", ErrNoAddress, l.addr, bits)
	}
	l.subnet = netip.PrefixFrom(l.addr, bits).Masked()
	return l, nil
}

// Addr is the door address of the lane.
func (l *Lane) Addr() netip.Addr { return l.addr }

// Subnet is the guests' subnet (the bridge's).
func (l *Lane) Subnet() netip.Prefix { return l.subnet }

// Lease returns vm's door and guest address, if it holds them. Memory only.
func (l *Lane) Lease(vm string) (Lease, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	p, ok := l.doors[vm]
	g, gok := l.guests[vm]
	if !ok || !gok {
		return Lease{}, false
	}
	return Lease{Door: netip.AddrPortFrom(l.addr, p), Guest: netip.PrefixFrom(g, l.subnet.Bits())}, true
}

// Door returns the door of vm, if it holds one. Memory only.
func (l *Lane) Door(vm string) (netip.AddrPort, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	p, ok := l.doors[vm]
	if !ok {
		return netip.AddrPort{}, false
	}
	return netip.AddrPortFrom(l.addr, p), true
}

// preferred is where vm's port search starts: spread by its id, so a VM
// that unlocks and locks again (hibernate, wake) finds the same port.
func (l *Lane) preferred(vm string) uint16 {
	h := fnv.New32a()
	_, _ = h.Write([]byte(vm))
	return l.ports.First + uint16(h.Sum32()%uint32(l.ports.size()))
}

// allocLocked gives vm a port: the one it holds, else want when free and in
// range, else the first free one from its preferred port on.
func (l *Lane) allocLocked(vm string, want uint16) (uint16, error) {
	if p, ok := l.doors[vm]; ok {
		return p, nil
	}
	take := func(p uint16) uint16 { l.doors[vm], l.used[p] = p, vm; return p }
	if want >= l.ports.First && want <= l.ports.Last {
		if _, taken := l.used[want]; !taken {
			return take(want), nil
		}
	}
	p := l.preferred(vm)
	for range l.ports.size() {
		if _, taken := l.used[p]; !taken {
			return take(p), nil
		}
		if p == l.ports.Last {
			p = l.ports.First
		} else {
			p++
		}
	}
	return 0, fmt.Errorf("%w in %d-%d (%d VMs)", ErrPortsExhausted, l.ports.First, l.ports.Last, len(l.doors))
}

func (l *Lane) freeLocked(vm string) {
	if p, ok := l.doors[vm]; ok {
		delete(l.doors, vm)
		delete(l.used, p)
	}
	if a, ok := l.guests[vm]; ok {
		delete(l.guests, vm)
		delete(l.guestOf, a)
	}
}

// guestUsable reports whether a can be a guest's address: in the subnet,
// neither its network nor its broadcast address, not the door's.
func (l *Lane) guestUsable(a netip.Addr) bool {
	if !a.Is4() || !l.subnet.Contains(a) || a == l.addr || a == l.subnet.Addr() {
		return false
	}
	b := a.As4()
	host := binary.BigEndian.Uint32(b[:]) &^ (^uint32(0) << (32 - l.subnet.Bits()))
	return host != ^uint32(0)>>l.subnet.Bits()
}

// hosts is the number of addresses of the subnet, network and broadcast
// included.
func (l *Lane) hosts() uint32 { return uint32(1) << (32 - l.subnet.Bits()) }

func (l *Lane) nth(i uint32) netip.Addr {
	b := l.subnet.Addr().As4()
	var out [4]byte
	binary.BigEndian.PutUint32(out[:], binary.BigEndian.Uint32(b[:])+i%l.hosts())
	return netip.AddrFrom4(out)
}

// allocGuestLocked gives vm a guest address: the one it holds, else want
// when usable, free and not pinned by anyone else, else the first such
// one from the address its id derives. pinned are the bridge's permanent
// neighbour entries (a pin of vm's own MAC is its own, not another's).
func (l *Lane) allocGuestLocked(vm string, mac net.HardwareAddr, want netip.Addr, pinned map[netip.Addr]net.HardwareAddr) (netip.Addr, error) {
	if a, ok := l.guests[vm]; ok {
		return a, nil
	}
	free := func(a netip.Addr) bool {
		if _, taken := l.guestOf[a]; taken || !l.guestUsable(a) {
			return false
		}
		m, ok := pinned[a]
		return !ok || bytes.Equal(m, mac)
	}
	take := func(a netip.Addr) netip.Addr { l.guests[vm], l.guestOf[a] = a, vm; return a }
	if free(want) {
		return take(want), nil
	}
	sum := sha256.Sum256([]byte("ip/" + vm))
	start := binary.BigEndian.Uint32(sum[:4])
	for i := range l.hosts() {
		if a := l.nth(start + i); free(a) {
			return take(a), nil
		}
	}
	return netip.Addr{}, fmt.Errorf("%w in %s (%d VMs)", ErrAddrsExhausted, l.subnet, len(l.guests))
}

func (l *Lane) lock(tap string, mac net.HardwareAddr, port uint16, guest netip.Addr) Lock {
	return Lock{Tap: tap, GuestMAC: mac, GuestIP: guest, Door: netip.AddrPortFrom(l.addr, port), DoorMAC: l.mac}
}

func (l *Lane) pins() (map[netip.Addr]net.HardwareAddr, error) {
	if l.ops.Pins == nil {
		return nil, nil
	}
	return l.ops.Pins(l.bridge)
}

func (l *Lane) pin(lk Lock) error {
	if l.ops.Pin == nil {
		return nil
	}
	return l.ops.Pin(l.bridge, lk.GuestIP, lk.GuestMAC)
}

func (l *Lane) unpin(ip netip.Addr, mac net.HardwareAddr) error {
	if l.ops.Unpin == nil || !ip.IsValid() {
		return nil
	}
	return l.ops.Unpin(l.bridge, ip, mac)
}

// Lock gives vm a door port and a guest address, isolates its tap on the
// bridge, installs the tap's lock (tap, the guest NIC's mac) and pins the
// address to mac. Call it after the tap exists and before the VMM opens
// it. A VM already locked is locked again with the same port and address
// (a re-run).
func (l *Lane) Lock(vm, tap string, mac net.HardwareAddr) (Lease, error) {
	pinned, err := l.pins()
	if err != nil {
		return Lease{}, err
	}
	l.mu.Lock()
	p, err := l.allocLocked(vm, 0)
	var g netip.Addr
	if err == nil {
		if g, err = l.allocGuestLocked(vm, mac, netip.Addr{}, pinned); err != nil {
			l.freeLocked(vm)
		}
	}
	l.mu.Unlock()
	if err != nil {
		return Lease{}, err
	}
	if err := l.isolate(tap); err != nil {
		return Lease{}, err
	}
	lk := l.lock(tap, mac, p, g)
	if err := l.ops.Install(lk); err != nil {
		return Lease{}, err
	}
	if err := l.pin(lk); err != nil {
		return Lease{}, err
	}
	return Lease{Door: lk.Door, Guest: netip.PrefixFrom(g, l.subnet.Bits())}, nil
}

func (l *Lane) isolate(tap string) error {
	if l.ops.Isolate == nil {
		return nil
	}
	return l.ops.Isolate(tap)
}

// Unlock removes the pin of vm's guest address and the lock of its tap,
// and frees its port and address. Call it once the VMM is gone and the tap
// deleted (the kernel keeps a netdev table whose device went away, so the
// order leaves no moment with an unlocked tap); a VM never locked is fine.
// The pin goes first: a crash in between leaves a lock no VM owns, whose
// address the next Reconcile reads back and unpins.
func (l *Lane) Unlock(vm, tap string, mac net.HardwareAddr) error {
	l.mu.Lock()
	g := l.guests[vm]
	l.mu.Unlock()
	if err := l.unpin(g, mac); err != nil {
		return err
	}
	if err := l.ops.Remove(tap); err != nil {
		return err
	}
	l.mu.Lock()
	l.freeLocked(vm)
	l.mu.Unlock()
	return nil
}

// Member is an egress VM the state says has (or may have) a tap.
type Member struct {
	VM  string
	Tap string
	MAC net.HardwareAddr
}

// Report says what Reconcile found and did.
type Report struct {
	// Kept: locks that were right, with their doors (and their taps
	// isolated).
	Kept int
	// Repaired: members whose tap had no lock, or a wrong one, now locked
	// and isolated.
	Repaired []string
	// NoTap: members without a tap (nothing to lock: no guest can send).
	NoTap []string
	// Removed: taps whose table (this instance's) no member owns,
	// unlocked; a tap still there was deleted first.
	Removed []string
	// Stray: taps no member owns that could not be deleted, with why. Their
	// lock stays: a VMM the state does not know may still run behind one
	// (the caller's reconcile stops it later).
	Stray map[string]error
	// Failed: members whose tap could not be locked or isolated, with why.
	// Their guest may have open egress, or reach other guests: the caller
	// must stop their VMMs.
	Failed map[string]error
}

// Reconcile brings the kernel in line with members at start-up, before
// anything else uses the lane: the bridge's guard (guard.go) installed,
// one read of the instance's tables, then a repair per member whose lock is
// missing or wrong (a tap that exists is never left without one: Install
// replaces atomically), every member's tap isolated, then the removal of
// the instance's tables no member owns, each after its tap if that still
// exists. Those include orphans: the table of a tap deleted by a destroy or
// rollback whose unlock failed or was held back. Door ports are taken from the locks found, so every door stays where
// its guest knows it. Other instances' tables are never read or touched.
func (l *Lane) Reconcile(members []Member) (Report, error) {
	rep := Report{Failed: map[string]error{}, Stray: map[string]error{}}
	if l.ops.Guard != nil {
		if err := l.ops.Guard(Guard{Bridge: l.bridge, Addr: l.addr, Ports: l.ports, TapPrefix: l.prefix}); err != nil {
			return rep, err
		}
	}
	tables, err := l.ops.Tables()
	if err != nil {
		return rep, err
	}
	pinned, err := l.pins()
	if err != nil {
		return rep, err
	}
	// Adopt the right locks first, so their ports and addresses are taken
	// before any repair allocates one.
	l.mu.Lock()
	var kept, repair []Member
	owned := map[string]bool{}
	for _, m := range members {
		owned[m.Tap] = true
		st, ok := tables[m.Tap]
		want := l.lock(m.Tap, m.MAC, st.Lock.Door.Port(), st.Lock.GuestIP)
		if ok && st.OK && st.Lock.Equal(want) {
			if _, taken := l.used[want.Door.Port()]; !taken && l.inRange(want.Door.Port()) {
				if _, err := l.allocLocked(m.VM, want.Door.Port()); err == nil {
					if g, err := l.allocGuestLocked(m.VM, m.MAC, want.GuestIP, pinned); err == nil && g == want.GuestIP {
						kept = append(kept, m)
						continue
					}
					l.freeLocked(m.VM)
				}
			}
		}
		repair = append(repair, m)
	}
	l.mu.Unlock()
	for _, m := range kept {
		err := l.isolate(m.Tap)
		if err == nil {
			l.mu.Lock()
			lk := l.lock(m.Tap, m.MAC, l.doors[m.VM], l.guests[m.VM])
			l.mu.Unlock()
			if err = l.pin(lk); err != nil {
				rep.Failed[m.VM] = err
				continue
			}
		}
		if err != nil {
			// A lock whose tap is gone (deleted, not yet unlocked) is
			// not a failure: there is no guest behind it to stop.
			if exists, terr := l.ops.TapExists(m.Tap); terr == nil && !exists {
				_ = l.ops.Remove(m.Tap)
				l.mu.Lock()
				l.freeLocked(m.VM)
				l.mu.Unlock()
				rep.NoTap = append(rep.NoTap, m.VM)
				continue
			}
			rep.Failed[m.VM] = err
			continue
		}
		rep.Kept++
	}
	for _, m := range repair {
		exists, err := l.ops.TapExists(m.Tap)
		if err != nil {
			rep.Failed[m.VM] = err
			continue
		}
		if !exists {
			if _, had := tables[m.Tap]; had {
				_ = l.ops.Remove(m.Tap)
			}
			rep.NoTap = append(rep.NoTap, m.VM)
			continue
		}
		l.mu.Lock()
		p, err := l.allocLocked(m.VM, tables[m.Tap].Lock.Door.Port())
		var g netip.Addr
		if err == nil {
			g, err = l.allocGuestLocked(m.VM, m.MAC, tables[m.Tap].Lock.GuestIP, pinned)
		}
		l.mu.Unlock()
		if err == nil {
			err = l.isolate(m.Tap)
		}
		if err == nil {
			lk := l.lock(m.Tap, m.MAC, p, g)
			if err = l.ops.Install(lk); err == nil {
				err = l.pin(lk)
			}
		}
		if err != nil {
			rep.Failed[m.VM] = err
			continue
		}
		rep.Repaired = append(rep.Repaired, m.VM)
	}
	for tap := range tables {
		if owned[tap] {
			continue
		}
		// A tap no member owns may still have a guest behind it (a run
		// dir the state does not own, whose VMM the caller stops later):
		// the tap goes before its lock, as everywhere, so that guest is
		// never on an unlocked tap.
		exists, err := l.ops.TapExists(tap)
		if err == nil && exists {
			if l.ops.DeleteTap == nil {
				err = errors.New("tap exists and this lane cannot delete taps")
			} else {
				err = l.ops.DeleteTap(tap)
			}
		}
		if err != nil {
			rep.Stray[tap] = err
			continue
		}
		// Its address's pin (if still its guest's) before the lock.
		if st := tables[tap]; st.OK {
			if err := l.unpin(st.Lock.GuestIP, st.Lock.GuestMAC); err != nil {
				return rep, err
			}
		}
		if err := l.ops.Remove(tap); err != nil {
			return rep, err
		}
		rep.Removed = append(rep.Removed, tap)
	}
	sort.Strings(rep.Removed)
	sort.Strings(rep.NoTap)
	return rep, nil
}

func (l *Lane) inRange(p uint16) bool { return p >= l.ports.First && p <= l.ports.Last }
