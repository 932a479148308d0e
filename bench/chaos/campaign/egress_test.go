package campaign

import (
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
