package campaign

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/sbxlog/sbxlog/executors/egress/netnstest"
	"github.com/sbxlog/sbxlog/executors/egress/nft"
	"github.com/sbxlog/sbxlog/executors/tap"
	"github.com/sbxlog/sbxlog/projections/api"
)

// Egress pools under crashes. With Options.Egress the daemon under test
// runs in the host namespace of a netnstest lane (its bridge holds the
// proxy doors' address), with an egress pool beside the others: every VM of
// it gets a tap on the bridge, locked by an nftables table to its door
// before its VMM runs. The checks, after every restart (as soon as the new
// incarnation answers, which it does only after its start-up reconcile)
// and at the end:
//   - every egress VM whose VMM runs has its tap locked: a table of the
//     daemon's owner on that tap, holding exactly the lock's ruleset;
//   - no lock is left for a VM the state no longer has (gone or unknown).
//
// Side effects in flight can make either look false for a moment (a clone
// locks the tap just before its VMM starts, a destroy unlocks it just after
// its VMM ended), so a finding is a violation only if it holds in each of
// lockReads reads lockGap apart.

// poolEgress is the egress pool of the daemon under test (with Egress).
// Its policy allows the lane's allowed upstream (egressprobe.go).
var poolEgress = PoolConf{Template: "egress", Net: "egress", Size: "small", Warm: 1, WarmMax: 2, Egress: egressPolicy}

const (
	lockReads = 4
	lockGap   = 250 * time.Millisecond
	// lockExitWait bounds the wait for an incarnation whose API failed a
	// read to be reaped: an armed crash cuts the read before the campaign
	// sees the process end.
	lockExitWait = 2 * time.Second
)

// EgressAvailable says why egress pools cannot be added to a campaign on
// this machine (nil: they can): the lane needs root for its namespaces.
func EgressAvailable() error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("egress pools need root for their network namespaces (euid %d)", os.Geteuid())
	}
	return nil
}

// withLane runs f with a lane whose namespaces live as long as f.
func withLane(f func(*netnstest.Lane) error) error {
	return netnstest.Run(func(r *netnstest.Runner) error { return f(netnstest.NewLane(r)) })
}

// egressPools is poolEgress when the campaign has egress pools.
func (c *campaign) egressPools() []PoolConf {
	if c.lane == nil {
		return nil
	}
	return []PoolConf{poolEgress}
}

// inLane makes daemon d run in the lane's host namespace with the bridge
// and the egress proxy configured.
func (c *campaign) inLane(d *Daemon) error {
	d.Wrap = []string{"nsenter", "--net=" + c.lane.Host.Path(), "--"}
	d.Dial = c.lane.Host.DialContext
	return d.Configure(map[string]any{"bridge": c.lane.Bridge, "egress_proxy": map[string]any{}})
}

// lockView is one read of the locks and what they should match.
type lockView struct {
	tables map[string]nft.State // tap -> its table
	taps   map[string]bool      // tap links in the lane
	vms    []api.VM
	vmms   map[string]bool // VM names whose VMM runs
	inst   string          // the daemon's instance id (tap names carry it)
}

func (c *campaign) readLocks(ctx context.Context) (lockView, error) {
	var v lockView
	vms, err := vmView(ctx, c.a.Client(10*time.Second))
	if err != nil {
		return v, fmt.Errorf("VM view: %w", err)
	}
	v.vms = vms
	v.vmms = map[string]bool{}
	for _, p := range VMMsUnder(c.a.DataDir) {
		v.vmms[filepath.Base(filepath.Dir(p.Socket))] = true
	}
	v.inst = c.instance()
	owner := nft.OwnerOf(v.inst)
	err = c.lane.Host.Do(func() error {
		var err error
		if v.tables, err = owner.Tables(); err != nil {
			return err
		}
		links, err := nft.Dumped(netlink.LinkList)
		if err != nil {
			return err
		}
		v.taps = map[string]bool{}
		for _, l := range links {
			if strings.HasPrefix(l.Attrs().Name, tap.Prefix) {
				v.taps[l.Attrs().Name] = true
			}
		}
		return nil
	})
	return v, err
}

// findings are the lock problems of one read, keyed so that reads can be
// intersected.
func (v lockView) findings() map[string]string {
	out := map[string]string{}
	live := map[string]bool{} // taps of VMs the state has
	for _, vm := range v.vms {
		t := tap.Name(v.inst, vm.Name)
		if vm.Live {
			live[t] = true
		}
		if !strings.Contains(vm.Pool, "/egress/") || !v.vmms[vm.Name] {
			continue
		}
		st, ok := v.tables[t]
		switch {
		case !ok:
			out["unlocked "+vm.Name] = fmt.Sprintf("egress VM %s (%s) runs with its tap %s unlocked (no table; tap present: %v)", vm.Name, vm.State, t, v.taps[t])
		case !st.OK:
			out["broken "+vm.Name] = fmt.Sprintf("egress VM %s (%s) runs with a broken lock on %s: %s", vm.Name, vm.State, t, st.Problem)
		}
	}
	for t := range v.tables {
		if !live[t] {
			out["stale "+t] = fmt.Sprintf("lock on tap %s left for a VM the state no longer has (tap present: %v)", t, v.taps[t])
		}
	}
	return out
}

// checkLocks reads the locks until no finding persists or lockReads reads
// agree; what persisted through every read is a violation.
func (c *campaign) checkLocks(ctx context.Context, when string) {
	if c.lane == nil {
		return
	}
	var persist map[string]string
	var v lockView
	for i := range lockReads {
		var err error
		if v, err = c.readLocks(ctx); err != nil {
			if ctx.Err() == nil && !c.a.exits(lockExitWait) {
				c.violate("%s: read the egress locks: %v", when, err)
			}
			return
		}
		f := v.findings()
		if i == 0 {
			persist = f
		} else {
			for k := range persist {
				if _, ok := f[k]; !ok {
					delete(persist, k)
				}
			}
		}
		if len(persist) == 0 {
			break
		}
		time.Sleep(lockGap)
	}
	for _, k := range slices.Sorted(maps.Keys(persist)) {
		c.violate("%s: %s", when, persist[k])
	}
	n := 0
	for _, vm := range v.vms {
		if strings.Contains(vm.Pool, "/egress/") && v.vmms[vm.Name] {
			n++
		}
	}
	c.checked("egress VMs running with their tap locked", n)
	c.checked("egress lock reads ("+strings.Fields(when)[0]+")", 1)
}
