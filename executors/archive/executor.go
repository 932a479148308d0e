package archive

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/sbxlog/sbxlog/eventlog/event"
	"github.com/sbxlog/sbxlog/executors"
	"github.com/sbxlog/sbxlog/executors/fsx"
	"github.com/sbxlog/sbxlog/executors/layout"
	"github.com/sbxlog/sbxlog/fsm"
)

// Step names of the recipes, as ExecReport.Steps and the Hook see them.
const (
	StepCheck         = "check"          // is the op's result already there?
	StepPut           = "put"            // Store.Put of the local snapshot
	StepRemoveLocal   = "remove_local"   // the local snapshot, once the archive is verified
	StepMkTemp        = "mktemp"         // temp dir inside the local store
	StepGet           = "get"            // Store.Get into it (checksums verified)
	StepSyncFiles     = "sync_files"     // SyncTree of the temp dir
	StepRename        = "rename"         // temp dir into the hibernate store
	StepSyncTree      = "sync_tree"      // SyncTree of the final dir
	StepDeleteArchive = "delete_archive" // Store.Delete
	StepRemoveRun     = "remove_run"     // leftovers of an archived VM's run dir
)

// Config configures an Executor.
type Config struct {
	Store    Store
	Roots    layout.Roots
	Instance string
	// FS performs the local store's filesystem steps (default fsx.NewOS).
	FS fsx.FS
	// Hook, if set, runs before every step with the recipe (the intent
	// kind) and the step; an error fails the step as if it had failed
	// (the SBX_CRASH_AT seam and crash tests).
	Hook func(ctx context.Context, recipe, step string, op event.OpID) error
	// Now times the steps (default time.Now).
	Now func() time.Time
	Log zerolog.Logger
}

// Executor performs the archive intents for one instance; drivers delegate
// their executors.Archiver methods to it.
type Executor struct{ c Config }

var _ executors.Archiver = (*Executor)(nil)

// New returns an Executor; cfg.Store must be set.
func New(cfg Config) (*Executor, error) {
	if cfg.Store == nil {
		return nil, errors.New("archive: no store")
	}
	if err := layout.ValidInstance(cfg.Instance); err != nil {
		return nil, fmt.Errorf("archive: %w", err)
	}
	if cfg.FS == nil {
		cfg.FS = fsx.NewOS(cfg.Log)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	cfg.Log = cfg.Log.With().Str("component", "archive").Logger()
	return &Executor{c: cfg}, nil
}

// Name is the archive name of VM vm's archive made by op: the instance
// first, so instances sharing an archive dir never meet, and the op, so a
// re-run finds its own archive.
func Name(instance, vm string, op event.OpID) string { return instance + "/" + vm + "-" + op.String() }

// run is one recipe execution.
type run struct {
	x      *Executor
	ctx    context.Context
	recipe fsm.IntentKind
	op     event.OpID
	rep    event.ExecReport
}

func (x *Executor) begin(ctx context.Context, k fsm.IntentKind, op event.OpID) *run {
	return &run{x: x, ctx: ctx, recipe: k, op: op}
}

func (r *run) step(name string, fn func() error) error {
	if h := r.x.c.Hook; h != nil {
		if err := h(r.ctx, string(r.recipe), name, r.op); err != nil {
			return fmt.Errorf("%s %s: %w", r.recipe, name, err)
		}
	}
	t0 := r.x.c.Now()
	err := fn()
	r.rep.Steps = append(r.rep.Steps, event.Step{Name: name, NS: int64(r.x.c.Now().Sub(t0))})
	if err != nil {
		err = fmt.Errorf("%s %s: %w", r.recipe, name, err)
		if executors.IsCapacity(err) {
			return executors.Capacity(err)
		}
	}
	return err
}

// ownName refuses an archive name that is not this instance's.
func (x *Executor) ownName(name string) error {
	if !strings.HasPrefix(name, x.c.Instance+"/") {
		return executors.Unrecoverablef("archive %q is not this instance's (%s); not touching it", name, x.c.Instance)
	}
	return nil
}

// Archive implements executors.Archiver: put (and verify) the snapshot in
// the store, then remove the local copy. A re-run finds a complete archive
// and only removes what is left locally.
func (x *Executor) Archive(ctx context.Context, in fsm.ArchiveVM) (executors.Result, error) {
	src, err := x.c.Roots.SnapshotIn(layout.HibernateStore, in.SnapshotDir)
	if err != nil {
		return executors.Result{}, err
	}
	name := Name(x.c.Instance, in.VM, in.OpID)
	r := x.begin(ctx, fsm.KindArchive, in.OpID)
	var have bool
	if err := r.step(StepCheck, func() error {
		have, err = x.c.Store.Has(r.ctx, name)
		return err
	}); err != nil {
		return executors.Result{}, err
	}
	if !have {
		if _, err := os.Stat(src); errors.Is(err, fs.ErrNotExist) {
			return executors.Result{}, executors.Lostf("archive %s: snapshot %s is gone and no archive was made", in.VM, in.SnapshotDir)
		}
		if err := r.step(StepPut, func() error { return x.c.Store.Put(r.ctx, name, src) }); err != nil {
			return executors.Result{}, err
		}
	}
	if err := r.step(StepRemoveLocal, func() error { return x.c.FS.RemoveAll(src) }); err != nil {
		return executors.Result{}, err
	}
	return executors.Result{Report: r.rep, SnapshotDir: name}, nil
}

// Unarchive implements executors.Archiver: the archive is copied into a
// temp dir inside the local store (checksums verified), made durable and
// renamed into the hibernate store, and only then deleted from the
// archive. A re-run that finds the local snapshot skips the copy.
func (x *Executor) Unarchive(ctx context.Context, in fsm.UnarchiveVM) (executors.Result, error) {
	if err := x.ownName(in.Archive); err != nil {
		return executors.Result{}, err
	}
	rel := layout.HibernateRel(in.VM, in.OpID)
	final, err := x.c.Roots.SnapshotIn(layout.HibernateStore, rel)
	if err != nil {
		return executors.Result{}, err
	}
	r := x.begin(ctx, fsm.KindUnarchive, in.OpID)
	var local bool
	if err := r.step(StepCheck, func() error {
		_, err := os.Stat(final)
		local = err == nil
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return err
	}); err != nil {
		return executors.Result{}, err
	}
	if !local {
		if err := x.copyBack(r, in.Archive, final); err != nil {
			return executors.Result{}, err
		}
	}
	if err := r.step(StepDeleteArchive, func() error { return x.c.Store.Delete(r.ctx, in.Archive) }); err != nil {
		return executors.Result{}, err
	}
	return executors.Result{Report: r.rep, SnapshotDir: rel}, nil
}

// copyBack is Unarchive's copy: on any failure the temp dir goes and the
// archive is untouched; a missing or corrupt archive is Lost.
func (x *Executor) copyBack(r *run, name, final string) (err error) {
	var tmp string
	defer func() {
		if err != nil && tmp != "" {
			if rerr := x.c.FS.RemoveAll(tmp); rerr != nil {
				x.c.Log.Warn().Err(rerr).Str("tmp", tmp).Msg("unarchive: temp dir left for the start-up sweep")
			}
		}
	}()
	if err := r.step(StepMkTemp, func() error {
		tmp, err = x.c.FS.MkTempDir(x.c.Roots.Store, string(fsm.KindUnarchive))
		return err
	}); err != nil {
		return err
	}
	if err := r.step(StepGet, func() error { return x.c.Store.Get(r.ctx, name, tmp) }); err != nil {
		if errors.Is(err, ErrNotFound) || errors.Is(err, ErrCorrupt) {
			return &executors.Unrecoverable{Err: err, Lost: true}
		}
		return err
	}
	if err := r.step(StepSyncFiles, func() error { return x.c.FS.SyncTree(tmp) }); err != nil {
		return err
	}
	if err := r.step(StepRename, func() error { return x.c.FS.RenameDir(tmp, final) }); err != nil {
		return err
	}
	tmp = ""
	return r.step(StepSyncTree, func() error { return x.c.FS.SyncTree(final) })
}

// DeleteArchive implements executors.Archiver: the destroy of an archived
// VM. Every step tolerates what is already gone.
func (x *Executor) DeleteArchive(ctx context.Context, in fsm.DeleteArchiveVM) (executors.Result, error) {
	if in.Instance != "" && in.Instance != x.c.Instance {
		return executors.Result{}, executors.Unrecoverablef("archive delete %s: VM belongs to instance %q, not %q; not touching it", in.VM, in.Instance, x.c.Instance)
	}
	if err := x.ownName(in.Archive); err != nil {
		return executors.Result{}, err
	}
	r := x.begin(ctx, fsm.KindArchiveDelete, in.OpID)
	if err := r.step(StepDeleteArchive, func() error { return x.c.Store.Delete(r.ctx, in.Archive) }); err != nil {
		return executors.Result{}, err
	}
	if in.SnapshotDir != "" {
		snap, err := x.c.Roots.SnapshotIn(layout.HibernateStore, in.SnapshotDir)
		if err != nil {
			return executors.Result{}, err
		}
		if err := r.step(StepRemoveLocal, func() error { return x.c.FS.RemoveAll(snap) }); err != nil {
			return executors.Result{}, err
		}
	}
	if in.RunDir != "" {
		runDir, err := x.c.Roots.OwnedRunDir(x.c.Instance, in.Instance, in.VM, in.RunDir, string(fsm.KindArchiveDelete))
		if err != nil {
			return executors.Result{}, err
		}
		if err := r.step(StepRemoveRun, func() error { return x.c.FS.RemoveAll(runDir) }); err != nil {
			return executors.Result{}, err
		}
	}
	return executors.Result{Report: r.rep}, nil
}

// Prepare removes the temp dirs of Puts a crash interrupted (this
// instance's only); it runs at start-up, before any recipe.
func (x *Executor) Prepare() ([]string, error) {
	if d, ok := x.c.Store.(*DirStore); ok {
		return d.SweepTemp(x.c.Instance)
	}
	return nil, nil
}

// Dir is a helper for tests and the benchmark: the archive dir of name in
// a DirStore.
func (s *DirStore) Dir(name string) string { return filepath.Join(s.root, filepath.FromSlash(name)) }

// Delegate gives a driver the executors.Archiver methods: a driver embeds
// it and sets it from its config's store (NewDelegate), so every driver
// archives the same way. Without a store each method fails for good.
type Delegate struct{ x *Executor }

var _ executors.Archiver = Delegate{}

// NewDelegate returns the Delegate of cfg's Executor, or an empty one when
// cfg.Store is nil (no archive configured).
func NewDelegate(cfg Config) (Delegate, error) {
	if cfg.Store == nil {
		return Delegate{}, nil
	}
	x, err := New(cfg)
	return Delegate{x: x}, err
}

func (d Delegate) none(in fsm.Intent) error {
	return executors.Unrecoverablef("%s %s: this node has no archive store (archive_dir)", in.Kind(), in.Subject())
}

// Archive implements executors.Archiver.
func (d Delegate) Archive(ctx context.Context, in fsm.ArchiveVM) (executors.Result, error) {
	if d.x == nil {
		return executors.Result{}, d.none(in)
	}
	return d.x.Archive(ctx, in)
}

// Unarchive implements executors.Archiver.
func (d Delegate) Unarchive(ctx context.Context, in fsm.UnarchiveVM) (executors.Result, error) {
	if d.x == nil {
		return executors.Result{}, d.none(in)
	}
	return d.x.Unarchive(ctx, in)
}

// DeleteArchive implements executors.Archiver.
func (d Delegate) DeleteArchive(ctx context.Context, in fsm.DeleteArchiveVM) (executors.Result, error) {
	if d.x == nil {
		return executors.Result{}, d.none(in)
	}
	return d.x.DeleteArchive(ctx, in)
}

// PrepareArchive sweeps the archive's temp dirs of this instance (start-up).
func (d Delegate) PrepareArchive() ([]string, error) {
	if d.x == nil {
		return nil, nil
	}
	return d.x.Prepare()
}
