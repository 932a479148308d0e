package layout

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/sbxlog/sbxlog/eventlog/event"
	"github.com/sbxlog/sbxlog/executors"
	"github.com/sbxlog/sbxlog/fsm"
)

func TestLayout(t *testing.T) {
	r := Roots{Runs: "/r/runs", Store: "/r/store", Templates: "/r/tpl"}
	op := event.OpIDFromUint(1_700_000_000_000, 7)
	if got := GoldenRel(fsm.PoolKey{Template: "ubuntu/24.04", Net: "none", Size: "small"}, op); got != "golden/ubuntu_24.04_none_small-"+op.String() {
		t.Errorf("GoldenRel = %q", got)
	}
	if got := HibernateRel("vm-1", op); got != "hibernate/vm-1-"+op.String() || !strings.HasPrefix(filepath.Base(got), HibernatePrefix("vm-1")) {
		t.Errorf("HibernateRel = %q", got)
	}
	g := r.GoldenRunDir("i1", op)
	if filepath.Dir(g) != "/r/runs/i1" || !strings.HasPrefix(filepath.Base(g), GoldenRunPrefix) || g != r.GoldenRunDir("i1", op) {
		t.Errorf("GoldenRunDir = %q", g)
	}
	for _, c := range []struct {
		rel  string
		want string // "" when refused
	}{
		{"i1/vm-1", "/r/runs/i1/vm-1"},
		{"i2/vm-1", ""},
		{"i1/../i2/vm-1", ""},
		{"/i1/vm-1", ""},
		{"", ""},
	} {
		got, err := r.InstanceRunDir("i1", c.rel)
		if (err == nil) != (c.want != "") || got != c.want {
			t.Errorf("InstanceRunDir(i1, %q) = %q, %v; want %q", c.rel, got, err, c.want)
		}
		if err != nil && !executors.IsUnrecoverable(err) {
			t.Errorf("InstanceRunDir(i1, %q): %v is not unrecoverable", c.rel, err)
		}
	}
	for _, c := range []struct {
		sub, rel, want string
	}{
		{GoldenStore, "golden/g-1", "/r/store/golden/g-1"},
		{HibernateStore, "golden/g-1", ""},
		{GoldenStore, "golden/g-1/inner", ""},
		{GoldenStore, "golden/../hibernate/h-1", ""},
		{HibernateStore, "hibernate/h-1", "/r/store/hibernate/h-1"},
	} {
		got, err := r.SnapshotIn(c.sub, c.rel)
		if (err == nil) != (c.want != "") || got != c.want {
			t.Errorf("SnapshotIn(%s, %q) = %q, %v; want %q", c.sub, c.rel, got, err, c.want)
		}
	}
	for id, ok := range map[string]bool{"i-1": true, "": false, ".": false, "..": false, "a/b": false, "a\x00": false} {
		if err := ValidInstance(id); (err == nil) != ok {
			t.Errorf("ValidInstance(%q) = %v", id, err)
		}
	}
	if _, err := r.OwnedRunDir("i1", "i2", "vm-1", "i1/vm-1", "destroy"); err == nil || !executors.IsUnrecoverable(err) || !strings.Contains(err.Error(), "destroy vm-1: VM belongs to instance \"i2\"") {
		t.Errorf("OwnedRunDir of another instance's VM: %v", err)
	}
	for _, owner := range []string{"", "i1"} {
		if got, err := r.OwnedRunDir("i1", owner, "vm-1", "i1/vm-1", "destroy"); err != nil || got != "/r/runs/i1/vm-1" {
			t.Errorf("OwnedRunDir(owner %q) = %q, %v", owner, got, err)
		}
	}
	if got, err := r.VMRunDir("i1", "vm-1", "i1/vm-1"); err != nil || got != "/r/runs/i1/vm-1" {
		t.Errorf("VMRunDir = %q, %v", got, err)
	}
	for _, rel := range []string{"i1/vm-2", "i2/vm-1", "i1/../vm-1"} {
		if _, err := r.VMRunDir("i1", "vm-1", rel); err == nil || !executors.IsUnrecoverable(err) {
			t.Errorf("VMRunDir(i1, vm-1, %q): %v, want unrecoverable", rel, err)
		}
	}
}

// The longest run dir name is what the check measures: a data dir one byte
// too deep for it is refused, one that fits passes.
func TestCheckSocketPath(t *testing.T) {
	const instance, file = "i-1", "vsock.sock"
	fixed := len("/run/") + len(instance) + 1 + runDirNameLen + 1 + len(file)
	for _, c := range []struct {
		name  string
		depth int // bytes of the data dir
		ok    bool
	}{
		{"short", 10, true},
		{"at the limit", MaxSocketPath - fixed, true},
		{"one byte over", MaxSocketPath - fixed + 1, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := RootsIn("/" + strings.Repeat("d", c.depth-1))
			err := r.CheckSocketPath(instance, file)
			if (err == nil) != c.ok {
				t.Fatalf("CheckSocketPath with a %d-byte data dir = %v, want ok %v", c.depth, err, c.ok)
			}
			if err != nil && !strings.Contains(err.Error(), "shorter data dir") {
				t.Fatalf("error %q does not say what to do", err)
			}
		})
	}
	// Both names a run dir can have are that long.
	if n := len(filepath.Base(RootsIn("/").GoldenRunDir(instance, event.OpIDFromUint(1, 1)))); n != runDirNameLen {
		t.Fatalf("golden run dir names are %d bytes, runDirNameLen is %d", n, runDirNameLen)
	}
	if n := len(fsm.VMID(event.OpIDFromUint(1, 1), 3)); n != runDirNameLen {
		t.Fatalf("VM ids are %d bytes, runDirNameLen is %d", n, runDirNameLen)
	}
}

func TestRootsWithin(t *testing.T) {
	r := RootsIn("/data")
	good := map[string]string{"i1/vm-1": "/data/run/i1/vm-1"}
	for rel, want := range good {
		if got, err := r.RunDir(rel); err != nil || got != want {
			t.Errorf("RunDir(%q) = %q, %v", rel, got, err)
		}
	}
	for _, bad := range []string{"", "/abs", "..", "../x", "i1/../../x", "i1//vm", "i1/./vm", ".sbx-tmp-x", "i1/vm/"} {
		if _, err := r.RunDir(bad); !executors.IsUnrecoverable(err) {
			t.Errorf("RunDir(%q): %v, want unrecoverable", bad, err)
		}
	}
	if err := (Roots{Runs: "rel", Store: "/s", Templates: "/t"}).Validate(); err == nil {
		t.Error("relative root accepted")
	}
}

// TestStaleHibernateSnapshots: the entry's name decides (the VM, then the
// op); a VM of this instance keeps what it lists, a VM the state no longer
// holds keeps nothing, another instance's VM keeps everything, and names
// that are not hibernate snapshots are left alone.
func TestStaleHibernateSnapshots(t *testing.T) {
	r := RootsIn(t.TempDir())
	op := func(n uint64) event.OpID { return event.OpIDFromUint(1_700_000_000_000, n) }
	mk := func(rel string, meta bool) string {
		t.Helper()
		dir := filepath.Join(r.Store, rel)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if meta {
			if err := os.WriteFile(filepath.Join(dir, "meta.json"), []byte("{}"), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		return rel
	}
	kept := mk(HibernateRel("vm-a", op(1)), true)
	woken := mk(HibernateRel("vm-a", op(2)), true)     // the wake's removal never ran
	halfGone := mk(HibernateRel("vm-a", op(3)), false) // the removal was cut short
	running := mk(HibernateRel("vm-b", op(4)), true)   // vm-b keeps nothing
	gone := mk(HibernateRel("vm-gone", op(5)), true)   // destroyed, or lost after its snapshot stood
	foreign := mk(HibernateRel("vm-f", op(6)), true)
	junk := mk(filepath.Join(HibernateStore, "not-a-snapshot"), true)
	noOp := mk(filepath.Join(HibernateStore, "vm-a-"), false)

	got, err := r.StaleHibernateSnapshots(
		map[string][]string{"vm-a": {kept}, "vm-b": nil},
		map[string]bool{"vm-f": true})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{woken, halfGone, running, gone}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("stale %v\nwant  %v (kept %s, %s, %s, %s)", got, want, kept, foreign, junk, noOp)
	}

	// No hibernate store yet: nothing to sweep.
	if got, err := RootsIn(t.TempDir()).StaleHibernateSnapshots(nil, nil); err != nil || got != nil {
		t.Fatalf("empty store: %v, %v", got, err)
	}
}
