package tap

import (
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// freshNetns moves the test's goroutine, locked to its OS thread, into a new network
// namespace, and moves it back in cleanup. The namespace disappears with its last
// handle, taking anything a failed test left in it. Returns the original namespace,
// so tests can check that nothing reached it.
func freshNetns(t *testing.T) netns.NsHandle {
	t.Helper()
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatalf("tap tests need root for network namespaces (euid %d), and CI must run them", os.Geteuid())
		}
		t.Skipf("tap tests need root for network namespaces (euid %d)", os.Geteuid())
	}
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		t.Fatal(err)
	}
	ns, err := netns.New()
	if err != nil {
		orig.Close()
		runtime.UnlockOSThread()
		t.Fatalf("new netns: %v", err)
	}
	t.Cleanup(func() {
		if err := netns.Set(orig); err != nil {
			// Leave the thread locked: when this goroutine ends the runtime
			// kills the thread instead of reusing it in the wrong namespace.
			t.Errorf("restore netns: %v", err)
			return
		}
		runtime.UnlockOSThread()
		if err := ns.Close(); err != nil {
			t.Errorf("close netns: %v", err)
		}
		if ns.IsOpen() {
			t.Error("test netns handle still open")
		}
		orig.Close()
	})
	return orig
}

func addBridge(t *testing.T, name string) *netlink.Bridge {
	t.Helper()
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: name}}
	if err := netlink.LinkAdd(br); err != nil {
		t.Fatalf("add bridge %s: %v", name, err)
	}
	if err := netlink.LinkSetUp(br); err != nil {
		t.Fatal(err)
	}
	l, err := netlink.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	return l.(*netlink.Bridge)
}

// linkNames lists the interfaces of the current namespace, sorted.
func linkNames(t *testing.T) []string {
	t.Helper()
	links, err := netlink.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, l := range links {
		names = append(names, l.Attrs().Name)
	}
	slices.Sort(names)
	return names
}

func assertTapOn(t *testing.T, name string, br netlink.Link) {
	t.Helper()
	l, err := netlink.LinkByName(name)
	if err != nil {
		t.Fatalf("tap %s: %v", name, err)
	}
	tt, ok := l.(*netlink.Tuntap)
	if !ok || tt.Mode != netlink.TUNTAP_MODE_TAP {
		t.Fatalf("%s is %T (%s), want a tap", name, l, l.Type())
	}
	if tt.MasterIndex != br.Attrs().Index {
		t.Fatalf("%s master ifindex %d, want %d (%s)", name, tt.MasterIndex, br.Attrs().Index, br.Attrs().Name)
	}
	if tt.Attrs().Flags&net.FlagUp == 0 {
		t.Fatalf("%s is not up (flags %v)", name, tt.Attrs().Flags)
	}
	if tt.NonPersist {
		t.Fatalf("%s is not persistent: it would vanish before the VMM opens it", name)
	}
}

func TestName(t *testing.T) {
	ids := []string{"", "sb_0123456789abcdef", "01JD5Z8Q1W9V3M8K2X4T6Y7R0P", strings.Repeat("x", 500), "vm/with spaces:and\tcolons", "ünïcödé"}
	for _, id := range ids {
		n := Name("i-one", id)
		if err := ValidName(n); err != nil || len(n) != 15 || !strings.HasPrefix(n, Prefix) {
			t.Errorf("Name(%q) = %q: %v, want a valid 15-byte name with prefix %q", id, n, err, Prefix)
		}
		if Name("i-one", id) != n {
			t.Errorf("Name(%q) not deterministic", id)
		}
		// Another instance's VM of the same id has another tap.
		if Name("i-two", id) == n {
			t.Errorf("Name(%q) is the same for two instances: %q", id, n)
		}
	}
	seen := make(map[string]string, 20000)
	for i := range 10000 {
		for _, inst := range []string{"i-one", "i-two"} {
			id := fmt.Sprintf("sb_%016x", i)
			n := Name(inst, id)
			if prev, dup := seen[n]; dup {
				t.Fatalf("Name collision: %q and %s/%q -> %q", prev, inst, id, n)
			}
			seen[n] = inst + "/" + id
		}
	}
}

func TestValidName(t *testing.T) {
	for name, ok := range map[string]bool{
		"tap0": true, "sbxabcdefghijkl": true, "a": true,
		"": false, ".": false, "..": false, "sbxabcdefghijklm": false, "a/b": false, "a:b": false, "a b": false,
	} {
		err := ValidName(name)
		if (err == nil) != ok || (err != nil && !errors.Is(err, ErrInvalidName)) {
			t.Errorf("ValidName(%q) = %v, want ok=%v", name, err, ok)
		}
	}
}

func TestCreateAttachDelete(t *testing.T) {
	host := freshNetns(t)
	before := linkNames(t)
	br := addBridge(t, "sbxbr0")
	name := Name("i-taptest", "sb_00000000000000aa")

	if err := Create(name, "sbxbr0"); err != nil {
		t.Fatal(err)
	}
	assertTapOn(t, name, br)
	if err := Create(name, "sbxbr0"); err != nil {
		t.Fatalf("second Create: %v, want idempotent success", err)
	}
	assertTapOn(t, name, br)

	// The tap was made in the test namespace, never on the host.
	hh, err := netlink.NewHandleAt(host)
	if err != nil {
		t.Fatal(err)
	}
	defer hh.Close()
	if _, err := hh.LinkByName(name); !notFound(err) {
		t.Fatalf("tap visible in the host namespace: %v", err)
	}

	if err := Delete(name); err != nil {
		t.Fatal(err)
	}
	if err := Delete(name); err != nil {
		t.Fatalf("second Delete: %v, want idempotent success", err)
	}
	if got, want := linkNames(t), append(slices.Clone(before), "sbxbr0"); !slices.Equal(got, sorted(want)) {
		t.Fatalf("links after delete %q, want %q", got, sorted(want))
	}
}

func sorted(s []string) []string { slices.Sort(s); return s }

func TestManyTapsNoLeak(t *testing.T) {
	freshNetns(t)
	before := linkNames(t)
	br := addBridge(t, "sbxbr0")
	var names []string
	for i := range 16 {
		n := Name("i-taptest", fmt.Sprintf("vm-%d", i))
		if err := Create(n, "sbxbr0"); err != nil {
			t.Fatal(err)
		}
		names = append(names, n)
	}
	for _, n := range names {
		assertTapOn(t, n, br)
	}
	for _, n := range names {
		if err := Delete(n); err != nil {
			t.Fatal(err)
		}
	}
	if err := netlink.LinkDel(br); err != nil {
		t.Fatal(err)
	}
	if got := linkNames(t); !slices.Equal(got, before) {
		t.Fatalf("links after deleting every tap and the bridge %q, want %q", got, before)
	}
}

// A crash between creating the tap and attaching it leaves a detached, down tap;
// Create finishes the job.
func TestCreateFinishesHalfMadeTap(t *testing.T) {
	freshNetns(t)
	br := addBridge(t, "sbxbr0")
	name := Name("i-taptest", "crashed")
	half := &netlink.Tuntap{LinkAttrs: netlink.LinkAttrs{Name: name}, Mode: netlink.TUNTAP_MODE_TAP,
		Flags: netlink.TUNTAP_NO_PI | netlink.TUNTAP_VNET_HDR}
	if err := netlink.LinkAdd(half); err != nil {
		t.Fatal(err)
	}
	if err := Create(name, "sbxbr0"); err != nil {
		t.Fatal(err)
	}
	assertTapOn(t, name, br)
}

func TestConflictsAreNotTouched(t *testing.T) {
	freshNetns(t)
	addBridge(t, "sbxbr0")
	other := addBridge(t, "sbxbr1")
	onOther := Name("i-taptest", "on-other-bridge")
	if err := Create(onOther, "sbxbr1"); err != nil {
		t.Fatal(err)
	}

	cases := []struct {
		name, tap, bridge string
		want              error
	}{
		{"tap on another bridge", onOther, "sbxbr0", ErrConflict},
		{"name taken by a bridge", "sbxbr1", "sbxbr0", ErrConflict},
		{"master is not a bridge", Name("i-taptest", "x"), onOther, ErrNotBridge},
		{"invalid name", "way-too-long-name", "sbxbr0", ErrInvalidName},
	}
	for _, tc := range cases {
		if err := Create(tc.tap, tc.bridge); !errors.Is(err, tc.want) {
			t.Errorf("%s: Create = %v, want %v", tc.name, err, tc.want)
		}
	}
	if err := Create(Name("i-taptest", "y"), "no-such-br"); err == nil || !notFound(err) {
		t.Errorf("Create on a missing bridge = %v, want link-not-found", err)
	}
	if err := Delete("sbxbr1"); !errors.Is(err, ErrConflict) {
		t.Errorf("Delete of a bridge = %v, want ErrConflict", err)
	}
	if err := Delete("a/b"); !errors.Is(err, ErrInvalidName) {
		t.Errorf("Delete(invalid) = %v, want ErrInvalidName", err)
	}
	// Nothing above changed the existing interfaces.
	assertTapOn(t, onOther, other)
	if _, err := netlink.LinkByName("sbxbr1"); err != nil {
		t.Fatalf("bridge removed by a refused Delete: %v", err)
	}
	if _, err := netlink.LinkByName(Name("i-taptest", "x")); !notFound(err) {
		t.Fatalf("refused Create left a tap behind: %v", err)
	}
}
