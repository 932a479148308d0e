package templates

import (
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/sbxlog/sbxlog/executors/fsx"
)

func write(t *testing.T, path, data string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestLoadErrors(t *testing.T) {
	root := t.TempDir()
	cases := []struct {
		name, config string
		disk         bool
		want         error
	}{
		{"missing", "", false, ErrNotFound},
		{"not json", "{", true, ErrInvalid},
		{"no kernel", `{"payload":{"cmdline":"x"},"disks":[{"path":"disk.raw"}]}`, true, ErrInvalid},
		{"two disks", `{"payload":{"kernel":"k"},"disks":[{"path":"disk.raw"},{"path":"b"}]}`, true, ErrInvalid},
		{"no disk", `{"payload":{"kernel":"k"}}`, true, ErrInvalid},
		{"disk missing", `{"payload":{"kernel":"k"},"disks":[{"path":"nope.raw"}]}`, true, ErrInvalid},
	}
	for _, c := range cases {
		dir := filepath.Join(root, c.name)
		if c.config != "" {
			write(t, filepath.Join(dir, ConfigFile), c.config)
		}
		if c.disk {
			write(t, filepath.Join(dir, DefaultDisk), "x")
		}
		if _, err := Load(dir); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
	}
}

func TestLoadAndVMConfig(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "tpl")
	write(t, filepath.Join(dir, "img.raw"), "disk")
	write(t, filepath.Join(dir, ConfigFile), `{
		"payload": {"kernel": "vmlinux", "initramfs": "/abs/initrd", "cmdline": "c"},
		"disks": [{"path": "img.raw", "direct": true}],
		"net": [{"tap": "golden-tap"}],
		"console": {"mode": "File", "file": "c.log"},
		"balloon": {"size": 100},
		"platform": {"num_pci_segments": 1}
	}`)
	tp, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if tp.Disk != filepath.Join(dir, "img.raw") {
		t.Fatalf("disk %s", tp.Disk)
	}
	if k, _ := tp.Config.Get("payload", "kernel"); k != filepath.Join(dir, "vmlinux") {
		t.Fatalf("kernel not resolved: %v", k)
	}
	if i, _ := tp.Config.Get("payload", "initramfs"); i != "/abs/initrd" {
		t.Fatalf("absolute initramfs changed: %v", i)
	}
	res, err := DefaultSizes.Lookup("medium")
	if err != nil {
		t.Fatal(err)
	}
	p := Paths{Disk: "/run/vm/cow.raw", VsockSocket: "/run/vm/vsock.sock", Console: "/run/vm/console.log", Serial: "/run/vm/serial.log"}
	cfg, err := tp.VMConfig(res, p)
	if err != nil {
		t.Fatal(err)
	}
	if boot, mx := cfg.CPUs(); boot != 2 || mx != 2 || cfg.MemorySize() != 1<<30 {
		t.Fatalf("cpus %d/%d memory %d", boot, mx, cfg.MemorySize())
	}
	if cfg.DiskPaths()[0] != p.Disk || cfg.VsockSocket() != p.VsockSocket || cfg.VsockCID() != DefaultVsockCID || cfg.ConsoleFile() != p.Console {
		t.Fatalf("paths not set: %v %s %s", cfg.DiskPaths(), cfg.VsockSocket(), cfg.ConsoleFile())
	}
	if len(cfg.NetTaps()) != 0 {
		t.Fatal("NICs kept")
	}
	if v, _ := cfg.Get("disks", "0", "direct"); v != true {
		t.Fatal("unknown disk key dropped")
	}
	if _, ok := cfg.Get("platform", "num_pci_segments"); !ok {
		t.Fatal("unknown key dropped")
	}
	if tp.Config.DiskPaths()[0] != tp.Disk {
		t.Fatal("VMConfig changed the template's own config")
	}
	if _, err := tp.VMConfig(Resources{VCPUs: 1, MemoryBytes: 100}, p); !errors.Is(err, ErrInvalid) {
		t.Fatalf("balloon as large as memory: %v", err)
	}
	if _, err := DefaultSizes.Lookup("huge"); !errors.Is(err, ErrUnknownSize) {
		t.Fatalf("unknown size: %v", err)
	}
}

func TestSynthesize(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "ns", "default")
	// Concurrent first uses of a template: all succeed, one template results.
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = Synthesize(dir, SynthOptions{DiskSize: 8 << 20, DataBytes: 256 << 10})
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	tp, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(tp.Disk)
	if err != nil || st.Size() != 8<<20 {
		t.Fatalf("disk %v %v", st, err)
	}
	alloc, err := fsx.AllocatedBytes(tp.Disk)
	if err != nil {
		t.Fatal(err)
	}
	if alloc < 256<<10 || alloc > 1<<20 {
		t.Fatalf("disk allocates %d bytes, want about 256 KiB of data", alloc)
	}
	ents, _ := os.ReadDir(filepath.Dir(dir))
	if len(ents) != 1 {
		t.Fatalf("temp dirs left beside the template: %v", ents)
	}
}

// A CH VM gets exactly the size table's vCPUs and memory.
func TestDefaultSizes(t *testing.T) {
	tests := []struct {
		size  string
		vcpus int
		mem   int64
	}{
		{"small", 1, 512 << 20},
		{"medium", 2, 1 << 30},
		{"large", 4, 4 << 30},
		{"xlarge", 4, 8 << 30},
		{"2xlarge", 8, 16 << 30},
	}
	if len(DefaultSizes) != len(tests) {
		t.Fatalf("DefaultSizes has %d sizes, want %d", len(DefaultSizes), len(tests))
	}
	for _, tc := range tests {
		r, err := DefaultSizes.Lookup(tc.size)
		if err != nil || r.VCPUs != tc.vcpus || r.MemoryBytes != tc.mem {
			t.Errorf("%s: %+v, %v; want %d vCPUs, %d bytes", tc.size, r, err, tc.vcpus, tc.mem)
		}
	}
}
