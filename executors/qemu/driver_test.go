package qemu

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/sbxlog/sbxlog/eventlog/event"
	"github.com/sbxlog/sbxlog/executors"
	"github.com/sbxlog/sbxlog/executors/fsx"
	"github.com/sbxlog/sbxlog/executors/fsx/xfstest"
	"github.com/sbxlog/sbxlog/executors/layout"
	"github.com/sbxlog/sbxlog/fsm"
)

const testInstance = "i-test"

var (
	testKey   = fsm.PoolKey{Template: "default", Net: "none", Size: "small"}
	opCounter atomic.Uint64
)

func newOp() event.OpID {
	return event.OpIDFromUint(uint64(time.Now().UnixMilli()), opCounter.Add(1))
}

// fakeGuest writes a kernel and initrd that exist (enough for every check
// short of booting them).
func fakeGuest(t *testing.T) (kernel, initrd string) {
	t.Helper()
	dir := t.TempDir()
	kernel, initrd = filepath.Join(dir, "vmlinuz"), filepath.Join(dir, "initrd.img")
	for _, p := range []string{kernel, initrd} {
		if err := os.WriteFile(p, []byte("not a kernel"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return kernel, initrd
}

// defaultTemplate is a template table with one template, "default", booting
// kernel and initrd without a disk.
func defaultTemplate(kernel, initrd string) map[string]Guest {
	return map[string]Guest{TemplateDefault: {Kernel: kernel, Initrd: initrd}}
}

func newDriver(t *testing.T, root string, mutate func(*Config)) *Driver {
	t.Helper()
	cfg := Config{Roots: layout.RootsIn(root), Instance: testInstance, Accel: AccelTCG, Log: zerolog.Nop()}
	if mutate != nil {
		mutate(&cfg)
	}
	d, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestNewRejectsBadConfig(t *testing.T) {
	root := t.TempDir()
	good := Config{Roots: layout.RootsIn(root), Instance: testInstance}
	tests := []struct {
		name   string
		mutate func(*Config)
		want   string
	}{
		{"relative roots", func(c *Config) { c.Roots.Store = "store" }, "store root"},
		{"no instance", func(c *Config) { c.Instance = "" }, "instance"},
		{"instance with slash", func(c *Config) { c.Instance = "a/b" }, "instance"},
		{"relative kernel", func(c *Config) { c.Templates = map[string]Guest{"default": {Kernel: "vmlinuz"}} }, "kernel"},
		{"relative disk", func(c *Config) {
			c.Templates = map[string]Guest{"debian": {Kernel: "/k", Initrd: "/i", Disk: "disk.qcow2"}}
		}, "disk"},
		{"template without a name", func(c *Config) { c.Templates = map[string]Guest{"": {Kernel: "/k"}} }, "without a name"},
		{"tiny size", func(c *Config) { c.Sizes = Sizes{"small": {MemoryMiB: 8, CPUs: 1}} }, "size \"small\""},
		{"no cpus", func(c *Config) { c.Sizes = Sizes{"small": {MemoryMiB: 256}} }, "size \"small\""},
		{"bad accel", func(c *Config) { c.Accel = "hvf" }, "accelerator"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := good
			tc.mutate(&cfg)
			_, err := New(cfg)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("New = %v, want an error mentioning %q", err, tc.want)
			}
		})
	}
	if _, err := New(good); err != nil {
		t.Fatalf("New(good) = %v", err)
	}
}

func TestSizesAndTCGCap(t *testing.T) {
	kernel, initrd := fakeGuest(t)
	root := t.TempDir()
	tests := []struct {
		name    string
		accel   Accel
		cap     int
		size    string
		wantMiB int
		wantCPU int
	}{
		// TCG: half of fsm.Sizes' vCPUs (at least one) and memory, memory
		// capped at TCGMaxMemoryMiB.
		{"small", AccelTCG, 0, "small", 256, 1},
		{"medium under the cap", AccelTCG, 0, "medium", 512, 1},
		{"large capped under TCG", AccelTCG, 0, "large", DefaultTCGMaxMemoryMiB, 2},
		{"2xlarge capped under TCG", AccelTCG, 0, "2xlarge", DefaultTCGMaxMemoryMiB, 4},
		{"custom cap", AccelTCG, 512, "large", 512, 2},
		{"no cap", AccelTCG, -1, "2xlarge", 8192, 4},
		// KVM is configured, so nothing probes or boots it here. KVM takes
		// fsm.Sizes as they are.
		{"KVM is not capped", AccelKVM, 0, "2xlarge", 16384, 8},
		{"KVM small", AccelKVM, 0, "small", 512, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := newDriver(t, root, func(c *Config) {
				c.Accel, c.TCGMaxMemoryMiB, c.Templates = tc.accel, tc.cap, defaultTemplate(kernel, initrd)
			})
			k := testKey
			k.Size = tc.size
			spec, err := d.bootSpec(context.Background(), "/r/vm", "/s", k)
			if err != nil {
				t.Fatal(err)
			}
			if spec.MemoryMiB != tc.wantMiB || spec.CPUs != tc.wantCPU || spec.Kernel != kernel || spec.Initrd != initrd {
				t.Fatalf("spec %+v, want %d MiB %d CPUs", spec, tc.wantMiB, tc.wantCPU)
			}
			// What the API reports as the sandbox's size is what it booted with.
			if z, ok := d.VMSize(tc.size); !ok || z.MemoryMiB != spec.MemoryMiB || z.VCPUs != spec.CPUs {
				t.Fatalf("VMSize(%s) = %+v, %v; the VM booted with %d MiB %d CPUs", tc.size, z, ok, spec.MemoryMiB, spec.CPUs)
			}
		})
	}
	d := newDriver(t, root, func(c *Config) { c.Templates = defaultTemplate(kernel, initrd) })
	k := testKey
	k.Size = "huge"
	if _, err := d.bootSpec(context.Background(), "/r/vm", "/s", k); !executors.IsUnrecoverable(err) || !strings.Contains(err.Error(), "small") {
		t.Fatalf("unknown size: %v (want Unrecoverable listing the known sizes)", err)
	}
	if z, ok := d.VMSize("huge"); ok {
		t.Fatalf("VMSize(huge) = %+v", z)
	}
}

// A golden build or cold boot without a guest fails for good, says what to
// run, and leaves nothing behind.
func TestMissingGuest(t *testing.T) {
	root := t.TempDir()
	kernel, initrd := fakeGuest(t)
	for _, tc := range []struct {
		name      string
		templates map[string]Guest
	}{
		{"no templates", nil},
		{"template not served", map[string]Guest{TemplateBusybox: {Kernel: kernel, Initrd: initrd}}},
		{"no kernel", defaultTemplate("", "")},
		{"file gone", defaultTemplate(filepath.Join(root, "gone", "vmlinuz"), filepath.Join(root, "gone", "initrd.img"))},
		{"disk gone", map[string]Guest{TemplateDefault: {Kernel: kernel, Initrd: initrd, Disk: filepath.Join(root, "gone", "disk.qcow2")}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := newDriver(t, root, func(c *Config) { c.Templates = tc.templates })
			if _, err := d.Prepare(context.Background()); err != nil {
				t.Fatalf("Prepare without a guest = %v (it must only warn)", err)
			}
			_, err := d.BuildGolden(context.Background(), fsm.BuildGolden{OpID: newOp(), Key: testKey})
			if !executors.IsUnrecoverable(err) || !strings.Contains(err.Error(), "make guest") {
				t.Fatalf("BuildGolden = %v, want Unrecoverable naming `make guest`", err)
			}
			vm := "vm-0000000000000001"
			_, err = d.Clone(context.Background(), fsm.CloneVM{OpID: newOp(), VM: vm, Key: testKey, Instance: testInstance,
				RunDir: testInstance + "/" + vm, Cold: true})
			if !executors.IsUnrecoverable(err) || !strings.Contains(err.Error(), "make guest") {
				t.Fatalf("cold Clone = %v, want Unrecoverable naming `make guest`", err)
			}
			ents, err := os.ReadDir(filepath.Join(root, "run", testInstance))
			if err != nil || len(ents) != 0 {
				t.Fatalf("run dirs left: %v, %v", ents, err)
			}
		})
	}
}

// Intents naming paths outside the roots, another instance's VMs, the wrong
// kind of snapshot or unsupported pools fail for good without side effects.
func TestBadIntents(t *testing.T) {
	kernel, initrd := fakeGuest(t)
	root := t.TempDir()
	d := newDriver(t, root, func(c *Config) { c.Templates = defaultTemplate(kernel, initrd) })
	if _, err := d.Prepare(context.Background()); err != nil {
		t.Fatal(err)
	}
	vm := "vm-00000000000000aa"
	run := testInstance + "/" + vm
	// Files that a wrong destroy would remove.
	foreign := filepath.Join(root, "run", "i-other", vm)
	golden := filepath.Join(root, "store", "golden", "g1")
	for _, dir := range []string{foreign, golden} {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "keep"), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	egress := testKey
	egress.Net = NetEgress
	ctx := context.Background()
	tests := []struct {
		name string
		call func() error
		want string
	}{
		{"clone into another instance", func() error {
			_, err := d.Clone(ctx, fsm.CloneVM{OpID: newOp(), VM: vm, Key: testKey, RunDir: "i-other/" + vm, GoldenDir: "golden/g1"})
			return err
		}, "not under this instance"},
		{"clone climbing out", func() error {
			_, err := d.Clone(ctx, fsm.CloneVM{OpID: newOp(), VM: vm, Key: testKey, RunDir: testInstance + "/../../x", GoldenDir: "golden/g1"})
			return err
		}, "run dir"},
		{"clone without golden", func() error {
			_, err := d.Clone(ctx, fsm.CloneVM{OpID: newOp(), VM: vm, Key: testKey, RunDir: run})
			return err
		}, "no golden"},
		{"clone from a hibernate snapshot", func() error {
			_, err := d.Clone(ctx, fsm.CloneVM{OpID: newOp(), VM: vm, Key: testKey, RunDir: run, GoldenDir: "hibernate/x"})
			return err
		}, "not a golden snapshot"},
		{"clone of an egress pool", func() error {
			_, err := d.Clone(ctx, fsm.CloneVM{OpID: newOp(), VM: vm, Key: egress, RunDir: run, GoldenDir: "golden/g1"})
			return err
		}, "egress"},
		{"golden of an egress pool", func() error {
			_, err := d.BuildGolden(ctx, fsm.BuildGolden{OpID: newOp(), Key: egress})
			return err
		}, "egress"},
		{"wake from a golden", func() error {
			_, err := d.Wake(ctx, fsm.WakeVM{OpID: newOp(), VM: vm, Key: testKey, RunDir: run, SnapshotDir: "golden/g1"})
			return err
		}, "not a hibernate snapshot"},
		{"wake from a nested dir", func() error {
			_, err := d.Wake(ctx, fsm.WakeVM{OpID: newOp(), VM: vm, Key: testKey, RunDir: run, SnapshotDir: "hibernate/a/b"})
			return err
		}, "not a hibernate snapshot"},
		{"destroy of another instance's VM", func() error {
			_, err := d.Destroy(ctx, fsm.DestroyVM{OpID: newOp(), VM: vm, Key: testKey, Instance: "i-other", RunDir: "i-other/" + vm})
			return err
		}, "belongs to instance"},
		{"destroy removing a golden", func() error {
			_, err := d.Destroy(ctx, fsm.DestroyVM{OpID: newOp(), VM: vm, Key: testKey, Instance: testInstance, RunDir: run, SnapshotDir: "golden/g1"})
			return err
		}, "not a hibernate snapshot"},
		{"hibernate in another instance", func() error {
			_, err := d.Hibernate(ctx, fsm.HibernateVM{OpID: newOp(), VM: vm, Key: testKey, RunDir: "i-other/" + vm})
			return err
		}, "not under this instance"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			if !executors.IsUnrecoverable(err) || executors.IsLost(err) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want Unrecoverable (not lost) mentioning %q", err, tc.want)
			}
		})
	}
	for _, dir := range []string{foreign, golden} {
		if _, err := os.Stat(filepath.Join(dir, "keep")); err != nil {
			t.Fatalf("a refused intent touched %s: %v", dir, err)
		}
	}
	if _, err := os.Stat(filepath.Join(root, "run", testInstance, vm)); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("a refused intent created the run dir: %v", err)
	}
}

// writeSnapshot makes a snapshot dir that checkSnapshot accepts (ramMiB of
// sparse RAM), then applies damage.
func writeSnapshot(t *testing.T, dir string, ramMiB int, damage func(dir string)) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	state := []byte("device state")
	m := Meta{Format: MetaFormat, Source: "hibernate", Machine: "pc", Accel: AccelTCG, MemoryMiB: ramMiB,
		CPUs: 1, Kernel: "/k", Initrd: "/i", StateBytes: int64(len(state))}
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string][]byte{FileMeta: b, FileState: state} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, FileRAM), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(filepath.Join(dir, FileRAM), int64(ramMiB)<<20); err != nil {
		t.Fatal(err)
	}
	if damage != nil {
		damage(dir)
	}
}

func TestCheckSnapshot(t *testing.T) {
	tests := []struct {
		name   string
		damage func(dir string)
		ok     bool
	}{
		{"complete", nil, true},
		{"no meta", func(dir string) { os.Remove(filepath.Join(dir, FileMeta)) }, false},
		{"garbage meta", func(dir string) { os.WriteFile(filepath.Join(dir, FileMeta), []byte("{"), 0o600) }, false},
		{"RAM truncated", func(dir string) { os.Truncate(filepath.Join(dir, FileRAM), 1<<20) }, false},
		{"no RAM", func(dir string) { os.Remove(filepath.Join(dir, FileRAM)) }, false},
		{"state short", func(dir string) { os.Truncate(filepath.Join(dir, FileState), 3) }, false},
		{"dir missing", func(dir string) { os.RemoveAll(dir) }, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "snap")
			writeSnapshot(t, dir, 16, tc.damage)
			_, err := checkSnapshot(dir)
			if (err == nil) != tc.ok {
				t.Fatalf("checkSnapshot = %v, want ok=%v", err, tc.ok)
			}
		})
	}
}

// Without a QEMU there is nothing to hibernate: the VM is lost. A missing or
// damaged snapshot makes a wake lost, and leaves no run dir. A destroy of
// nothing succeeds and removes the snapshot it names. A clone from a missing
// golden fails for good but the VM is not "lost".
func TestNothingRunning(t *testing.T) {
	root := t.TempDir()
	d := newDriver(t, root, nil)
	ctx := context.Background()
	if _, err := d.Prepare(ctx); err != nil {
		t.Fatal(err)
	}
	vm := "vm-00000000000000bb"
	run := testInstance + "/" + vm
	runDir := filepath.Join(root, "run", run)

	_, err := d.Hibernate(ctx, fsm.HibernateVM{OpID: newOp(), VM: vm, Key: testKey, RunDir: run})
	if !executors.IsLost(err) {
		t.Fatalf("Hibernate without QEMU = %v, want Lost", err)
	}

	for _, tc := range []struct {
		name   string
		damage func(string)
	}{
		{"missing", func(dir string) { os.RemoveAll(dir) }},
		{"RAM truncated", func(dir string) { os.Truncate(filepath.Join(dir, FileRAM), 0) }},
	} {
		snap := "hibernate/" + vm + "-" + strings.ReplaceAll(tc.name, " ", "-")
		writeSnapshot(t, filepath.Join(root, "store", snap), 16, tc.damage)
		if err := os.MkdirAll(runDir, 0o700); err != nil { // leftovers of an earlier attempt
			t.Fatal(err)
		}
		_, err := d.Wake(ctx, fsm.WakeVM{OpID: newOp(), VM: vm, Key: testKey, RunDir: run, SnapshotDir: snap})
		if !executors.IsLost(err) {
			t.Fatalf("Wake from %s snapshot = %v, want Lost", tc.name, err)
		}
		if _, err := os.Stat(runDir); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("Wake from %s snapshot left the run dir: %v", tc.name, err)
		}
	}

	snap := "hibernate/" + vm + "-x"
	writeSnapshot(t, filepath.Join(root, "store", snap), 16, nil)
	if err := os.MkdirAll(runDir, 0o700); err != nil {
		t.Fatal(err)
	}
	res, err := d.Destroy(ctx, fsm.DestroyVM{OpID: newOp(), VM: vm, Key: testKey, Instance: testInstance, RunDir: run, SnapshotDir: snap})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{runDir, filepath.Join(root, "store", snap)} {
		if _, err := os.Stat(p); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("Destroy left %s: %v", p, err)
		}
	}
	if n := len(res.Report.Steps); n == 0 || res.Report.Steps[n-1].Name != StepRemoveSnapshot {
		t.Fatalf("Destroy report %+v, want steps ending in %s", res.Report, StepRemoveSnapshot)
	}
	if _, err := d.Destroy(ctx, fsm.DestroyVM{OpID: newOp(), VM: vm, Key: testKey, Instance: testInstance, RunDir: run, SnapshotDir: snap}); err != nil {
		t.Fatalf("second Destroy = %v", err)
	}

	_, err = d.Clone(ctx, fsm.CloneVM{OpID: newOp(), VM: vm, Key: testKey, RunDir: run, GoldenDir: "golden/missing"})
	if !executors.IsUnrecoverable(err) || executors.IsLost(err) || !errors.Is(err, ErrNoSnapshot) {
		t.Fatalf("Clone from a missing golden = %v, want Unrecoverable ErrNoSnapshot", err)
	}
	if _, err := os.Stat(runDir); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("failed Clone left the run dir: %v", err)
	}
}

func TestPrepare(t *testing.T) {
	t.Run("layout and sweep", func(t *testing.T) {
		root := t.TempDir()
		var temps []string
		for _, sub := range []string{"", "golden", "hibernate"} {
			dir := filepath.Join(root, "store", sub)
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			tmp, err := fsx.MkTempDir(dir, "crashed")
			if err != nil {
				t.Fatal(err)
			}
			temps = append(temps, tmp)
		}
		probe := filepath.Join(root, "run", testInstance, ProbeDirPrefix+"123")
		if err := os.MkdirAll(probe, 0o700); err != nil {
			t.Fatal(err)
		}
		temps = append(temps, probe)
		keep := filepath.Join(root, "store", "hibernate", "vm-1-op")
		if err := os.Mkdir(keep, 0o700); err != nil {
			t.Fatal(err)
		}
		d := newDriver(t, root, nil)
		rep, err := d.Prepare(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if len(rep.Swept) != len(temps) {
			t.Fatalf("swept %v, want %v", rep.Swept, temps)
		}
		for _, p := range temps {
			if _, err := os.Stat(p); !errors.Is(err, fs.ErrNotExist) {
				t.Fatalf("temp dir %s survived: %v", p, err)
			}
		}
		for _, p := range []string{keep, filepath.Join(root, "run", testInstance)} {
			if st, err := os.Stat(p); err != nil || !st.IsDir() {
				t.Fatalf("%s: %v", p, err)
			}
		}
		if rep.CopyMode != fsx.Reflink && rep.CopyMode != fsx.Copy {
			t.Fatalf("copy mode %v", rep.CopyMode)
		}
	})
	t.Run("socket path too long", func(t *testing.T) {
		root := filepath.Join(t.TempDir(), strings.Repeat("d", 80))
		d := newDriver(t, root, nil)
		if _, err := d.Prepare(context.Background()); err == nil || !strings.Contains(err.Error(), "socket") {
			t.Fatalf("Prepare = %v, want a socket path error", err)
		}
	})
	t.Run("XFS reflinks", func(t *testing.T) {
		root := xfstest.Mount(t, 0)
		d := newDriver(t, root, nil)
		rep, err := d.Prepare(context.Background())
		if err != nil || rep.CopyMode != fsx.Reflink {
			t.Fatalf("Prepare on XFS = %+v, %v", rep, err)
		}
		// A re-run that found its work done reports the detected mode.
		if got := d.report(RecipeResult{Already: true}).CopyMode; got != "reflink" {
			t.Fatalf("report of a re-run: copy mode %q", got)
		}
	})
	t.Run("runs and store on different filesystems", func(t *testing.T) {
		store := xfstest.MountNoReflink(t, 64<<20, xfstest.Tmpfs)
		roots := layout.RootsIn(t.TempDir())
		roots.Store = store
		d, err := New(Config{Roots: roots, Instance: testInstance, Log: zerolog.Nop()})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := d.Prepare(context.Background()); err == nil || !strings.Contains(err.Error(), "different filesystems") {
			t.Fatalf("Prepare = %v", err)
		}
	})
}

func TestClassify(t *testing.T) {
	tests := []struct {
		name          string
		err           error
		unrecoverable bool
		capacity      bool
	}{
		{"plain", errors.New("qmp: timeout"), false, false},
		{"invalid spec", fmt.Errorf("x: %w", ErrInvalidSpec), true, false},
		{"snapshot name taken", ErrSnapshotExists, true, false},
		{"ENOSPC", &fs.PathError{Op: "write", Path: "/s/ram", Err: syscall.ENOSPC}, false, true},
		{"already unrecoverable", executors.Unrecoverablef("x"), true, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := classify(tc.err)
			if executors.IsUnrecoverable(got) != tc.unrecoverable || errors.Is(got, executors.ErrCapacity) != tc.capacity {
				t.Fatalf("classify(%v) = %v", tc.err, got)
			}
			if !errors.Is(got, tc.err) {
				t.Fatalf("classify lost the cause: %v", got)
			}
		})
	}
}

func TestCachedGuest(t *testing.T) {
	cache := t.TempDir()
	mk := func(name string, files []string, age time.Duration) string {
		dir := filepath.Join(cache, name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			p := filepath.Join(dir, f)
			if err := os.WriteFile(p, []byte(f), 0o644); err != nil {
				t.Fatal(err)
			}
			mt := time.Now().Add(-age)
			if err := os.Chtimes(p, mt, mt); err != nil {
				t.Fatal(err)
			}
		}
		return dir
	}
	all := []string{"vmlinuz", "initrd.img", "manifest"}
	if _, ok := CachedGuest(cache); ok {
		t.Fatal("empty cache gave a guest")
	}
	mk("old", all, 2*time.Hour)
	want := mk("new", all, time.Hour)
	mk("incomplete", []string{"vmlinuz", "manifest"}, 0)
	mk(".build-x", all, 0)
	g, ok := CachedGuest(cache)
	if !ok || g.Dir != want || g.Kernel != filepath.Join(want, "vmlinuz") || g.Initrd != filepath.Join(want, "initrd.img") {
		t.Fatalf("CachedGuest = %+v, %v; want %s", g, ok, want)
	}
	t.Setenv("SBX_CACHE", "/sbx-cache")
	if got := GuestCacheDir(); got != "/sbx-cache/guest" {
		t.Fatalf("GuestCacheDir with SBX_CACHE = %s", got)
	}
}

// SweepSnapshots removes the hibernate snapshots the state no longer keeps
// (a woken VM's, whose removal a crash cut short, complete or half gone;
// those of VMs the state no longer holds) and leaves kept ones and another
// instance's VM's alone.
func TestSweepSnapshots(t *testing.T) {
	roots := layout.RootsIn(t.TempDir())
	d, err := New(Config{Roots: roots, Instance: testInstance, Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	snap := func(vm string, op uint64, damage func(string)) string {
		rel := layout.HibernateRel(vm, event.OpIDFromUint(1_700_000_000_000, op))
		writeSnapshot(t, filepath.Join(roots.Store, rel), 1, damage)
		return rel
	}
	kept := snap("vm-a", 1, nil)
	stale := snap("vm-a", 2, nil)
	halfGone := snap("vm-a", 4, func(dir string) { os.Remove(filepath.Join(dir, FileMeta)) })
	unknownVM := snap("vm-b", 5, nil)
	foreign := snap("vm-c", 6, nil)
	removed, err := d.SweepSnapshots(context.Background(), map[string][]string{"vm-a": {kept}}, map[string]bool{"vm-c": true})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(removed)
	if want := []string{stale, halfGone, unknownVM}; !slices.Equal(removed, want) {
		t.Fatalf("removed %v, want %v", removed, want)
	}
	for rel, want := range map[string]bool{kept: true, stale: false, halfGone: false, unknownVM: false, foreign: true} {
		if _, err := os.Stat(filepath.Join(roots.Store, rel)); (err == nil) != want {
			t.Errorf("%s present %v, want %v", rel, err == nil, want)
		}
	}
}

// Each template boots its own guest: one with a disk gets it and the root
// switch on its command line, one without neither; an unknown template is
// refused for good, naming the ones served.
func TestTemplates(t *testing.T) {
	kernel, initrd := fakeGuest(t)
	disk := filepath.Join(t.TempDir(), "disk.qcow2")
	if err := os.WriteFile(disk, []byte("QFI\xfb"), 0o600); err != nil {
		t.Fatal(err)
	}
	d := newDriver(t, t.TempDir(), func(c *Config) {
		c.Templates = map[string]Guest{
			TemplateDefault: {Kernel: kernel, Initrd: initrd, Disk: disk},
			TemplateBusybox: {Kernel: kernel, Initrd: initrd},
		}
	})
	if got, want := d.Templates(), []string{TemplateBusybox, TemplateDefault}; !slices.Equal(got, want) {
		t.Fatalf("Templates() = %v, want %v", got, want)
	}
	for _, tc := range []struct {
		template, disk, append string
	}{
		{TemplateDefault, disk, RootAppend},
		{TemplateBusybox, "", ""},
	} {
		k := testKey
		k.Template = tc.template
		spec, err := d.bootSpec(context.Background(), "/r/vm", "/s", k)
		if err != nil {
			t.Fatal(err)
		}
		if spec.Kernel != kernel || spec.Initrd != initrd || spec.Disk != tc.disk || spec.Append != tc.append {
			t.Errorf("template %s: spec %+v, want disk %q append %q", tc.template, spec, tc.disk, tc.append)
		}
	}
	k := testKey
	k.Template = "python"
	_, err := d.bootSpec(context.Background(), "/r/vm", "/s", k)
	if !executors.IsUnrecoverable(err) || !strings.Contains(err.Error(), "unknown template python") || !strings.Contains(err.Error(), "[busybox default]") {
		t.Fatalf("unknown template: %v", err)
	}
}

func TestCachedTemplates(t *testing.T) {
	base := t.TempDir()
	guestDir, tplDir := filepath.Join(base, "guest"), filepath.Join(base, "template")
	// mk writes files (each holding its name, a manifest body) in dir, aged.
	mk := func(dir string, age time.Duration, manifest string, files ...string) {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		mt := time.Now().Add(-age)
		for _, f := range append(files, "manifest") {
			body := f
			if f == "manifest" {
				body = manifest
			}
			p := filepath.Join(dir, f)
			if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.Chtimes(p, mt, mt); err != nil {
				t.Fatal(err)
			}
		}
	}
	tplFiles := []string{"rootfs.img", "disk.qcow2"}
	mk(filepath.Join(tplDir, "default", "h1"), 0, "format 1\n", tplFiles...)
	if got := CachedTemplates(guestDir, tplDir); len(got) != 0 {
		t.Fatalf("without a guest build: %v, want nothing (no kernel to boot)", got)
	}
	guest := func(dir string) Guest {
		return Guest{Dir: dir, Kernel: filepath.Join(dir, "vmlinuz"), Initrd: filepath.Join(dir, "initrd.img")}
	}
	// The newest guest build cannot switch into a root disk (built by an
	// older build.sh): it is busybox, but boots no disk.
	old := filepath.Join(guestDir, "g-old")
	mk(old, 0, "format 1\nkernel k 1\n", "vmlinuz", "initrd.img")
	if got, want := CachedTemplates(guestDir, tplDir), map[string]Guest{TemplateBusybox: guest(old)}; !maps.Equal(got, want) {
		t.Fatalf("with a guest build that cannot boot a disk: %+v, want %+v", got, want)
	}
	rd := filepath.Join(guestDir, "g-rootdisk")
	mk(rd, time.Hour, "format 1\nkernel k 1\n"+GuestFeatureRootDisk+"\n", "vmlinuz", "initrd.img")
	mk(filepath.Join(tplDir, "python", "h2"), 0, "m", "rootfs.img")      // incomplete
	mk(filepath.Join(tplDir, "python", ".build-x"), 0, "m", tplFiles...) // a build's work dir
	mk(filepath.Join(tplDir, "busybox", "h3"), 0, "m", tplFiles...)      // the name is the initramfs guest's
	got := CachedTemplates(guestDir, tplDir)
	dflt := guest(rd)
	dflt.Dir, dflt.Disk = filepath.Join(tplDir, "default", "h1"), filepath.Join(tplDir, "default", "h1", "disk.qcow2")
	want := map[string]Guest{TemplateBusybox: guest(old), TemplateDefault: dflt}
	if !maps.Equal(got, want) {
		t.Fatalf("CachedTemplates = %+v\nwant %+v", got, want)
	}
	t.Setenv("SBX_CACHE", "/sbx-cache")
	if got := TemplateCacheDir(); got != "/sbx-cache/template" {
		t.Fatalf("TemplateCacheDir with SBX_CACHE = %s", got)
	}
}

// A snapshot whose disk's backing file (a template's rootfs.img) is gone is
// no snapshot: a restore would fail in QEMU, again and again.
func TestSnapshotDiskBacking(t *testing.T) {
	dir := t.TempDir()
	base := filepath.Join(dir, "rootfs.img")
	if err := os.WriteFile(base, make([]byte, 4096), 0o600); err != nil {
		t.Fatal(err)
	}
	snap := filepath.Join(dir, "snap")
	writeSnapshot(t, snap, 1, nil)
	m, err := ReadMeta(snap)
	if err != nil {
		t.Fatal(err)
	}
	m.Disk = true
	b, _ := json.Marshal(m)
	if err := os.WriteFile(filepath.Join(snap, FileMeta), b, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := checkSnapshot(snap); !errors.Is(err, ErrNoSnapshot) {
		t.Fatalf("disk missing: %v", err)
	}
	if err := os.WriteFile(filepath.Join(snap, FileDisk), qcow2Header(base), 0o600); err != nil {
		t.Fatal(err)
	}
	if got, err := qcow2Backing(filepath.Join(snap, FileDisk)); err != nil || got != base {
		t.Fatalf("qcow2Backing = %q, %v; want %s", got, err, base)
	}
	if _, err := checkSnapshot(snap); err != nil {
		t.Fatalf("complete snapshot with disk: %v", err)
	}
	if err := os.Remove(base); err != nil {
		t.Fatal(err)
	}
	if _, err := checkSnapshot(snap); !errors.Is(err, ErrNoSnapshot) || !strings.Contains(err.Error(), "backing file is gone") {
		t.Fatalf("backing file gone: %v", err)
	}
	if err := os.WriteFile(filepath.Join(snap, FileDisk), []byte("raw bytes, not qcow2"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := checkSnapshot(snap); !errors.Is(err, ErrNoSnapshot) || !strings.Contains(err.Error(), "not a qcow2") {
		t.Fatalf("disk not qcow2: %v", err)
	}
}

// qcow2Header is the start of a qcow2 image whose backing file is backing:
// the fields qcow2Backing reads, the name right after the 104-byte header.
func qcow2Header(backing string) []byte {
	h := make([]byte, 104, 104+len(backing))
	copy(h, "QFI\xfb")
	binary.BigEndian.PutUint32(h[4:], 3)
	binary.BigEndian.PutUint64(h[8:], 104)
	binary.BigEndian.PutUint32(h[16:], uint32(len(backing)))
	return append(h, backing...)
}
