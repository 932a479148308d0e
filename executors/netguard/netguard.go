// Package netguard is the guarded egress's last word on a destination:
// whatever a policy allowed by name, the proxy connects only to addresses
// this guard admits. It is the old daemon's rule:
//
//   - the address being connected (after resolution, in the dialer's
//     Control hook, so a name that resolves or rebinds to an internal
//     address is caught) is first unwrapped: v4-mapped IPv6 to IPv4, and
//     NAT64 (64:ff9b::/96) to its embedded IPv4;
//   - an IPv6 address with a zone ("::%eth0") is refused, whatever the
//     allow list: a zone names a link, never a destination on the
//     internet, and netip's prefix tests and equality do not see through
//     it (Linux connects "::%x" to loopback, and a zoned host address is
//     still the host);
//   - an address egress_internal_allow admits (a prefix, and the port when
//     the entry names ports) may be connected: an explicit entry wins;
//   - otherwise an internal address is refused: not global unicast
//     (loopback, unspecified, multicast, link-local), private (RFC 1918,
//     IPv6 ULA), link-local (169.254/16 with cloud metadata, fe80::/10),
//     CGNAT 100.64/10 and the other special-purpose ranges, and the host's
//     own addresses (passed in: they may be global);
//   - everything else may be connected.
//
// Check is pure over netip values; LocalAddrs, which lists the host's
// addresses, is the package's only I/O.
package netguard

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
)

// ErrInternal matches every refusal (errors.Is).
var ErrInternal = errors.New("egress: blocked internal address")

// BlockedError is Check's refusal of one address.
type BlockedError struct {
	Addr netip.Addr
	Port uint16
}

func (e *BlockedError) Error() string { return "egress: blocked internal address " + e.Addr.String() }

// Is makes errors.Is(err, ErrInternal) true.
func (e *BlockedError) Is(target error) bool { return target == ErrInternal }

// Entry is one egress_internal_allow entry: a prefix and, when Ports is
// not empty, only those ports.
type Entry struct {
	Prefix netip.Prefix
	Ports  []uint16
}

// internalRanges are the special-purpose ranges refused beside what
// netip's predicates cover (the old daemon's table).
var internalRanges = func() []netip.Prefix {
	var out []netip.Prefix
	for _, s := range []string{
		"0.0.0.0/8", "100.64.0.0/10", "192.0.0.0/24", "192.0.2.0/24", "192.88.99.2/32", "198.18.0.0/15",
		"198.51.100.0/24", "203.0.113.0/24", "240.0.0.0/4", "::/96", "64:ff9b:1::/48", "100::/64",
		"100:0:0:1::/64", "2001::/23", "2001:db8::/32", "2002::/16", "3fff::/20", "5f00::/16",
	} {
		out = append(out, netip.MustParsePrefix(s))
	}
	return out
}()

var nat64 = netip.MustParsePrefix("64:ff9b::/96")

// Unwrap returns the address a connection to ip reaches: a v4-mapped
// IPv6 address as IPv4, a NAT64 address as its embedded IPv4.
func Unwrap(ip netip.Addr) netip.Addr {
	ip = ip.Unmap()
	if ip.Is6() && nat64.Contains(ip) {
		b := ip.As16()
		return netip.AddrFrom4([4]byte{b[12], b[13], b[14], b[15]})
	}
	return ip
}

// Internal reports whether ip (unwrapped first) is internal by the fixed
// table, with no allow list and no host addresses. Every zoned address
// is.
func Internal(ip netip.Addr) bool {
	ip = Unwrap(ip)
	if !ip.IsValid() || ip.Zone() != "" || !ip.IsGlobalUnicast() || ip.IsPrivate() || ip.IsLinkLocalUnicast() || ip.IsLinkLocalMulticast() {
		return true
	}
	return slices.ContainsFunc(internalRanges, func(p netip.Prefix) bool { return p.Contains(ip) })
}

// Guard is one node's guard; immutable, safe for concurrent use.
type Guard struct {
	allow []Entry
	host  map[netip.Addr]bool
}

// New builds a guard from egress_internal_allow entries ("CIDR" or
// "CIDR:port,port", e.g. "10.8.0.1/32:18090,9000", "fdc8::1/128:443")
// and the host's own addresses.
func New(allow []string, hostAddrs []netip.Addr) (*Guard, error) {
	entries, err := ParseAllow(allow)
	if err != nil {
		return nil, err
	}
	g := &Guard{allow: entries, host: make(map[netip.Addr]bool, len(hostAddrs))}
	for _, a := range hostAddrs {
		g.host[Unwrap(a).WithZone("")] = true
	}
	return g, nil
}

// ParseAllow parses egress_internal_allow entries.
func ParseAllow(entries []string) ([]Entry, error) {
	out := make([]Entry, 0, len(entries))
	for i, s := range entries {
		e, err := parseEntry(s)
		if err != nil {
			return nil, fmt.Errorf("egress_internal_allow[%d] %q: %w", i, s, err)
		}
		out = append(out, e)
	}
	return out, nil
}

func parseEntry(s string) (Entry, error) {
	slash := strings.IndexByte(s, '/')
	if slash < 0 {
		return Entry{}, errors.New("want CIDR or CIDR:port,port")
	}
	cidr, ports := s, ""
	if c := strings.IndexByte(s[slash:], ':'); c >= 0 {
		cidr, ports = s[:slash+c], s[slash+c+1:]
		if ports == "" {
			return Entry{}, errors.New("empty port list after ':'")
		}
	}
	p, err := netip.ParsePrefix(cidr)
	if err != nil {
		return Entry{}, err
	}
	e := Entry{Prefix: p.Masked()}
	if ports != "" {
		for _, f := range strings.Split(ports, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			switch {
			case err != nil:
				return Entry{}, fmt.Errorf("port %q: %w", f, err)
			case n <= 0 || n > 65535:
				return Entry{}, fmt.Errorf("port %d out of [1, 65535]", n)
			case slices.Contains(e.Ports, uint16(n)):
				return Entry{}, fmt.Errorf("port %d repeated", n)
			}
			e.Ports = append(e.Ports, uint16(n))
		}
	}
	return e, nil
}

// Admits reports whether an entry admits ip:port.
func (e Entry) Admits(ip netip.Addr, port uint16) bool {
	if !e.Prefix.Contains(ip) {
		return false
	}
	return len(e.Ports) == 0 || slices.Contains(e.Ports, port)
}

// Check says whether the proxy may connect to ip:port: nil, or a
// *BlockedError. A nil guard checks the fixed table only. A zoned address
// is refused before the allow list is read.
func (g *Guard) Check(ip netip.Addr, port uint16) error {
	ip = Unwrap(ip)
	if ip.Zone() != "" {
		return &BlockedError{Addr: ip, Port: port}
	}
	if g != nil && slices.ContainsFunc(g.allow, func(e Entry) bool { return e.Admits(ip, port) }) {
		return nil
	}
	if Internal(ip) || (g != nil && g.host[ip]) {
		return &BlockedError{Addr: ip, Port: port}
	}
	return nil
}

// CheckAddr is Check of a "host:port" a dialer's Control hook is given
// (the host an IP literal).
func (g *Guard) CheckAddr(address string) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrInternal, err)
	}
	return g.Check(ap.Addr(), ap.Port())
}

// LocalAddrs lists the host's own interface addresses, for New.
func LocalAddrs() ([]netip.Addr, error) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil, err
	}
	var out []netip.Addr
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(n.IP); ok {
				out = append(out, ip.Unmap())
			}
		}
	}
	return out, nil
}
