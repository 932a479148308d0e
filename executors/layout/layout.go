// Package layout is the data directory's layout, shared by every driver and
// the start-up reconcile. Roots names its parts: <data>/run holds one run
// dir per VM (an intent's RunDir is relative to it and led by the instance
// id), <data>/store holds golden, hibernate and checkpoint snapshots (same filesystem as
// the runs, so FICLONE and hard links work between them), <data>/templates
// holds the templates golden builds and cold boots start from. Snapshot
// dirs in results and intents are relative to the store.
//
// The names of snapshots in the store and of golden build run dirs are
// fixed here, so a run dir or snapshot one driver's recipe wrote is found by
// the same names after a restart and by the reconcile. Paths from intents
// are resolved with checks that keep them inside their root: one that would
// leave it is an *executors.Unrecoverable error, as it can only come from a
// corrupt intent and acting on it could touch foreign files.
package layout

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"github.com/oklog/ulid/v2"

	"github.com/sbxlog/sbxlog/eventlog/event"
	"github.com/sbxlog/sbxlog/executors"
	"github.com/sbxlog/sbxlog/fsm"
)

// The store and run-dir layout every driver shares: snapshot names in the
// store, and the run dirs of golden builds. A run dir or snapshot written by
// one driver's recipe is thus found by the same names after a restart, and by
// the start-up reconcile.
const (
	// GoldenStore and HibernateStore are the store's snapshot directories.
	// They are spelled out rather than taken from the fsm intent kinds that
	// fill them: they name data on disk, which must stay where it is if a
	// kind is ever renamed.
	GoldenStore    = "golden"
	HibernateStore = "hibernate"
	// CheckpointStore holds checkpoints (fsm.CaptureCheckpoint), named by
	// their ids.
	CheckpointStore = "checkpoint"
	// GoldenRunPrefix starts the name of a golden build's run dir; the
	// other run dirs under an instance are VM ids.
	GoldenRunPrefix = "golden-"
)

// GoldenRel names a golden in the store: the key, made safe for a file name,
// and the build's op id (unique, so a rebuild never collides).
func GoldenRel(k fsm.PoolKey, op event.OpID) string {
	return filepath.Join(GoldenStore, slug(k.Template)+"_"+slug(k.Net)+"_"+slug(k.Size)+"-"+op.String())
}

// HibernateRel names a hibernate snapshot: the VM and the op id.
func HibernateRel(vm string, op event.OpID) string {
	return filepath.Join(HibernateStore, HibernatePrefix(vm)+op.String())
}

// CheckpointRel names a checkpoint in the store: its id (unique; the
// capture's op is in its meta).
func CheckpointRel(id string) string { return filepath.Join(CheckpointStore, slug(id)) }

// CloneSource resolves a clone's snapshot dir: a golden or a checkpoint (a
// clone never starts from a VM's hibernate snapshot).
func (r Roots) CloneSource(rel string) (string, error) {
	if strings.HasPrefix(rel, CheckpointStore+"/") {
		return r.SnapshotIn(CheckpointStore, rel)
	}
	return r.SnapshotIn(GoldenStore, rel)
}

// HibernatePrefix starts the name (under HibernateStore) of every hibernate
// snapshot of vm.
func HibernatePrefix(vm string) string { return slug(vm) + "-" }

// slug keeps [A-Za-z0-9.-] and turns anything else into '_'.
func slug(s string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '.', r == '-':
			return r
		}
		return '_'
	}, s)
}

// MaxSocketPath is the longest unix socket path Linux takes (sun_path less
// its NUL). A hypervisor's sockets live in its run dir, so the data dir's
// depth decides whether they fit.
const MaxSocketPath = 107

// runDirNameLen is the length of every run dir's name: "vm-" and 16 hex
// digits (fsm.VMID), or GoldenRunPrefix and 12 (GoldenRunDir).
const runDirNameLen = 19

// CheckSocketPath reports whether a socket named file fits a unix socket
// path in every run dir of instance. Drivers call it at start-up with their
// longest socket name, so a data dir too deep is a clear error then rather
// than a failed launch (EINVAL from bind) at the first clone.
func (r Roots) CheckSocketPath(instance, file string) error {
	sock := filepath.Join(r.InstanceRoot(instance), strings.Repeat("x", runDirNameLen), file)
	if len(sock) > MaxSocketPath {
		return fmt.Errorf("a VM's socket path (%s/<vm>/%s) is %d bytes, over the %d a unix socket allows; use a shorter data dir",
			r.InstanceRoot(instance), file, len(sock), MaxSocketPath)
	}
	return nil
}

// GoldenRunDir is where the golden build with intent op id op runs under
// instance: short (unix socket paths are limited to 108 bytes) and derived
// from the op, so a re-run finds the build VM of its first try.
func (r Roots) GoldenRunDir(instance string, op event.OpID) string {
	sum := sha256.Sum256(op[:])
	return filepath.Join(r.InstanceRoot(instance), GoldenRunPrefix+hex.EncodeToString(sum[:6]))
}

// InstanceRunDir resolves an intent's run dir (relative to Runs) and checks
// that it belongs to instance: a driver never acts on another instance's VMs.
func (r Roots) InstanceRunDir(instance, rel string) (string, error) {
	if first, _, _ := strings.Cut(rel, "/"); first != instance {
		return "", executors.Unrecoverablef("run dir %q is not under this instance (%s)", rel, instance)
	}
	return r.RunDir(rel)
}

// VMRunDir is InstanceRunDir for the run dir of VM vm, which is named
// after it: a rel whose last element is another name can only come from a
// corrupt record (Unrecoverable).
func (r Roots) VMRunDir(instance, vm, rel string) (string, error) {
	runDir, err := r.InstanceRunDir(instance, rel)
	if err != nil {
		return "", err
	}
	if filepath.Base(runDir) != vm {
		return "", executors.Unrecoverablef("run dir %q is not VM %s's", rel, vm)
	}
	return runDir, nil
}

// OwnedRunDir is InstanceRunDir for an intent that names the instance its VM
// was made under (owner; empty when the log did not record one): a VM of
// another instance is refused and never touched. verb names the recipe in
// the error.
func (r Roots) OwnedRunDir(instance, owner, vm, rel, verb string) (string, error) {
	if owner != "" && owner != instance {
		return "", executors.Unrecoverablef("%s %s: VM belongs to instance %q, not %q; not touching it", verb, vm, owner, instance)
	}
	return r.InstanceRunDir(instance, rel)
}

// SnapshotIn resolves an intent's snapshot dir, which must be a direct child
// of the store's sub (GoldenStore or HibernateStore): a bad intent can never
// make a wake or a destroy touch a golden, nor a clone start from a VM's
// hibernate snapshot.
func (r Roots) SnapshotIn(sub, rel string) (string, error) {
	if !strings.HasPrefix(rel, sub+"/") {
		return "", executors.Unrecoverablef("snapshot dir %q is not a %s snapshot", rel, sub)
	}
	dir, err := r.SnapshotDir(rel)
	if err != nil {
		return "", err
	}
	if filepath.Dir(dir) != filepath.Join(r.Store, sub) {
		return "", executors.Unrecoverablef("snapshot dir %q is not a %s snapshot", rel, sub)
	}
	return dir, nil
}

// ValidInstance checks that an instance id can name the directory its run
// dirs live in.
func ValidInstance(id string) error {
	if id == "" || strings.ContainsAny(id, "/\x00") || id == "." || id == ".." {
		return fmt.Errorf("instance id %q cannot name a directory", id)
	}
	return nil
}

// Roots are the data directory's parts the executors use.
type Roots struct {
	// Runs holds one run dir per VM: <Runs>/<instance>/<vm>.
	Runs string
	// Store holds golden and hibernate snapshots; it must be on the same
	// filesystem as Runs (memory-ranges is hard-linked into run dirs, cow.raw
	// is reflinked). Temp dirs (fsx.TempPrefix) live at its top level.
	Store string
	// Templates holds one directory per template name.
	Templates string
}

// RootsIn returns the standard layout under dataDir: run, store, templates.
func RootsIn(dataDir string) Roots {
	return Roots{
		Runs:      filepath.Join(dataDir, "run"),
		Store:     filepath.Join(dataDir, "store"),
		Templates: filepath.Join(dataDir, "templates"),
	}
}

// Validate checks that every root is set and absolute.
func (r Roots) Validate() error {
	for _, p := range []struct{ name, dir string }{{"runs", r.Runs}, {"store", r.Store}, {"templates", r.Templates}} {
		if p.dir == "" || !filepath.IsAbs(p.dir) {
			return fmt.Errorf("layout: %s root %q is not an absolute path", p.name, p.dir)
		}
	}
	return nil
}

// InstanceRoot returns <Runs>/<instance>, the parent of every run dir an
// instance owns.
func (r Roots) InstanceRoot(instance string) string { return filepath.Join(r.Runs, instance) }

// InstanceRunDirs lists the names of the entries under InstanceRoot(instance);
// none when it does not exist yet.
func (r Roots) InstanceRunDirs(instance string) ([]string, error) {
	ents, err := os.ReadDir(r.InstanceRoot(instance))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("layout: %w", err)
	}
	out := make([]string, 0, len(ents))
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out, nil
}

// Make creates the roots, the instance's run dir parent and the given
// subdirs of the store, and checks that Runs and Store share a filesystem:
// drivers hard-link and reflink between them, which fails across
// filesystems, so a daemon must refuse to start rather than fail per VM.
func (r Roots) Make(instance string, storeSubdirs ...string) error {
	dirs := []string{r.Runs, r.InstanceRoot(instance), r.Store, r.Templates}
	for _, sub := range storeSubdirs {
		dirs = append(dirs, filepath.Join(r.Store, sub))
	}
	for _, dir := range dirs {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("layout: %w", err)
		}
	}
	var rs, ss syscall.Stat_t
	if err := syscall.Stat(r.Runs, &rs); err != nil {
		return fmt.Errorf("layout: %w", err)
	}
	if err := syscall.Stat(r.Store, &ss); err != nil {
		return fmt.Errorf("layout: %w", err)
	}
	if rs.Dev != ss.Dev {
		return fmt.Errorf("layout: runs root %s and store %s are on different filesystems; VM files are hard-linked and reflinked between them", r.Runs, r.Store)
	}
	return nil
}

// RunDir resolves a run dir relative to Runs. A path that is empty,
// absolute or climbs out of the root is an *Unrecoverable error: it can only
// come from a corrupt intent, and acting on it could touch foreign files.
func (r Roots) RunDir(rel string) (string, error) { return within(r.Runs, rel, "run dir") }

// SnapshotDir resolves a snapshot dir relative to Store, with RunDir's checks.
func (r Roots) SnapshotDir(rel string) (string, error) { return within(r.Store, rel, "snapshot dir") }

// TemplateDir resolves a template name under Templates, with RunDir's checks.
func (r Roots) TemplateDir(name string) (string, error) { return within(r.Templates, name, "template") }

func within(root, rel, what string) (string, error) {
	if rel == "" || filepath.IsAbs(rel) {
		return "", executors.Unrecoverablef("%s %q: want a non-empty relative path", what, rel)
	}
	clean := filepath.Clean(rel)
	if clean == "." || clean == ".." || strings.HasPrefix(clean, "../") || clean != rel || strings.HasPrefix(filepath.Base(clean), ".") {
		return "", executors.Unrecoverablef("%s %q: not a clean path inside %s", what, rel, root)
	}
	return filepath.Join(root, clean), nil
}

// StaleHibernateSnapshots lists the hibernate snapshots (relative to the
// store) that the state no longer needs. own maps each VM of this instance
// in the state to the snapshot dirs it still needs; foreign holds the VMs
// of the state that belong to another instance, whose snapshots are never
// listed. An entry is stale when its name (HibernateRel: the VM, then the
// op) names a VM of own that does not keep it, or a VM the state no longer
// holds at all.
//
// The name decides, not the contents: a snapshot is made in a temp dir
// outside HibernateStore and renamed in complete, so the only incomplete
// entries under it are removals a crash cut short (RemoveAll takes the
// files in directory order, meta.json among them), and those must go too.
// Names that do not parse as HibernateRel are left alone. The caller
// removes what it is given: each driver owns its filesystem calls.
func (r Roots) StaleHibernateSnapshots(own map[string][]string, foreign map[string]bool) ([]string, error) {
	ents, err := os.ReadDir(filepath.Join(r.Store, HibernateStore))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("layout: %w", err)
	}
	// Names carry slug(vm); map them back to the state's ids.
	bySlug := make(map[string]string, len(own)+len(foreign))
	for vm := range own {
		bySlug[slug(vm)] = vm
	}
	for vm := range foreign {
		bySlug[slug(vm)] = vm
	}
	var stale []string
	for _, e := range ents {
		name, ok := hibernateVMSlug(e.Name())
		if !ok {
			continue
		}
		rel := filepath.Join(HibernateStore, e.Name())
		vm, known := bySlug[name]
		switch {
		case known && foreign[vm]:
			continue
		case known && slices.Contains(own[vm], rel):
			continue
		}
		stale = append(stale, rel)
	}
	return stale, nil
}

// hibernateVMSlug is the slug of the VM a HibernateRel entry name names:
// the name less its "-<op id>" suffix.
func hibernateVMSlug(name string) (string, bool) {
	i := strings.LastIndexByte(name, '-')
	if i <= 0 {
		return "", false
	}
	if _, err := ulid.ParseStrict(name[i+1:]); err != nil {
		return "", false
	}
	return name[:i], true
}
