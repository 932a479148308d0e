// Package nft locks the taps of `net: egress` VMs with nftables, spoken
// through netlink (github.com/google/nftables; no nft binary): a guest's
// only way out of its tap is the TCP door of its own egress proxy.
//
// One table per tap, in the namespace of the calling OS thread (the host's),
// named for its Owner (the sandboxd instance) and the tap. The ruleset of a
// Lock, in nft's own syntax (Owner.Ruleset prints it):
//
//	table netdev sbx_egress_<tag>_<tap> {
//	    chain ingress {
//	        type filter hook ingress device "<tap>" priority filter; policy drop;
//	        ether saddr != <guest mac> counter drop comment "sbx-egress spoof"
//	        meta protocol arp arp saddr ether <guest mac> arp saddr ip <guest ip> counter accept comment "sbx-egress arp"
//	        ether daddr <door mac> meta protocol ip ip saddr <guest ip> ip daddr <door ip> meta l4proto tcp tcp dport <door port> counter accept comment "sbx-egress door"
//	        counter drop comment "sbx-egress drop"
//	    }
//	}
//
// The ingress hook of a tap sees every frame the guest sends (the VMM writes
// them into the tap), before the bridge: frames not from the guest's own
// MAC, anything but IPv4 from the guest's address to the door and ARP
// naming the guest's MAC and address (what a guest needs to find the
// door's MAC) is dropped, IPv6 included. Frames to the host go nowhere
// else. The counters of the spoof and drop rules are what a bypass attempt
// moves.
//
// The guest's address is the host's choice (Lane allocates one per VM and
// the driver gives it to the guest), so the lock pins the tap to it: a
// guest that claims another guest's address (in its ARP or as a source)
// is dropped, and the Lane's permanent neighbour entry on the bridge keeps
// the host sending that address's packets to its owner's MAC whatever ARP
// says. DHCP is dropped like the rest: nothing on the host serves it, and a
// broadcast the bridge floods to every port, an uplink included, would be
// a channel past the policy. A Lane also makes every tap it locks an
// isolated bridge port (Isolate), so what a lock admits reaches the host
// and no other guest.
//
// Contract:
//   - Every call is an Owner's and sees only that owner's tables: the tag
//     (a hash of the instance id) is in each table's name, so instances
//     sharing a host never install, inspect, list or remove each other's.
//   - Install(l) replaces the tap's table in one netlink batch, which
//     nftables commits atomically: a tap that had a lock never has none, and
//     one that had none gets the whole ruleset at once. The table is not
//     owned by the netlink socket: it outlives the daemon that installed it.
//   - Remove(tap) deletes it; a missing table is success. The kernel does not
//     delete a netdev table with its device, so destroying a VM removes both.
//   - Inspect(l) reports whether the kernel holds exactly l's ruleset (table,
//     base chain hooked to the tap with policy drop, the four rules) and its
//     counters; Tables lists every lock table of the owner, with the Lock
//     each holds when it is one.
//   - Every call opens its own netlink socket: none of them belongs on a
//     claim path (package doc of executors/egress/nft.Lane).
package nft

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"golang.org/x/sys/unix"
)

// TablePrefix starts every table this package makes; the owner's tag and
// the tap's name (or "guard") follow (Owner).
const TablePrefix = "sbx_egress_"

// ChainName is the base chain of every table.
const ChainName = "ingress"

// commentPrefix starts every rule's comment; the role follows.
const commentPrefix = "sbx-egress "

// Rule roles, in ruleset order: the comment of each rule and the key of
// Counters.
const (
	RoleSpoof = "spoof" // frames whose source MAC is not the guest's: dropped
	RoleARP   = "arp"   // ARP from the guest's MAC: accepted
	RoleDoor  = "door"  // TCP to the proxy door: accepted
	RoleDrop  = "drop"  // everything else: dropped
)

// Roles lists the rule roles in ruleset order.
var Roles = []string{RoleSpoof, RoleARP, RoleDoor, RoleDrop}

var (
	// ErrInvalid: a Lock that cannot be installed (bad tap name, MACs, a
	// door that is not an IPv4 address and port).
	ErrInvalid = errors.New("nft: invalid lock")
	// ErrNotLocked: the kernel holds no table for the tap.
	ErrNotLocked = errors.New("nft: tap not locked")
)

// Lock is the ruleset of one tap.
type Lock struct {
	// Tap is the device whose ingress is filtered.
	Tap string
	// GuestMAC is the MAC of the guest's NIC on the tap.
	GuestMAC net.HardwareAddr
	// GuestIP is the guest's IPv4 address on the bridge (the host's
	// choice): the only sender address its ARP and its packets may name.
	GuestIP netip.Addr
	// Door is the host address and port of the VM's egress proxy door.
	Door netip.AddrPort
	// DoorMAC is the MAC the door's address answers with (the bridge's).
	DoorMAC net.HardwareAddr
}

// Validate reports ErrInvalid for a Lock Install would refuse.
func (l Lock) Validate() error {
	switch {
	case l.Tap == "" || len(l.Tap) > 15 || strings.ContainsAny(l.Tap, "/: \t\n"):
		return fmt.Errorf("%w: tap %q", ErrInvalid, l.Tap)
	case len(l.GuestMAC) != 6:
		return fmt.Errorf("%w: guest MAC %q", ErrInvalid, l.GuestMAC)
	case !l.GuestIP.Is4() || l.GuestIP.IsUnspecified():
		return fmt.Errorf("%w: guest address %s is not an IPv4 address", ErrInvalid, l.GuestIP)
	case len(l.DoorMAC) != 6:
		return fmt.Errorf("%w: door MAC %q", ErrInvalid, l.DoorMAC)
	case !l.Door.Addr().Is4() || l.Door.Port() == 0:
		return fmt.Errorf("%w: door %s is not an IPv4 address and port", ErrInvalid, l.Door)
	}
	return nil
}

// Equal reports whether l and o are the same ruleset.
func (l Lock) Equal(o Lock) bool {
	return l.Tap == o.Tap && bytes.Equal(l.GuestMAC, o.GuestMAC) && l.GuestIP == o.GuestIP && l.Door == o.Door && bytes.Equal(l.DoorMAC, o.DoorMAC)
}

func (l Lock) String() string {
	return fmt.Sprintf("tap %s guest %s %s door %s (%s)", l.Tap, l.GuestMAC, l.GuestIP, l.Door, l.DoorMAC)
}

func chain(t *nftables.Table, tap string) *nftables.Chain {
	drop := nftables.ChainPolicyDrop
	return &nftables.Chain{
		Name: ChainName, Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookIngress, Priority: nftables.ChainPriorityFilter,
		Policy: &drop, Device: tap,
	}
}

// Layer offsets of the fields the rules match.
const (
	ethDst    = 0
	ethSrc    = 6
	arpSHA    = 8  // ARP sender hardware address (Ethernet, IPv4)
	arpSPA    = 14 // ARP sender protocol address (Ethernet, IPv4)
	ipSrc     = 12 // IPv4 source address
	ipDst     = 16 // IPv4 destination address
	l4DstPort = 2
	ethPIPv4  = 0x0800
	ethPARP   = 0x0806
)

func load(base expr.PayloadBase, off, n uint32) *expr.Payload {
	return &expr.Payload{DestRegister: 1, Base: base, Offset: off, Len: n}
}

func eq(data []byte) *expr.Cmp { return &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: data} }

func be16(v uint16) []byte { return binary.BigEndian.AppendUint16(nil, v) }

func proto(p uint16) []expr.Any {
	return []expr.Any{&expr.Meta{Key: expr.MetaKeyPROTOCOL, Register: 1}, eq(be16(p))}
}

func l4(p byte) []expr.Any {
	return []expr.Any{&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1}, eq([]byte{p})}
}

func verdict(k expr.VerdictKind) []expr.Any {
	return []expr.Any{&expr.Counter{}, &expr.Verdict{Kind: k}}
}

func cat(parts ...[]expr.Any) []expr.Any {
	var out []expr.Any
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// exprs returns the expressions of each role's rule.
func (l Lock) exprs() map[string][]expr.Any {
	door, guest := l.Door.Addr().As4(), l.GuestIP.As4()
	return map[string][]expr.Any{
		RoleSpoof: cat(
			[]expr.Any{load(expr.PayloadBaseLLHeader, ethSrc, 6), &expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: []byte(l.GuestMAC)}},
			verdict(expr.VerdictDrop)),
		RoleARP: cat(proto(ethPARP),
			[]expr.Any{load(expr.PayloadBaseNetworkHeader, arpSHA, 6), eq([]byte(l.GuestMAC))},
			[]expr.Any{load(expr.PayloadBaseNetworkHeader, arpSPA, 4), eq(guest[:])},
			verdict(expr.VerdictAccept)),
		RoleDoor: cat(
			[]expr.Any{load(expr.PayloadBaseLLHeader, ethDst, 6), eq([]byte(l.DoorMAC))},
			proto(ethPIPv4),
			[]expr.Any{load(expr.PayloadBaseNetworkHeader, ipSrc, 4), eq(guest[:])},
			[]expr.Any{load(expr.PayloadBaseNetworkHeader, ipDst, 4), eq(door[:])},
			l4(unix.IPPROTO_TCP),
			[]expr.Any{load(expr.PayloadBaseTransportHeader, l4DstPort, 2), eq(be16(l.Door.Port()))},
			verdict(expr.VerdictAccept)),
		RoleDrop: verdict(expr.VerdictDrop),
	}
}

func comment(role string) []byte {
	return userdata.AppendString(nil, userdata.TypeComment, commentPrefix+role)
}

// roleOf returns the role a rule's comment names ("" for none of ours).
func roleOf(r *nftables.Rule) string {
	c, ok := userdata.GetString(r.UserData, userdata.TypeComment)
	if !ok || !strings.HasPrefix(c, commentPrefix) {
		return ""
	}
	return strings.TrimPrefix(c, commentPrefix)
}

// Install replaces o's table of the tap with l's ruleset, atomically (see
// the package doc). The tap must exist.
func (o Owner) Install(l Lock) error {
	if err := o.check(); err != nil {
		return err
	}
	if err := l.Validate(); err != nil {
		return err
	}
	t := o.table(l.Tap)
	c, err := replaceTable(t)
	if err != nil {
		return err
	}
	ch := c.AddChain(chain(t, l.Tap))
	ex := l.exprs()
	for _, role := range Roles {
		c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: ex[role], UserData: comment(role)})
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("nft: lock %s: %w", l, err)
	}
	return nil
}

// replaceTable opens a netlink connection whose batch starts by replacing
// each of ts: deleting it where it exists, then adding it empty. The caller
// adds the chains and rules and flushes, so the kernel swaps the whole
// tables in one transaction (no moment without them).
func replaceTable(ts ...*nftables.Table) (*nftables.Conn, error) {
	c, err := nftables.New()
	if err != nil {
		return nil, fmt.Errorf("nft: %w", err)
	}
	for _, t := range ts {
		exists, err := tableExists(c, t)
		if err != nil {
			return nil, err
		}
		if exists {
			c.DelTable(t)
		}
		c.AddTable(t)
	}
	return c, nil
}

func tableExists(c *nftables.Conn, t *nftables.Table) (bool, error) {
	_, err := c.ListTableOfFamily(t.Name, t.Family)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, unix.ENOENT):
		return false, nil
	}
	return false, fmt.Errorf("nft: look up table %s: %w", t.Name, err)
}

// Remove deletes o's table of the tap; a missing one is success.
func (o Owner) Remove(tap string) error {
	if err := o.check(); err != nil {
		return err
	}
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("nft: %w", err)
	}
	t := o.table(tap)
	c.DelTable(t)
	if err := c.Flush(); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("nft: unlock %s: %w", tap, err)
	}
	return nil
}

// Counter is one rule's counter.
type Counter struct {
	Packets, Bytes uint64
}

// Counters are a table's counters by rule role.
type Counters map[string]Counter

// Dropped sums the counters of the rules that drop.
func (c Counters) Dropped() Counter {
	s, d := c[RoleSpoof], c[RoleDrop]
	return Counter{Packets: s.Packets + d.Packets, Bytes: s.Bytes + d.Bytes}
}

// State is what the kernel holds for one tap.
type State struct {
	Tap string
	// Lock is the ruleset found, read back from its rules; valid when OK.
	Lock Lock
	// OK: the table holds exactly one ruleset of this package: the base
	// chain hooked to the tap's ingress with policy drop, and the four
	// rules in order.
	OK bool
	// Problem says what is wrong when !OK.
	Problem  string
	Counters Counters
}

// Inspect reads o's table of the tap. ErrNotLocked when there is none
// (another owner's table of the same tap is not looked at).
func (o Owner) Inspect(tap string) (State, error) {
	if err := o.check(); err != nil {
		return State{}, err
	}
	c, err := nftables.New()
	if err != nil {
		return State{}, fmt.Errorf("nft: %w", err)
	}
	t := o.table(tap)
	exists, err := tableExists(c, t)
	if err != nil {
		return State{}, err
	}
	if !exists {
		return State{Tap: tap}, fmt.Errorf("%w: %s", ErrNotLocked, tap)
	}
	return inspect(c, t, tap)
}

func inspect(c *nftables.Conn, t *nftables.Table, tap string) (State, error) {
	st := State{Tap: tap, Counters: Counters{}}
	hook, err := readChain(t, ChainName)
	if err != nil {
		return st, err
	}
	if p := hook.problem(tap); p != "" {
		st.Problem = p
		return st, nil
	}
	rules, err := c.GetRules(t, &nftables.Chain{Name: ChainName, Table: t})
	if err != nil {
		return st, fmt.Errorf("nft: rules of %s: %w", t.Name, err)
	}
	for _, r := range rules {
		if role := roleOf(r); role != "" {
			st.Counters[role] = counterOf(r.Exprs)
		}
	}
	l, problem := parse(tap, rules)
	if problem != "" {
		st.Problem = problem
		return st, nil
	}
	want := l.exprs()
	for i, role := range Roles {
		if !sameExprs(rules[i].Exprs, want[role]) {
			st.Problem = fmt.Sprintf("rule %d (%s) differs from the lock's", i, role)
			return st, nil
		}
	}
	st.Lock, st.OK = l, true
	return st, nil
}

func counterOf(ex []expr.Any) Counter {
	for _, e := range ex {
		if c, ok := e.(*expr.Counter); ok {
			return Counter{Packets: c.Packets, Bytes: c.Bytes}
		}
	}
	return Counter{}
}

// parse reads the Lock back from a chain's rules: the roles in order, the
// guest MAC from the spoof rule, the guest address and the door from the
// door rule.
func parse(tap string, rules []*nftables.Rule) (Lock, string) {
	if len(rules) != len(Roles) {
		return Lock{}, fmt.Sprintf("%d rules, want %d", len(rules), len(Roles))
	}
	for i, role := range Roles {
		if got := roleOf(rules[i]); got != role {
			return Lock{}, fmt.Sprintf("rule %d is %q, want %q", i, got, role)
		}
	}
	l := Lock{Tap: tap}
	var cmps [][]byte
	for _, e := range rules[0].Exprs {
		if c, ok := e.(*expr.Cmp); ok {
			cmps = append(cmps, c.Data)
		}
	}
	if len(cmps) != 1 {
		return Lock{}, "spoof rule has no guest MAC"
	}
	l.GuestMAC = net.HardwareAddr(bytes.Clone(cmps[0]))
	cmps = cmps[:0]
	for _, e := range rules[slices.Index(Roles, RoleDoor)].Exprs {
		if c, ok := e.(*expr.Cmp); ok {
			cmps = append(cmps, c.Data)
		}
	}
	// door MAC, protocol, guest address, door address, l4 protocol, port
	// (a lock of an older release, without the guest address, is a
	// problem: Reconcile replaces it)
	if len(cmps) != 6 || len(cmps[0]) != 6 || len(cmps[2]) != 4 || len(cmps[3]) != 4 || len(cmps[5]) != 2 {
		return Lock{}, "door rule has an unexpected shape"
	}
	l.DoorMAC = net.HardwareAddr(bytes.Clone(cmps[0]))
	l.GuestIP = netip.AddrFrom4([4]byte(cmps[2]))
	l.Door = netip.AddrPortFrom(netip.AddrFrom4([4]byte(cmps[3])), binary.BigEndian.Uint16(cmps[5]))
	if err := l.Validate(); err != nil {
		return Lock{}, err.Error()
	}
	return l, ""
}

// sameExprs compares a rule read back with the one built, counters aside.
func sameExprs(got, want []expr.Any) bool {
	if len(got) != len(want) {
		return false
	}
	for i := range got {
		switch g := got[i].(type) {
		case *expr.Counter:
			if _, ok := want[i].(*expr.Counter); !ok {
				return false
			}
		case *expr.Payload:
			w, ok := want[i].(*expr.Payload)
			if !ok || g.Base != w.Base || g.Offset != w.Offset || g.Len != w.Len || g.DestRegister != w.DestRegister || g.OperationType != w.OperationType {
				return false
			}
		case *expr.Cmp:
			w, ok := want[i].(*expr.Cmp)
			if !ok || g.Op != w.Op || g.Register != w.Register || !bytes.Equal(g.Data, w.Data) {
				return false
			}
		case *expr.Meta:
			w, ok := want[i].(*expr.Meta)
			if !ok || g.Key != w.Key || g.Register != w.Register || g.SourceRegister != w.SourceRegister {
				return false
			}
		case *expr.Verdict:
			w, ok := want[i].(*expr.Verdict)
			if !ok || g.Kind != w.Kind || g.Chain != w.Chain {
				return false
			}
		default:
			return false
		}
	}
	return true
}

// Tables lists o's lock tables with what each holds, by tap. Tables of
// other owners, and any other table, are not listed.
func (o Owner) Tables() (map[string]State, error) {
	if err := o.check(); err != nil {
		return nil, err
	}
	c, err := nftables.New()
	if err != nil {
		return nil, fmt.Errorf("nft: %w", err)
	}
	ts, err := c.ListTablesOfFamily(nftables.TableFamilyNetdev)
	if err != nil {
		return nil, fmt.Errorf("nft: list tables: %w", err)
	}
	out := map[string]State{}
	for _, t := range ts {
		tap, ok := o.tapOf(t.Name)
		if !ok {
			continue
		}
		st, err := inspect(c, t, tap)
		if err != nil {
			return nil, err
		}
		out[tap] = st
	}
	return out, nil
}

// Ruleset renders o's table of l in nft's syntax, as the package doc shows
// it (for logs and docs; nothing parses it).
func (o Owner) Ruleset(l Lock) string {
	var b strings.Builder
	fmt.Fprintf(&b, "table netdev %s {\n    chain %s {\n", o.TableName(l.Tap), ChainName)
	fmt.Fprintf(&b, "        type filter hook ingress device %q priority filter; policy drop;\n", l.Tap)
	fmt.Fprintf(&b, "        ether saddr != %s counter drop comment %q\n", l.GuestMAC, commentPrefix+RoleSpoof)
	fmt.Fprintf(&b, "        meta protocol arp arp saddr ether %s arp saddr ip %s counter accept comment %q\n", l.GuestMAC, l.GuestIP, commentPrefix+RoleARP)
	fmt.Fprintf(&b, "        ether daddr %s meta protocol ip ip saddr %s ip daddr %s meta l4proto tcp tcp dport %d counter accept comment %q\n",
		l.DoorMAC, l.GuestIP, l.Door.Addr(), l.Door.Port(), commentPrefix+RoleDoor)
	fmt.Fprintf(&b, "        counter drop comment %q\n    }\n}\n", commentPrefix+RoleDrop)
	return b.String()
}
