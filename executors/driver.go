package executors

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/sbxlog/sbxlog/eventlog/event"
	"github.com/sbxlog/sbxlog/fsm"
)

// Driver performs the side effects of intents for one hypervisor backend.
//
// Common contract of every method:
//   - Idempotent under the intent's op id: calling it again with the same
//     intent, after it returned, failed, or the process died at any point in
//     it, either completes the operation or rolls it back. Nothing
//     half-written ever appears under a final name in the snapshot store:
//     snapshots are assembled in fsx temp dirs inside the store and renamed
//     into place once every file is fsynced; leftover temp dirs are removed
//     by the driver's start-up sweep.
//   - On error, what the call made is already rolled back as far as the
//     method's doc says, so the caller only reports the failure.
//   - Errors are retryable unless they wrap *Unrecoverable or ErrCapacity.
//   - Calls for different VMs may run concurrently; calls for one VM never
//     overlap (the state machine has one operation in flight per VM).
type Driver interface {
	// BuildGolden cold-boots the template of in.Key, waits for readiness,
	// settles the balloon, pauses, snapshots into the store and stops the
	// build VM. Result.SnapshotDir names the golden (relative to the store).
	// On error no golden and no build VM are left.
	BuildGolden(ctx context.Context, in fsm.BuildGolden) (Result, error)
	// Clone makes in.VM a running, ready VM in in.RunDir: restored from the
	// golden in.GoldenDir, or cold-booted from the template when in.Cold. On
	// error the run dir, the VMM and the VM's tap are gone.
	Clone(ctx context.Context, in fsm.CloneVM) (Result, error)
	// Hibernate snapshots the running VM into the store (Result.SnapshotDir)
	// and stops it; the run dir is removed. On error before the snapshot is
	// in the store the VM is running again and no snapshot is left; an error
	// wrapping *Unrecoverable with Lost means the VMM died and the VM is gone.
	Hibernate(ctx context.Context, in fsm.HibernateVM) (Result, error)
	// Wake restores in.VM from in.SnapshotDir into in.RunDir, resumes it and
	// waits for readiness. The snapshot is left in place; Result.AfterCommit
	// removes it and must run only once the result is durable. On error the
	// snapshot is intact and no VMM runs (Lost: the snapshot is unusable).
	Wake(ctx context.Context, in fsm.WakeVM) (Result, error)
	// Destroy stops the VM's VMM (vm.shutdown, vmm.shutdown, SIGTERM, SIGKILL,
	// never signalling a process that is not this VM's), deletes its tap and
	// removes its run dir and, when in.SnapshotDir is set, its snapshot. A VM
	// of another instance is never touched (Unrecoverable).
	Destroy(ctx context.Context, in fsm.DestroyVM) (Result, error)
}

// Restarter is implemented by drivers that can boot a claimed VM again,
// cold, from the disk in its run dir after its VMM died (fsm.RestartVM).
// Restart is idempotent under the op id like every Driver method; on error
// no VMM of the VM is left running and its disk is kept. The Pool fails the
// restart intents of a driver without it (the claim then fails).
type Restarter interface {
	Restart(ctx context.Context, in fsm.RestartVM) (Result, error)
}

// Result is what a successful Driver call reports.
type Result struct {
	// Report goes into the result event: per-step timings and the copy mode.
	Report event.ExecReport
	// SnapshotDir is the snapshot made (golden, hibernate), relative to the
	// store root.
	SnapshotDir string
	// AfterCommit, if set, is work that may only run once the result is
	// durable in the log (Wake: drop the snapshot it restored from). The pool
	// runs it in the background after a successful Propose, and never when
	// the result was rejected.
	AfterCommit func(ctx context.Context) error
}

// Kind names an intent kind, for logs and metrics.
type Kind string

// Intent kinds.
const (
	KindGolden    Kind = "golden"
	KindClone     Kind = "clone"
	KindHibernate Kind = "hibernate"
	KindWake      Kind = "wake"
	KindDestroy   Kind = "destroy"
	KindRestart   Kind = "restart"
)

// KindOf returns the kind of an intent ("" for an unknown type).
func KindOf(in fsm.Intent) Kind {
	switch in.(type) {
	case fsm.BuildGolden:
		return KindGolden
	case fsm.CloneVM:
		return KindClone
	case fsm.HibernateVM:
		return KindHibernate
	case fsm.WakeVM:
		return KindWake
	case fsm.DestroyVM:
		return KindDestroy
	case fsm.RestartVM:
		return KindRestart
	}
	return ""
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
			return fmt.Errorf("executors: %s root %q is not an absolute path", p.name, p.dir)
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
		return nil, fmt.Errorf("executors: %w", err)
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
			return fmt.Errorf("executors: %w", err)
		}
	}
	var rs, ss syscall.Stat_t
	if err := syscall.Stat(r.Runs, &rs); err != nil {
		return fmt.Errorf("executors: %w", err)
	}
	if err := syscall.Stat(r.Store, &ss); err != nil {
		return fmt.Errorf("executors: %w", err)
	}
	if rs.Dev != ss.Dev {
		return fmt.Errorf("executors: runs root %s and store %s are on different filesystems; VM files are hard-linked and reflinked between them", r.Runs, r.Store)
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
		return "", Unrecoverablef("%s %q: want a non-empty relative path", what, rel)
	}
	clean := filepath.Clean(rel)
	if clean == "." || clean == ".." || strings.HasPrefix(clean, "../") || clean != rel || strings.HasPrefix(filepath.Base(clean), ".") {
		return "", Unrecoverablef("%s %q: not a clean path inside %s", what, rel, root)
	}
	return filepath.Join(root, clean), nil
}
