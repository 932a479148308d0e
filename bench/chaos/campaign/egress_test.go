package campaign

import (
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/sbxlog/sbxlog/executors/egress/nft"
	"github.com/sbxlog/sbxlog/executors/tap"
	"github.com/sbxlog/sbxlog/projections/api"
)

// The lock check finds what it is for: an egress VM running unlocked or
// with a broken lock, a lock left for a VM the state no longer has; and
// nothing where locks match (VMs of other pools, egress VMs whose VMM does
// not run, locks of VMs being made).
func TestLockFindings(t *testing.T) {
	const egressPool, inst = "egress/egress/small", "chaos-inst"
	vm := func(name, state, pool string, live bool) api.VM {
		return api.VM{Name: name, State: state, Pool: pool, Live: live}
	}
	locked := func(names ...string) map[string]nft.State {
		m := map[string]nft.State{}
		for _, n := range names {
			m[tap.Name(inst, n)] = nft.State{Tap: tap.Name(inst, n), OK: true}
		}
		return m
	}
	for _, tc := range []struct {
		name string
		v    lockView
		want []string
	}{
		{"all locked", lockView{inst: inst,
			vms:    []api.VM{vm("vm-1", "claimed", egressPool, true), vm("vm-2", "warm", "default/none/small", true), vm("vm-3", "cloning", egressPool, true)},
			vmms:   map[string]bool{"vm-1": true, "vm-2": true},
			tables: locked("vm-1", "vm-3"),
		}, nil},
		{"running unlocked", lockView{inst: inst,
			vms:    []api.VM{vm("vm-1", "claimed", egressPool, true)},
			vmms:   map[string]bool{"vm-1": true},
			tables: locked(),
		}, []string{"unlocked vm-1"}},
		{"broken lock", lockView{inst: inst,
			vms:    []api.VM{vm("vm-1", "warm", egressPool, true)},
			vmms:   map[string]bool{"vm-1": true},
			tables: map[string]nft.State{tap.Name(inst, "vm-1"): {Tap: tap.Name(inst, "vm-1"), Problem: "policy accept"}},
		}, []string{"broken vm-1"}},
		{"lock of a gone VM", lockView{inst: inst,
			vms:    []api.VM{vm("vm-1", "gone", egressPool, false)},
			vmms:   map[string]bool{},
			tables: locked("vm-1"),
		}, []string{"stale " + tap.Name(inst, "vm-1")}},
		{"lock of an unknown VM", lockView{inst: inst,
			tables: locked("vm-9"),
		}, []string{"stale " + tap.Name(inst, "vm-9")}},
		{"hibernated, unlocked", lockView{inst: inst,
			vms: []api.VM{vm("vm-1", "hibernated", egressPool, true)},
		}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for k := range tc.v.findings() {
				got = append(got, k)
			}
			slices.Sort(got)
			if !slices.Equal(got, tc.want) {
				t.Fatalf("findings %v, want %v", got, tc.want)
			}
			for _, msg := range tc.v.findings() {
				if !strings.Contains(msg, "vm-") && !strings.Contains(msg, tap.Prefix) {
					t.Fatalf("finding %q names neither a VM nor a tap", msg)
				}
			}
		})
	}
}

// The probe judge: leaks are findings whatever the phase, positive answers
// are required only of a round's (strict) probes, and while sandboxd is
// down a request through the door must get no answer at all.
func TestProbeProblems(t *testing.T) {
	refused := errors.New("dial tcp 10.77.0.1:20001: connect: connection refused")
	ok := func(a netip.Addr) string { return upstreamBody(a) }
	for _, tc := range []struct {
		name string
		a    attempt
		want string // "" none, "leak", "fail" (a positive failure)
	}{
		{"allowed 200", attempt{kind: probeAllowed, strict: true, status: 200, body: ok(upAllowed)}, ""},
		{"allowed 200, foreign body", attempt{kind: probeAllowed, status: 200, body: ok(upDenied)}, "leak"},
		{"allowed 403 in a round", attempt{kind: probeAllowed, strict: true, status: 403}, "fail"},
		{"allowed refused in a round", attempt{kind: probeAllowed, strict: true, err: refused}, "fail"},
		{"allowed refused across a kill", attempt{kind: probeAllowed, err: refused}, ""},
		{"allowed 502 across a kill", attempt{kind: probeAllowed, status: 502}, ""},
		{"allowed refused while down", attempt{kind: probeAllowed, down: true, err: refused}, ""},
		{"allowed 200 while down", attempt{kind: probeAllowed, down: true, status: 200, body: ok(upAllowed)}, "leak"},
		{"allowed no error while down", attempt{kind: probeAllowed, down: true}, "leak"},
		{"denied 403", attempt{kind: probeDenied, strict: true, status: 403}, ""},
		{"denied 200", attempt{kind: probeDenied, status: 200, body: ok(upDenied)}, "leak"},
		{"denied 200 in a round", attempt{kind: probeDenied, strict: true, status: 200, body: ok(upDenied)}, "leak"},
		{"denied 502 in a round", attempt{kind: probeDenied, strict: true, status: 502}, "fail"},
		{"denied 403 while down", attempt{kind: probeDenied, down: true, status: 403}, "leak"},
		{"denied refused while down", attempt{kind: probeDenied, down: true, err: refused}, ""},
		{"direct dropped, counted", attempt{kind: probeDirect, strict: true, moved: true}, ""},
		{"direct dropped, not counted", attempt{kind: probeDirect, strict: true}, "fail"},
		{"direct dropped across a kill", attempt{kind: probeDirect, down: true}, ""},
		{"direct connected", attempt{kind: probeDirect, moved: true, connected: true}, "leak"},
		{"spoofed connected while down", attempt{kind: probeSpoofed, down: true, connected: true}, "leak"},
		{"spoofed dropped, counted", attempt{kind: probeSpoofed, strict: true, moved: true}, ""},
		{"spoofed dropped, not counted", attempt{kind: probeSpoofed, strict: true}, "fail"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			msg, leak := tc.a.problem()
			got := ""
			switch {
			case msg != "" && leak:
				got = "leak"
			case msg != "":
				got = "fail"
			}
			if got != tc.want {
				t.Fatalf("problem() = %q (leak %v), want %s", msg, leak, tc.want)
			}
			if msg != "" && !strings.Contains(msg, tc.a.kind) && !strings.Contains(msg, upDenied.String()) && !strings.Contains(msg, upAllowed.String()) {
				t.Fatalf("finding %q names neither the kind nor the host", msg)
			}
		})
	}
}

// The upstream calls a leak any connection to the denied address and any
// connection from a lane address but the host's (the proxy's source).
func TestUpstreamLeaks(t *testing.T) {
	host := netip.MustParseAddr("10.77.0.1")
	for _, tc := range []struct {
		name          string
		local, remote netip.Addr
		leak          bool
	}{
		{"the proxy to the allowed host", upAllowed, upAllowed, false},
		{"the proxy from the bridge address", upAllowed, host, false},
		{"a guest straight to the allowed host", upAllowed, netip.MustParseAddr("10.77.0.5"), true},
		{"a spoofed address straight to the allowed host", upAllowed, netip.MustParseAddr("10.77.0.250"), true},
		{"the proxy to the denied host", upDenied, upDenied, true},
		{"another network", upAllowed, netip.MustParseAddr("192.0.2.7"), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u := &upstream{subnet: netip.MustParsePrefix("10.77.0.0/24"), host: host}
			u.saw(tc.local, tc.remote)
			l := u.takeLeaks()
			if (len(l) > 0) != tc.leak {
				t.Fatalf("leaks %v, want leak %v", l, tc.leak)
			}
			if len(u.takeLeaks()) != 0 {
				t.Fatal("takeLeaks returned the same leaks twice")
			}
		})
	}
}

// Every request the denied upstream gets is a leak, whatever connection
// carried it; the allowed upstream's are not.
func TestUpstreamRequests(t *testing.T) {
	u := &upstream{subnet: netip.MustParsePrefix("10.77.0.0/24"), host: netip.MustParseAddr("10.77.0.1")}
	u.asked(upAllowed, upAllowed.String())
	if l := u.takeLeaks(); len(l) != 0 {
		t.Fatalf("a request to the allowed upstream is a leak: %v", l)
	}
	u.asked(upDenied, upDenied.String())
	u.asked(upDenied, upDenied.String())
	if l := u.takeLeaks(); len(l) != 2 || !strings.Contains(l[0], upDenied.String()) {
		t.Fatalf("two requests to the denied upstream: leaks %v", l)
	}
}

// The spoofed address is never the guest's own.
func TestSpoofAddr(t *testing.T) {
	for _, g := range []string{"10.77.0.2", "10.77.0.250"} {
		a := netip.MustParseAddr(g)
		if s := spoofAddr(a); s == a || !netip.MustParsePrefix("10.77.0.0/24").Contains(s) {
			t.Fatalf("spoofAddr(%s) = %s", a, s)
		}
	}
}
