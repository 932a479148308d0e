package netguard

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
)

func TestInternal(t *testing.T) {
	for _, tc := range []struct {
		ip   string
		want bool
	}{
		{"127.0.0.1", true},
		{"127.5.5.5", true},
		{"::1", true},
		{"0.0.0.0", true},
		{"::", true},
		{"10.0.0.1", true},
		{"10.203.0.1", true},
		{"172.16.0.1", true},
		{"172.31.255.255", true},
		{"172.32.0.1", false},
		{"192.168.1.1", true},
		{"100.64.0.1", true},
		{"100.127.255.255", true},
		{"100.128.0.1", false},
		{"169.254.169.254", true},
		{"169.254.0.1", true},
		{"fe80::1", true},
		{"fc00::1", true},
		{"fd12:3456::1", true},
		{"224.0.0.1", true},
		{"ff02::1", true},
		{"255.255.255.255", true},
		{"192.0.2.10", true},
		{"198.18.0.1", true},
		{"203.0.113.7", true},
		{"240.0.0.1", true},
		{"2001:db8::1", true},
		{"::ffff:10.0.0.1", true},   // v4-mapped
		{"64:ff9b::a00:1", true},    // NAT64 of 10.0.0.1
		{"64:ff9b::808:808", false}, // NAT64 of 8.8.8.8
		{"8.8.8.8", false},
		{"1.1.1.1", false},
		{"::ffff:1.1.1.1", false},
		{"2606:4700:4700::1111", false},
		// A zone hides an address from prefix tests: every zoned one is internal.
		{"::%x", true},
		{"::1%lo", true},
		{"64:ff9b::a00:1%x", true},   // NAT64 of 10.0.0.1, zoned
		{"64:ff9b::808:808%x", true}, // NAT64 of 8.8.8.8, zoned
		{"::ffff:10.0.0.1%x", true},
		{"2606:4700:4700::1111%eth0", true},
	} {
		if got := Internal(netip.MustParseAddr(tc.ip)); got != tc.want {
			t.Errorf("Internal(%s) = %v", tc.ip, got)
		}
	}
	if !Internal(netip.Addr{}) {
		t.Error("the zero address is not internal")
	}
}

func TestGuard(t *testing.T) {
	host := []netip.Addr{netip.MustParseAddr("203.0.114.5"), netip.MustParseAddr("2a01::5")}
	g, err := New([]string{"10.8.0.1/32:18090,9000", "fdc8::/16", "192.168.7.0/24"}, host)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		addr string
		ok   bool
	}{
		{"10.8.0.1:18090", true},
		{"10.8.0.1:9000", true},
		{"10.8.0.1:22", false},
		{"10.8.0.2:18090", false},
		{"[fdc8::7]:443", true},
		{"[fdc9::7]:443", false},
		{"192.168.7.9:1", true},
		{"[::ffff:10.8.0.1]:18090", true},
		{"[64:ff9b::a08:1]:9000", true}, // NAT64 of 10.8.0.1: unwrapped before the allow list
		{"203.0.114.5:443", false},      // the host's own (global) address
		{"[2a01::5]:443", false},
		{"203.0.114.6:443", true},
		{"169.254.169.254:80", false},
		{"127.0.0.1:7777", false},
		{"8.8.8.8:53", true},
		// Zoned: refused whatever the table, the allow list or the host says.
		{"[::%x]:7777", false},
		{"[64:ff9b::a00:1%x]:80", false},
		{"[64:ff9b::a08:1%x]:9000", false}, // NAT64 of the allowed 10.8.0.1, zoned
		{"[2a01::5%lo]:443", false},        // the host's own global address, zoned
		{"[2a01::6%eth0]:443", false},      // a global address, zoned
		{"[fdc8::7%x]:443", false},         // inside an allowed prefix, zoned
	} {
		err := g.CheckAddr(tc.addr)
		if (err == nil) != tc.ok {
			t.Errorf("CheckAddr(%s) = %v", tc.addr, err)
		}
		if err != nil {
			var be *BlockedError
			if !errors.Is(err, ErrInternal) || !errors.As(err, &be) || !strings.HasPrefix(err.Error(), "egress: blocked internal address ") {
				t.Errorf("CheckAddr(%s): error %v is not a *BlockedError", tc.addr, err)
			}
		}
	}
	if err := g.CheckAddr("not an address"); !errors.Is(err, ErrInternal) {
		t.Errorf("unparsable: %v", err)
	}
	var none *Guard
	if none.Check(netip.MustParseAddr("10.0.0.1"), 1) == nil || none.Check(netip.MustParseAddr("8.8.8.8"), 1) != nil {
		t.Error("a nil guard is not the fixed table")
	}
	open, err := New([]string{"0.0.0.0/0", "::/0"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if open.Check(netip.MustParseAddr("127.0.0.1"), 22) != nil || open.Check(netip.MustParseAddr("::1"), 22) != nil {
		t.Error("0.0.0.0/0 plus ::/0 does not turn the guard off")
	}
	for _, z := range []string{"::%x", "::1%lo", "2606:4700:4700::1111%eth0"} {
		if err := open.Check(netip.MustParseAddr(z), 22); !errors.Is(err, ErrInternal) {
			t.Errorf("open guard, %s: %v, want refused", z, err)
		}
		if err := none.Check(netip.MustParseAddr(z), 22); !errors.Is(err, ErrInternal) {
			t.Errorf("nil guard, %s: %v, want refused", z, err)
		}
	}
}

func TestParseAllow(t *testing.T) {
	e, err := ParseAllow([]string{"10.8.0.1/32:18090,9000", "fdc8::1/128:443", "10.9.0.0/16"})
	if err != nil || len(e) != 3 || len(e[0].Ports) != 2 || e[1].Ports[0] != 443 || e[2].Ports != nil {
		t.Fatalf("%+v %v", e, err)
	}
	for _, bad := range []string{"10.0.0.1", "10.0.0.0/33", "10.0.0.0/8:0", "10.0.0.0/8:65536", "10.0.0.0/8:80,80", "10.0.0.0/8:", "10.0.0.0/8:x", "nope/8"} {
		if _, err := ParseAllow([]string{bad}); err == nil {
			t.Errorf("ParseAllow(%q) accepted", bad)
		}
	}
}
