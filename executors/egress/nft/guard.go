package nft

import (
	"fmt"
	"net/netip"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// Guard closes the lane's door ports to every port of the bridge that is
// not a VM tap. A door's sandbox is known by the port a connection reaches,
// and each tap's lock admits only its own; the guard makes sure nothing
// else on the bridge (an uplink, another device an operator attached)
// reaches a door and speaks as a sandbox:
//
//	table bridge sbx_egress_<tag>_guard {
//	    chain input {
//	        type filter hook input priority filter; policy accept;
//	        meta protocol ip ip daddr <door ip> meta l4proto tcp tcp dport <first>-<last> iifname != "<tap prefix>*" counter drop
//	    }
//	}
//
// (The door address, not the bridge's name, says which frames: matching a
// bridge by name needs nft's bridge meta module, which kernels may lack.)
//
// The guard sees only frames that cross the bridge: a connection from the
// host itself (loopback) or routed in through another interface never meets
// it. Those the kernel refuses in a second table, installed with the guard
// in the same transaction, on the IP input path:
//
//	table inet sbx_egress_<tag>_doors {
//	    chain input {
//	        type filter hook input priority filter; policy accept;
//	        meta protocol ip ip daddr <door ip> meta l4proto tcp tcp dport <first>-<last> iifname != "<bridge>" counter reject with tcp reset comment "sbx-egress local"
//	    }
//	}
//
// so a process on the host (its packets arrive on lo) or a neighbour that
// routes the door address in through an uplink gets a reset, never a door
// that would speak as a sandbox. The proxy keeps its own checks (each
// door's listener is bound to the bridge device and closes a connection
// from one of the host's addresses). Each Owner has its own guard, for its
// own lane's door ports.
type Guard struct {
	Bridge    string
	Addr      netip.Addr
	Ports     PortRange
	TapPrefix string
}

// ifname is an interface name as the kernel compares it: IFNAMSIZ bytes,
// zero padded, so the compare is exact (not a prefix).
func ifname(name string) []byte {
	b := make([]byte, unix.IFNAMSIZ)
	copy(b, name)
	return b
}

// doorsFrom matches TCP to a door port of the door address whose input
// interface's name is not iif (compared as far as iif goes: a prefix when
// it is shorter than IFNAMSIZ, an exact name when padded to it).
func (g Guard) doorsFrom(iif []byte) []expr.Any {
	a := g.Addr.As4()
	return cat(
		proto(ethPIPv4),
		[]expr.Any{load(expr.PayloadBaseNetworkHeader, ipDst, 4), eq(a[:])},
		l4(unix.IPPROTO_TCP),
		[]expr.Any{
			load(expr.PayloadBaseTransportHeader, l4DstPort, 2),
			&expr.Range{Op: expr.CmpOpEq, Register: 1, FromData: be16(g.Ports.First), ToData: be16(g.Ports.Last)},
			&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: iif},
		})
}

// localExprs is the rule of the doors table: TCP to a door port on the
// door address that did not come in through the bridge is reset.
func (g Guard) localExprs() []expr.Any {
	return cat(g.doorsFrom(ifname(g.Bridge)), []expr.Any{&expr.Counter{}, &expr.Reject{Type: unix.NFT_REJECT_TCP_RST}})
}

// exprs is the guard's rule: a prefix compare of the bridge port's name
// (the name's first bytes only, as nft's "sbx*").
func (g Guard) exprs() []expr.Any {
	return cat(g.doorsFrom([]byte(g.TapPrefix)), verdict(expr.VerdictDrop))
}

// InstallGuard replaces o's guard table (Owner.GuardTableName) and its
// doors table (Owner.DoorsTableName) with g's, atomically. Another owner's
// are left alone: each instance's keep its own lane's door ports.
func (o Owner) InstallGuard(g Guard) error {
	if err := o.check(); err != nil {
		return err
	}
	if !g.Addr.Is4() || g.TapPrefix == "" || g.Ports.First == 0 || g.Ports.Last < g.Ports.First ||
		g.Bridge == "" || len(g.Bridge) >= unix.IFNAMSIZ {
		return fmt.Errorf("%w: guard %+v", ErrInvalid, g)
	}
	t, dt := o.guardTable(), o.doorsTable()
	c, err := replaceTable(t, dt)
	if err != nil {
		return err
	}
	accept := nftables.ChainPolicyAccept
	input := func(t *nftables.Table) *nftables.Chain {
		return c.AddChain(&nftables.Chain{
			Name: "input", Table: t, Type: nftables.ChainTypeFilter,
			Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter, Policy: &accept,
		})
	}
	c.AddRule(&nftables.Rule{Table: t, Chain: input(t), Exprs: g.exprs(), UserData: comment("guard")})
	c.AddRule(&nftables.Rule{Table: dt, Chain: input(dt), Exprs: g.localExprs(), UserData: comment("local")})
	if err := c.Flush(); err != nil {
		return fmt.Errorf("nft: guard of %s (%s): %w", g.Bridge, g.Addr, err)
	}
	return nil
}

// GuardDrops reads the drop counter of o's guard.
func (o Owner) GuardDrops() (Counter, error) { return o.inputCounter(o.guardTable()) }

// LocalRefusals reads the counter of o's doors table: the connections to a
// door that did not come through the bridge, reset by the kernel.
func (o Owner) LocalRefusals() (Counter, error) { return o.inputCounter(o.doorsTable()) }

func (o Owner) inputCounter(t *nftables.Table) (Counter, error) {
	if err := o.check(); err != nil {
		return Counter{}, err
	}
	c, err := nftables.New()
	if err != nil {
		return Counter{}, fmt.Errorf("nft: %w", err)
	}
	rules, err := c.GetRules(t, &nftables.Chain{Name: "input", Table: t})
	if err != nil {
		return Counter{}, fmt.Errorf("nft: rules of %s: %w", t.Name, err)
	}
	var sum Counter
	for _, r := range rules {
		k := counterOf(r.Exprs)
		sum.Packets += k.Packets
		sum.Bytes += k.Bytes
	}
	return sum, nil
}
