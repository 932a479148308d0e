package e2e

import (
	"context"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/sbxlog/sbxlog/executors/egress/netnstest"
	"github.com/sbxlog/sbxlog/executors/egress/nft"
	"github.com/sbxlog/sbxlog/executors/tap"
	"github.com/sbxlog/sbxlog/projections/api"
	"github.com/sbxlog/sbxlog/projections/apiclient"
)

// egressNode is sandboxd on chsim inside a network namespace standing for
// the host: an egress bridge at 10.77.0.1/24, the API on 10.77.0.1:7777.
type egressNode struct {
	*daemon
	lane       *netnstest.Lane
	dir, cfg   string
	c          *apiclient.Client
	hc         *http.Client
	apiAddr    string
	hostSvc    string // another service of the host, on the bridge address
	sandboxdNS []string
}

// egressNodeOpts vary startEgressNodeWith's node.
type egressNodeOpts struct {
	// cfg is merged into the config (a nil value removes the key).
	cfg map[string]any
	// wrap runs sandboxd inside the host namespace (after nsenter).
	wrap []string
	// dir, when set, is the node's directory instead of a t.TempDir (a
	// short one: QEMU's socket paths must fit a unix socket).
	dir string
}

func startEgressNode(t *testing.T) *egressNode {
	t.Helper()
	return startEgressNodeWith(t, egressNodeOpts{})
}

func startEgressNodeWith(t *testing.T, o egressNodeOpts) *egressNode {
	t.Helper()
	netnstest.Require(t)
	n := &egressNode{lane: netnstest.NewLane(t), dir: o.dir}
	if n.dir == "" {
		n.dir = t.TempDir()
	}
	n.apiAddr = n.lane.HostAddr.String() + ":7777"
	n.hostSvc = n.lane.HostAddr.String() + ":9999"
	ln, err := n.lane.Host.Listen("tcp", n.hostSvc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	n.hc = &http.Client{Transport: &http.Transport{DialContext: n.lane.Host.DialContext}}
	n.cfg = filepath.Join(n.dir, "sandboxd.json")
	cfg := map[string]any{
		"listen": n.apiAddr, "data_dir": filepath.Join(n.dir, "data"), "node_id": "e2e", "api_token": "root", "hypervisor": "chsim",
		"bridge": n.lane.Bridge, "egress_proxy": map[string]any{},
		"pools": []any{map[string]any{"template": "default", "net": "egress", "size": "small", "warm": 2}},
		"nats":  map[string]any{"disabled": true},
	}
	for k, v := range o.cfg {
		if v == nil {
			delete(cfg, k)
		} else {
			cfg[k] = v
		}
	}
	writeJSON(t, n.cfg, cfg)
	n.sandboxdNS = append([]string{"nsenter", "--net=" + n.lane.Host.Path(), "--"}, o.wrap...)
	n.start(t)
	c, err := apiclient.New(n.apiAddr, "root", n.hc)
	if err != nil {
		t.Fatal(err)
	}
	n.c = c
	return n
}

func (n *egressNode) start(t *testing.T) {
	t.Helper()
	n.daemon = startDaemonVia(t, n.dir, filepath.Join(n.dir, "data"), n.apiAddr, n.sandboxdNS, n.hc, "-config", n.cfg)
}

// instance is the node's instance id: the one directory under <data>/run.
func (n *egressNode) instance(t *testing.T) string {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(n.dir, "data", "run"))
	if err != nil || len(ents) != 1 {
		t.Fatalf("the node's instance dir: %v %v", ents, err)
	}
	return ents[0].Name()
}

// owner is the node's nft owner.
func (n *egressNode) owner(t *testing.T) nft.Owner { return nft.OwnerOf(n.instance(t)) }

// tapOf is the tap of the node's VM vm.
func (n *egressNode) tapOf(t *testing.T, vm string) string { return tap.Name(n.instance(t), vm) }

// locks reads every egress lock of the node in the host namespace.
func (n *egressNode) locks(t *testing.T) map[string]nft.State {
	t.Helper()
	o := n.owner(t)
	var all map[string]nft.State
	n.lane.Host.MustDo(t, func() error {
		var err error
		all, err = o.Tables()
		return err
	})
	return all
}

func (n *egressNode) taps(t *testing.T) []string {
	t.Helper()
	var out []string
	n.lane.Host.MustDo(t, func() error {
		ls, err := nft.Dumped(netlink.LinkList)
		if err != nil {
			return err
		}
		for _, l := range ls {
			if _, ok := l.(*netlink.Tuntap); ok && strings.HasPrefix(l.Attrs().Name, tap.Prefix) {
				out = append(out, l.Attrs().Name)
			}
		}
		return nil
	})
	return out
}

// guest is a namespace standing for the guest of VM vm: its NIC's frames
// are carried to and from the VM's tap, as the VMM would, and it has the
// address the host leased it (the lock's), routed via the bridge. It
// returns the tap's lock.
func (n *egressNode) guest(t *testing.T, vm string, i byte) (*netnstest.NS, nft.State) {
	t.Helper()
	st, ok := n.locks(t)[n.tapOf(t, vm)]
	if !ok || !st.OK {
		t.Fatalf("VM %s's tap %s: lock %+v", vm, n.tapOf(t, vm), st)
	}
	g := n.lane.AttachGuest(t, "guest-"+vm, n.tapOf(t, vm), st.Lock.GuestMAC, st.Lock.GuestIP)
	return g.NS, st
}

// TestEgressSurvivesSIGKILL is acceptance 2: while egress VMs run, a probe
// loop in a guest's namespace tries direct connections to the host the
// whole time (sandboxd up, SIGKILLed, restarting, up again) and never gets
// through; after the restart every lock is in place, a removed one
// repaired and a stray one gone, by the time /healthz answers, while the
// lock another instance holds on the same host is left alone.
func TestEgressSurvivesSIGKILL(t *testing.T) {
	n := startEgressNode(t)
	ctx := context.Background()
	deadline := time.Now().Add(30 * time.Second)
	for len(n.taps(t)) < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("no 2 warm egress VMs after 30 s: taps %v", n.taps(t))
		}
		time.Sleep(50 * time.Millisecond)
	}
	claim, err := n.c.Claim(ctx, api.ClaimRequest{Template: "default", Net: "egress", Size: "small"})
	if err != nil {
		t.Fatal(err)
	}
	claimedTap := n.tapOf(t, claim.VM)
	if st, ok := n.locks(t)[claimedTap]; !ok || !st.OK {
		t.Fatalf("claimed VM's tap %s: lock %+v (all %v)", claimedTap, st, n.locks(t))
	}
	// Every tap is locked (a refill's tap is, right after it is made:
	// poll until the set settles).
	deadline = time.Now().Add(10 * time.Second)
	for {
		locks, unlocked := n.locks(t), ""
		for _, tp := range n.taps(t) {
			if s := locks[tp]; !s.OK {
				unlocked = tp
			}
		}
		if unlocked == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("tap %s is not locked", unlocked)
		}
		time.Sleep(50 * time.Millisecond)
	}

	// The guest: a namespace whose NIC's frames are carried to the claimed
	// VM's tap, as its VMM would.
	guest, st := n.guest(t, claim.VM, 50)
	door := st.Lock.Door.String()
	reach := func(addr string, d time.Duration) bool {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		c, err := guest.DialContext(ctx, "tcp", addr)
		if err == nil {
			c.Close()
		}
		return err == nil
	}
	// The relay works: the guest reaches its door (so the probe's failures
	// below are the lock's doing).
	if !reach(door, 3*time.Second) {
		t.Fatalf("the guest does not reach its door %s (lock counters %v)", door, n.locks(t)[claimedTap].Counters)
	}

	var got atomic.Int64
	var tries atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			for _, a := range []string{n.apiAddr, n.hostSvc, "169.254.169.254:80"} {
				tries.Add(1)
				if reach(a, 100*time.Millisecond) {
					got.Add(1)
					t.Errorf("direct connection from the guest to %s succeeded", a)
				}
			}
		}
	}()
	defer func() { close(stop); wg.Wait() }()

	time.Sleep(300 * time.Millisecond)
	if err := n.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-n.exited
	time.Sleep(500 * time.Millisecond)
	if s := n.locks(t)[claimedTap]; !s.OK {
		t.Fatalf("lock gone with sandboxd: %+v", s)
	}
	// While it is down: one warm VM's lock removed, a stray lock added.
	running := n.taps(t)
	var warmTap string
	for _, tp := range running {
		if tp != claimedTap {
			warmTap = tp
		}
	}
	owner, foreign := n.owner(t), nft.OwnerOf("i-another-sandboxd")
	n.lane.Host.MustDo(t, func() error { return owner.Remove(warmTap) })
	n.lane.Host.MustDo(t, func() error {
		for _, name := range []string{"straytap0", "foreigntap0"} {
			if err := netlink.LinkAdd(&netlink.Tuntap{LinkAttrs: netlink.LinkAttrs{Name: name}, Mode: netlink.TUNTAP_MODE_TAP}); err != nil {
				return err
			}
		}
		if err := foreign.Install(nft.Lock{Tap: "foreigntap0", GuestMAC: net.HardwareAddr{2, 9, 9, 9, 9, 8}, GuestIP: netip.MustParseAddr("10.77.0.250"), Door: netip.MustParseAddrPort("10.77.0.1:29998"), DoorMAC: st.Lock.DoorMAC}); err != nil {
			return err
		}
		return owner.Install(nft.Lock{Tap: "straytap0", GuestMAC: net.HardwareAddr{2, 9, 9, 9, 9, 9}, GuestIP: netip.MustParseAddr("10.77.0.251"), Door: netip.MustParseAddrPort("10.77.0.1:29999"), DoorMAC: st.Lock.DoorMAC})
	})
	if _, ok := n.locks(t)["straytap0"]; !ok {
		t.Fatal("stray lock not installed")
	}

	n.start(t) // returns at the first /healthz 200
	after := n.locks(t)
	for _, tp := range running {
		if s := after[tp]; !s.OK {
			t.Fatalf("at /healthz, tap %s is not locked: %+v", tp, s)
		}
	}
	if s := after[warmTap]; !s.OK {
		t.Fatalf("the removed lock of %s was not repaired before /healthz: %+v", warmTap, s)
	}
	if after[claimedTap].Lock.Door != st.Lock.Door {
		t.Fatalf("the claimed VM's door moved: %s -> %s", st.Lock.Door, after[claimedTap].Lock.Door)
	}
	if _, ok := after["straytap0"]; ok {
		t.Fatal("a lock no VM owns survived the restart")
	}
	// Its tap went first: a guest behind a tap no VM owns is never on an
	// unlocked tap.
	n.lane.Host.MustDo(t, func() error {
		if _, err := netlink.LinkByName("straytap0"); err == nil {
			t.Error("the tap of the stray lock is still there: its lock was removed before it")
		}
		return nil
	})
	if _, ok := after["foreigntap0"]; ok {
		t.Fatal("the node lists another instance's lock as its own")
	}
	n.lane.Host.MustDo(t, func() error {
		if st, err := foreign.Inspect("foreigntap0"); err != nil || !st.OK {
			t.Errorf("another instance's lock after the restart: %+v %v, want it left in place", st, err)
		}
		return nil
	})
	if !reach(door, 3*time.Second) {
		t.Fatalf("the guest does not reach its door %s after the restart", door)
	}
	n.lane.Host.MustDo(t, func() error { _, err := owner.GuardDrops(); return err }) // the bridge's guard is in place
	time.Sleep(300 * time.Millisecond)
	close(stop)
	wg.Wait()
	stop = make(chan struct{})
	if got.Load() != 0 || tries.Load() < 10 {
		t.Fatalf("%d of %d direct attempts got through", got.Load(), tries.Load())
	}
	// Release: the VM's lock goes with its tap.
	if err := n.c.Release(ctx, claim.ID); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(15 * time.Second)
	for {
		if _, ok := n.locks(t)[claimedTap]; !ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the released VM's lock is still there after 15 s")
		}
		time.Sleep(50 * time.Millisecond)
	}
}
