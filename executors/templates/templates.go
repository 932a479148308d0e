// Package templates is where a pool's cold-boot VM comes from: a template is a
// directory <templates root>/<name>/ holding config.json, a Cloud Hypervisor
// VmConfig (paths relative to the directory), and the root disk image it
// names (disk.raw by default).
//
// Contract:
//   - Exists says whether a template directory holds a config.json; Load
//     reads a template. A missing directory or config.json is an error
//     wrapping ErrNotFound; a config that is not a VmConfig with a kernel (or
//     firmware) and exactly one disk is ErrInvalid. Relative payload and disk
//     paths are resolved against the template directory.
//   - VMConfig derives the config of one VM: vCPUs and memory from the pool
//     size (Sizes; DefaultSizes is the one size table, fsm.Sizes), the disk, vsock socket and console/serial files moved to
//     the VM's run dir, network devices dropped (goldens are built without
//     NICs; a clone gets its own NIC after restore). Every key this package
//     does not know is kept, so a template can carry any CH option.
//   - Synthesize writes a small template for the chsim simulator (a
//     placeholder kernel file, a sparse disk image holding some data, a
//     config with a vsock device) so a fresh data dir works with no set-up.
//     It assembles the template in a temp dir beside its final name and
//     renames it into place; losing a race to a concurrent Synthesize is
//     success.
package templates

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"

	"github.com/sbxlog/sbxlog/executors/ch"
	"github.com/sbxlog/sbxlog/executors/fsx"
	"github.com/sbxlog/sbxlog/fsm"
)

// File names inside a template directory.
const (
	ConfigFile  = "config.json"
	DefaultDisk = "disk.raw"
	// SynthKernel is the placeholder kernel Synthesize writes (chsim only
	// opens it).
	SynthKernel = "vmlinux"
)

var (
	// ErrNotFound: the template directory or its config.json does not exist.
	ErrNotFound = errors.New("templates: template not found")
	// ErrInvalid: the template's config cannot boot a VM.
	ErrInvalid = errors.New("templates: invalid template")
	// ErrUnknownSize: the pool size is not in the size table.
	ErrUnknownSize = errors.New("templates: unknown size")
)

// Resources are a VM's vCPUs and memory.
type Resources struct {
	VCPUs       int
	MemoryBytes int64
}

// Sizes maps a pool size to its resources.
type Sizes map[string]Resources

// DefaultSizes are the sizes of the one size table, fsm.Sizes.
var DefaultSizes = sizesOf(fsm.Sizes)

// sizesOf maps each row of table to its resources, unchanged: a CH VM gets
// exactly what the size table says.
func sizesOf(table []fsm.Size) Sizes {
	s := make(Sizes, len(table))
	for _, z := range table {
		s[z.Name] = Resources{VCPUs: z.VCPUs, MemoryBytes: int64(z.MemoryMiB) << 20}
	}
	return s
}

// Lookup returns the resources of size.
func (s Sizes) Lookup(size string) (Resources, error) {
	r, ok := s[size]
	if !ok || r.VCPUs <= 0 || r.MemoryBytes <= 0 {
		names := make([]string, 0, len(s))
		for k := range s {
			names = append(names, k)
		}
		sort.Strings(names)
		return Resources{}, fmt.Errorf("%w %q (have %v)", ErrUnknownSize, size, names)
	}
	return r, nil
}

// Template is a loaded template.
type Template struct {
	Dir string
	// Config has absolute payload paths and disks[0].path == Disk.
	Config *ch.VmConfig
	// Disk is the root disk image.
	Disk string
}

// Exists reports whether dir holds a template (its config.json), without
// reading it: what a check before any boot asks.
func Exists(dir string) (bool, error) {
	_, err := os.Stat(filepath.Join(dir, ConfigFile))
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, fs.ErrNotExist):
		return false, nil
	default:
		return false, fmt.Errorf("templates: %w", err)
	}
}

// Load reads the template in dir.
func Load(dir string) (*Template, error) {
	data, err := os.ReadFile(filepath.Join(dir, ConfigFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w: %s", ErrNotFound, filepath.Join(dir, ConfigFile))
	}
	if err != nil {
		return nil, fmt.Errorf("templates: %w", err)
	}
	cfg, err := ch.ParseConfig(data)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrInvalid, dir, err)
	}
	abs := func(p string) string {
		if p == "" || filepath.IsAbs(p) {
			return p
		}
		return filepath.Join(dir, p)
	}
	hasBoot := false
	for _, k := range []string{"kernel", "initramfs", "firmware"} {
		v, _ := cfg.Get("payload", k)
		s, _ := v.(string)
		if s == "" {
			continue
		}
		if k != "initramfs" {
			hasBoot = true
		}
		if err := cfg.Set(abs(s), "payload", k); err != nil {
			return nil, fmt.Errorf("%w: %s: %v", ErrInvalid, dir, err)
		}
	}
	if !hasBoot {
		return nil, fmt.Errorf("%w: %s: payload names no kernel or firmware", ErrInvalid, dir)
	}
	disks := cfg.DiskPaths()
	if len(disks) != 1 {
		return nil, fmt.Errorf("%w: %s: want exactly one disk (the root image), config has %d", ErrInvalid, dir, len(disks))
	}
	disk := abs(disks[0])
	if disk == "" {
		disk = filepath.Join(dir, DefaultDisk)
	}
	if st, err := os.Stat(disk); err != nil || !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%w: %s: disk image %s is not a regular file", ErrInvalid, dir, disk)
	}
	_ = cfg.SetDiskPath(0, disk)
	return &Template{Dir: dir, Config: cfg, Disk: disk}, nil
}

// Paths are where a VM's per-VM files live (in its run dir).
type Paths struct {
	Disk        string
	VsockSocket string
	Console     string
	Serial      string
}

// DefaultVsockCID is the guest CID given to a template without a vsock device.
const DefaultVsockCID = 3

// VMConfig derives one VM's config; see the package doc.
func (t *Template) VMConfig(res Resources, p Paths) (*ch.VmConfig, error) {
	cfg := t.Config.Clone()
	cfg.SetCPUs(res.VCPUs, res.VCPUs)
	cfg.SetMemorySize(res.MemoryBytes)
	if bs, ok := cfg.BalloonSize(); ok && (bs < 0 || bs >= res.MemoryBytes) {
		return nil, fmt.Errorf("%w: %s: balloon of %d bytes does not fit %d bytes of memory", ErrInvalid, t.Dir, bs, res.MemoryBytes)
	}
	if err := cfg.SetDiskPath(0, p.Disk); err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrInvalid, t.Dir, err)
	}
	cid := cfg.VsockCID()
	if cid < 3 {
		cid = DefaultVsockCID
	}
	cfg.SetVsock(cid, p.VsockSocket)
	if m, _ := cfg.Get("console", "mode"); m == "File" {
		cfg.SetConsoleFile(p.Console)
	}
	if m, _ := cfg.Get("serial", "mode"); m == "File" {
		cfg.SetSerialFile(p.Serial)
	}
	if _, ok := cfg.Get("net"); ok {
		_ = cfg.Set([]any{}, "net")
	}
	return cfg, nil
}

// SynthOptions shape a synthesized template.
type SynthOptions struct {
	// DiskSize is the disk image's apparent size (default 64 MiB).
	DiskSize int64
	// DataBytes is how much data is written into it, half at the start and
	// half in the middle (default 1 MiB).
	DataBytes int64
}

// Synthesize writes a chsim template at dir; see the package doc.
func Synthesize(dir string, opt SynthOptions) error {
	if opt.DiskSize <= 0 {
		opt.DiskSize = 64 << 20
	}
	if opt.DataBytes <= 0 {
		opt.DataBytes = 1 << 20
	}
	opt.DataBytes = min(opt.DataBytes, opt.DiskSize)
	parent := filepath.Dir(dir)
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return fmt.Errorf("templates: %w", err)
	}
	tmp, err := fsx.MkTempDir(parent, "template")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	if err := os.WriteFile(filepath.Join(tmp, SynthKernel), []byte("chsim placeholder kernel: chsim runs no guest code\n"), 0o644); err != nil {
		return fmt.Errorf("templates: %w", err)
	}
	if err := writeSparseDisk(filepath.Join(tmp, DefaultDisk), opt.DiskSize, opt.DataBytes); err != nil {
		return err
	}
	cfg := map[string]any{
		"payload": map[string]any{"kernel": SynthKernel, "cmdline": "console=hvc0 root=/dev/vda rw"},
		"disks":   []any{map[string]any{"path": DefaultDisk}},
		"rng":     map[string]any{"src": "/dev/urandom"},
		"vsock":   map[string]any{"cid": DefaultVsockCID, "socket": "vsock.sock"},
		"serial":  map[string]any{"mode": "Null"},
		"console": map[string]any{"mode": "File", "file": "console.log"},
	}
	data, _ := json.MarshalIndent(cfg, "", "  ")
	if err := os.WriteFile(filepath.Join(tmp, ConfigFile), append(data, '\n'), 0o644); err != nil {
		return fmt.Errorf("templates: %w", err)
	}
	if err := fsx.SyncTree(tmp); err != nil {
		return err
	}
	if err := fsx.RenameDir(tmp, dir); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return nil // a concurrent Synthesize (or an operator) got there first
		}
		return err
	}
	return nil
}

// writeSparseDisk creates a sparse image of size bytes with data bytes of a
// deterministic pattern, half at offset 0 and half at size/2.
func writeSparseDisk(path string, size, data int64) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return fmt.Errorf("templates: %w", err)
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		return fmt.Errorf("templates: %w", err)
	}
	half := data / 2
	buf := make([]byte, max(half, data-half))
	x := uint64(0x9e3779b97f4a7c15)
	for i := range buf {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		buf[i] = byte(x)
	}
	if _, err := f.WriteAt(buf[:half], 0); err != nil {
		return fmt.Errorf("templates: %w", err)
	}
	if _, err := f.WriteAt(buf[:data-half], size/2); err != nil {
		return fmt.Errorf("templates: %w", err)
	}
	return f.Close()
}
