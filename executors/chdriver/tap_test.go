package chdriver

import (
	"context"
	"errors"
	"os"
	"runtime"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/sbxlog/sbxlog/executors/ch"
	"github.com/sbxlog/sbxlog/executors/egress/nft"
	"github.com/sbxlog/sbxlog/executors/tap"
	"github.com/sbxlog/sbxlog/fsm"
)

// nsTaps runs the tap package inside a fresh network namespace: netlink acts
// in the namespace of the calling OS thread, so every call goes to one
// goroutine locked to a thread that entered the namespace. The namespace
// (and whatever a failed test left in it) disappears with that thread.
type nsTaps struct {
	calls chan func()
	done  chan struct{}
}

var _ Taps = (*nsTaps)(nil)

const testBridge = "sbxbr0"

func newNSTaps(t *testing.T) *nsTaps {
	t.Helper()
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatalf("tap tests need root for network namespaces (euid %d), and CI must run them", os.Geteuid())
		}
		t.Skipf("tap tests need root for network namespaces (euid %d)", os.Geteuid())
	}
	n := &nsTaps{calls: make(chan func()), done: make(chan struct{})}
	ready := make(chan error, 1)
	go func() {
		// Never unlocked: when this goroutine ends the runtime retires the
		// thread, and the namespace with it.
		runtime.LockOSThread()
		defer close(n.done)
		ns, err := netns.New()
		if err != nil {
			ready <- err
			return
		}
		defer ns.Close()
		br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: testBridge}}
		if err := netlink.LinkAdd(br); err != nil {
			ready <- err
			return
		}
		ready <- netlink.LinkSetUp(br)
		for f := range n.calls {
			f()
		}
	}()
	if err := <-ready; err != nil {
		t.Fatalf("netns: %v", err)
	}
	t.Cleanup(func() { close(n.calls); <-n.done })
	return n
}

func (n *nsTaps) do(f func() error) error {
	errc := make(chan error, 1)
	n.calls <- func() { errc <- f() }
	return <-errc
}

func (n *nsTaps) Create(name, bridge string) error {
	return n.do(func() error { return tap.Create(name, bridge) })
}

func (n *nsTaps) Delete(name string) error { return n.do(func() error { return tap.Delete(name) }) }

// links lists the namespace's interfaces and the master of each tap.
func (n *nsTaps) links(t *testing.T) (names []string, masters map[string]string) {
	t.Helper()
	masters = map[string]string{}
	err := n.do(func() error {
		ls, err := nft.Dumped(netlink.LinkList)
		if err != nil {
			return err
		}
		byIndex := map[int]string{}
		for _, l := range ls {
			byIndex[l.Attrs().Index] = l.Attrs().Name
		}
		for _, l := range ls {
			names = append(names, l.Attrs().Name)
			if m := l.Attrs().MasterIndex; m != 0 {
				masters[l.Attrs().Name] = byIndex[m]
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(names)
	return names, masters
}

// TestEgressTaps: an egress VM gets its own tap on the bridge and its own
// NIC (MAC from its id) after the restore; hibernate and destroy delete the
// tap, wake recreates it, a failed clone removes it; nothing is left in the
// namespace at the end.
func TestEgressTaps(t *testing.T) {
	t.Parallel()
	taps := newNSTaps(t)
	h := newHarness(t, "", func(c *Config) { c.Bridge = testBridge; c.Taps = taps })
	ctx := context.Background()
	k := fsm.PoolKey{Template: "default", Net: NetEgress, Size: "small"}
	base := []string{"lo", testBridge}
	checkLinks := func(want ...string) {
		t.Helper()
		names, masters := taps.links(t)
		all := append(slices.Clone(base), want...)
		sort.Strings(all)
		if !slices.Equal(names, all) {
			t.Fatalf("links %v, want %v", names, all)
		}
		for _, w := range want {
			if masters[w] != testBridge {
				t.Fatalf("tap %s attached to %q", w, masters[w])
			}
		}
	}

	golden := h.buildGolden(k)
	checkLinks() // goldens are built without NICs
	gcfg, err := os.ReadFile(h.store(golden) + "/" + ConfigFile)
	if err != nil {
		t.Fatal(err)
	}
	if c, _ := ch.ParseConfig(gcfg); len(c.NetTaps()) != 0 {
		t.Fatal("golden has a NIC")
	}

	const vm1, vm2 = "vm-00000000000000f1", "vm-00000000000000f2"
	if _, err := h.d.Clone(ctx, cloneIntent(vm1, golden, k)); err != nil {
		t.Fatal(err)
	}
	checkLinks(TapName(testInstance, vm1))
	info, err := h.api(vm1).Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if ids, tapsOf := info.Config.NetIDs(), info.Config.NetTaps(); !slices.Equal(ids, []string{NICID}) || !slices.Equal(tapsOf, []string{TapName(testInstance, vm1)}) {
		t.Fatalf("NICs %v on taps %v", ids, tapsOf)
	}
	if mac, _ := info.Config.Get("net", "0", "mac"); mac != MAC(vm1) {
		t.Fatalf("NIC MAC %v, want %s", mac, MAC(vm1))
	}

	// A clone that fails after creating its tap removes it.
	h.setHook(abortAtProbe)
	if _, err := h.d.Clone(ctx, cloneIntent(vm2, golden, k)); !errors.Is(err, errAbort) {
		t.Fatalf("clone: %v", err)
	}
	h.setHook(nil)
	checkLinks(TapName(testInstance, vm1))

	hib := fsm.HibernateVM{OpID: newOp(), VM: vm1, Key: k, RunDir: testInstance + "/" + vm1}
	hres, err := h.d.Hibernate(ctx, hib)
	if err != nil {
		t.Fatal(err)
	}
	checkLinks()
	if _, err := h.d.Wake(ctx, fsm.WakeVM{OpID: newOp(), VM: vm1, Key: k, RunDir: hib.RunDir, SnapshotDir: hres.SnapshotDir}); err != nil {
		t.Fatal(err)
	}
	checkLinks(TapName(testInstance, vm1))
	if info, err = h.api(vm1).Info(ctx); err != nil || !slices.Equal(info.Config.NetTaps(), []string{TapName(testInstance, vm1)}) {
		t.Fatalf("woken VM NICs: %v %v", info, err)
	}

	// Cold boots of egress VMs get the NIC in their config.
	cold := fsm.CloneVM{OpID: newOp(), VM: vm2, Key: k, Instance: testInstance, RunDir: testInstance + "/" + vm2, Cold: true}
	if _, err := h.d.Clone(ctx, cold); err != nil {
		t.Fatal(err)
	}
	checkLinks(TapName(testInstance, vm1), TapName(testInstance, vm2))

	for _, vm := range []string{vm1, vm2} {
		in := fsm.DestroyVM{OpID: newOp(), VM: vm, Key: k, Instance: testInstance, RunDir: testInstance + "/" + vm}
		if vm == vm1 {
			in.SnapshotDir = hres.SnapshotDir
		}
		if _, err := h.d.Destroy(ctx, in); err != nil {
			t.Fatal(err)
		}
	}
	checkLinks()
	if names, _ := taps.links(t); slices.ContainsFunc(names, func(n string) bool { return strings.HasPrefix(n, tap.Prefix) && n != testBridge }) {
		t.Fatalf("taps leaked: %v", names)
	}
}
