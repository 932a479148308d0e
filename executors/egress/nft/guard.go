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
// it. Keeping those from the doors is the proxy's part: it binds each door's
// listener to the bridge device. Each Owner has its own guard, for its own
// lane's door ports.
type Guard struct {
	Bridge    string
	Addr      netip.Addr
	Ports     PortRange
	TapPrefix string
}

func (g Guard) exprs() []expr.Any {
	a := g.Addr.As4()
	return cat(
		proto(ethPIPv4),
		[]expr.Any{load(expr.PayloadBaseNetworkHeader, ipDst, 4), eq(a[:])},
		l4(unix.IPPROTO_TCP),
		[]expr.Any{
			load(expr.PayloadBaseTransportHeader, l4DstPort, 2),
			&expr.Range{Op: expr.CmpOpEq, Register: 1, FromData: be16(g.Ports.First), ToData: be16(g.Ports.Last)},
			&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
			// A prefix compare: the name's first bytes only, as nft's "sbx*".
			&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: []byte(g.TapPrefix)},
		},
		verdict(expr.VerdictDrop))
}

// InstallGuard replaces o's guard table (Owner.GuardTableName) with g's,
// atomically. Another owner's guard is left alone: each instance's keeps
// its own lane's door ports.
func (o Owner) InstallGuard(g Guard) error {
	if err := o.check(); err != nil {
		return err
	}
	if !g.Addr.Is4() || g.TapPrefix == "" || g.Ports.First == 0 || g.Ports.Last < g.Ports.First {
		return fmt.Errorf("%w: guard %+v", ErrInvalid, g)
	}
	t := o.guardTable()
	c, err := replaceTable(t)
	if err != nil {
		return err
	}
	accept := nftables.ChainPolicyAccept
	ch := c.AddChain(&nftables.Chain{
		Name: "input", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter, Policy: &accept,
	})
	c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: g.exprs(), UserData: comment("guard")})
	if err := c.Flush(); err != nil {
		return fmt.Errorf("nft: guard of %s (%s): %w", g.Bridge, g.Addr, err)
	}
	return nil
}

// GuardDrops reads the drop counter of o's guard.
func (o Owner) GuardDrops() (Counter, error) {
	if err := o.check(); err != nil {
		return Counter{}, err
	}
	c, err := nftables.New()
	if err != nil {
		return Counter{}, fmt.Errorf("nft: %w", err)
	}
	t := o.guardTable()
	rules, err := c.GetRules(t, &nftables.Chain{Name: "input", Table: t})
	if err != nil {
		return Counter{}, fmt.Errorf("nft: guard rules: %w", err)
	}
	var sum Counter
	for _, r := range rules {
		k := counterOf(r.Exprs)
		sum.Packets += k.Packets
		sum.Bytes += k.Bytes
	}
	return sum, nil
}
