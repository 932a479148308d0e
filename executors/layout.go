package executors

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/sbxlog/sbxlog/eventlog/event"
	"github.com/sbxlog/sbxlog/fsm"
)

// The store and run-dir layout every driver shares: snapshot names in the
// store, and the run dirs of golden builds. A run dir or snapshot written by
// one driver's recipe is thus found by the same names after a restart, and by
// the start-up reconcile.
const (
	// GoldenStore and HibernateStore are the store's snapshot directories.
	GoldenStore    = "golden"
	HibernateStore = "hibernate"
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
		return "", Unrecoverablef("run dir %q is not under this instance (%s)", rel, instance)
	}
	return r.RunDir(rel)
}

// OwnedRunDir is InstanceRunDir for an intent that names the instance its VM
// was made under (owner; empty when the log did not record one): a VM of
// another instance is refused and never touched. verb names the recipe in
// the error.
func (r Roots) OwnedRunDir(instance, owner, vm, rel, verb string) (string, error) {
	if owner != "" && owner != instance {
		return "", Unrecoverablef("%s %s: VM belongs to instance %q, not %q; not touching it", verb, vm, owner, instance)
	}
	return r.InstanceRunDir(instance, rel)
}

// SnapshotIn resolves an intent's snapshot dir, which must be a direct child
// of the store's sub (GoldenStore or HibernateStore): a bad intent can never
// make a wake or a destroy touch a golden, nor a clone start from a VM's
// hibernate snapshot.
func (r Roots) SnapshotIn(sub, rel string) (string, error) {
	if !strings.HasPrefix(rel, sub+"/") {
		return "", Unrecoverablef("snapshot dir %q is not a %s snapshot", rel, sub)
	}
	dir, err := r.SnapshotDir(rel)
	if err != nil {
		return "", err
	}
	if filepath.Dir(dir) != filepath.Join(r.Store, sub) {
		return "", Unrecoverablef("snapshot dir %q is not a %s snapshot", rel, sub)
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
