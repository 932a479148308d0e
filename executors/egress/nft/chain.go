package nft

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// chainInfo is a base chain as the kernel reports it. google/nftables does
// not read a chain's hook device back, and a lock whose chain hooks another
// device (or none: older kernels unhook a netdev chain whose device went
// away) filters nothing, so Inspect asks the kernel itself.
type chainInfo struct {
	exists  bool
	hook    bool
	hooknum uint32
	prio    int32
	devs    []string
	policy  uint32
	policyS bool
	typ     string
}

func (c chainInfo) problem(tap string) string {
	switch {
	case !c.exists:
		return "no chain " + ChainName
	case !c.hook:
		return "chain " + ChainName + " is not a base chain"
	case c.hooknum != uint32(*nftables.ChainHookIngress):
		return fmt.Sprintf("chain hooks %d, not ingress", c.hooknum)
	case !slices.Equal(c.devs, []string{tap}):
		return fmt.Sprintf("chain hooks devices %q, not %q", c.devs, tap)
	case c.prio != int32(*nftables.ChainPriorityFilter):
		return fmt.Sprintf("chain priority %d", c.prio)
	case !c.policyS || c.policy != uint32(nftables.ChainPolicyDrop):
		return "chain policy is not drop"
	case c.typ != string(nftables.ChainTypeFilter):
		return fmt.Sprintf("chain type %q", c.typ)
	}
	return ""
}

// nftaHookDevs is NFTA_HOOK_DEVS (linux/netfilter/nf_tables.h), which
// x/sys/unix does not define: the list a netdev chain hooking several
// devices reports.
const nftaHookDevs = 0x4

func cstr(s string) []byte { return append([]byte(s), 0) }

func readChain(t *nftables.Table, name string) (chainInfo, error) {
	conn, err := netlink.Dial(unix.NETLINK_NETFILTER, nil)
	if err != nil {
		return chainInfo{}, fmt.Errorf("nft: %w", err)
	}
	defer conn.Close()
	attrs, err := netlink.MarshalAttributes([]netlink.Attribute{
		{Type: unix.NFTA_CHAIN_TABLE, Data: cstr(t.Name)},
		{Type: unix.NFTA_CHAIN_NAME, Data: cstr(name)},
	})
	if err != nil {
		return chainInfo{}, err
	}
	msgs, err := conn.Execute(netlink.Message{
		Header: netlink.Header{
			Type:  netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_GETCHAIN),
			Flags: netlink.Request,
		},
		Data: append([]byte{byte(t.Family), unix.NFNETLINK_V0, 0, 0}, attrs...),
	})
	if errors.Is(err, unix.ENOENT) {
		return chainInfo{}, nil
	}
	if err != nil {
		return chainInfo{}, fmt.Errorf("nft: chain %s of %s: %w", name, t.Name, err)
	}
	if len(msgs) != 1 || len(msgs[0].Data) < 4 {
		return chainInfo{}, fmt.Errorf("nft: chain %s of %s: %d answers", name, t.Name, len(msgs))
	}
	info := chainInfo{exists: true}
	ad, err := netlink.NewAttributeDecoder(msgs[0].Data[4:])
	if err != nil {
		return info, err
	}
	ad.ByteOrder = binary.BigEndian
	for ad.Next() {
		switch ad.Type() {
		case unix.NFTA_CHAIN_HOOK:
			info.hook = true
			ad.Nested(func(h *netlink.AttributeDecoder) error {
				for h.Next() {
					switch h.Type() {
					case unix.NFTA_HOOK_HOOKNUM:
						info.hooknum = h.Uint32()
					case unix.NFTA_HOOK_PRIORITY:
						info.prio = int32(h.Uint32())
					case unix.NFTA_HOOK_DEV:
						info.devs = append(info.devs, h.String())
					case nftaHookDevs:
						h.Nested(func(d *netlink.AttributeDecoder) error {
							for d.Next() {
								info.devs = append(info.devs, d.String())
							}
							return nil
						})
					}
				}
				return nil
			})
		case unix.NFTA_CHAIN_POLICY:
			info.policy, info.policyS = ad.Uint32(), true
		case unix.NFTA_CHAIN_TYPE:
			info.typ = ad.String()
		}
	}
	// A kernel that reports NFTA_HOOK_DEVS reports the first device as
	// NFTA_HOOK_DEV too.
	slices.Sort(info.devs)
	info.devs = slices.Compact(info.devs)
	return info, ad.Err()
}
