package chdriver

import (
	"context"
	"fmt"
	"time"

	"github.com/rs/zerolog"

	"github.com/sbxlog/sbxlog/eventlog/event"
	"github.com/sbxlog/sbxlog/executors"
	"github.com/sbxlog/sbxlog/executors/ch"
	"github.com/sbxlog/sbxlog/executors/fsx"
)

// A recipe is named by the intent kind it performs (string(fsm.KindClone)
// and so on), in logs, error texts and StepCall.Recipe, except RecipeCold.
//
// RecipeCold is the cold boot of a clone (fsm.CloneVM with Cold set): the
// same intent kind as a clone from the golden, but a different recipe with
// other steps, so it has a name of its own that is not an intent kind.
const RecipeCold = "cold"

// Step names, as they appear in ExecReport.Steps and StepCall.Step.
const (
	StepCheck          = "check"        // is the op's result already there (snapshot, running VM)?
	StepAdopt          = "adopt"        // vm.info of a VMM already serving the run dir
	StepInfo           = "info"         // vm.info before a hibernate
	StepBalloon        = "balloon"      // wait for the balloon to settle
	StepPause          = "pause"        // vm.pause
	StepMkTemp         = "mktemp"       // temp dir in the store
	StepSnapshot       = "snapshot"     // vm.snapshot
	StepCloneDisk      = "clone_disk"   // FICLONE (or sparse copy) of cow.raw
	StepSyncFiles      = "sync_files"   // SyncTree of the temp dir, before the rename
	StepWriteMeta      = "write_meta"   // meta.json: temp, fsync, rename, fsync dir
	StepRename         = "rename"       // temp dir into the store (fsyncs parents)
	StepSyncTree       = "sync_tree"    // SyncTree of the final dir
	StepShutdown       = "shutdown"     // vm.shutdown
	StepTerminate      = "terminate"    // vmm.shutdown, SIGTERM, SIGKILL
	StepTapDelete      = "tap_delete"   // delete the VM's tap
	StepRemoveRun      = "remove_run"   // remove the run dir
	StepRemoveSnapshot = "remove_snap"  // remove the VM's snapshot (destroy)
	StepResetRun       = "reset_run"    // tear down leftovers and recreate the run dir
	StepLinkMemory     = "link_memory"  // hard-link memory-ranges into the run dir
	StepWriteState     = "write_state"  // state.json into the run dir (a reflink copy)
	StepWriteConfig    = "write_config" // config.json with paths rewritten
	StepTapCreate      = "tap_create"
	StepLaunch         = "launch"    // start the VMM, wait for vmm.ping
	StepRestore        = "restore"   // vm.restore
	StepNIC            = "nic"       // swap NICs (egress clones)
	StepResume         = "resume"    // vm.resume
	StepProbe          = "probe"     // vm.info Running + vsock CONNECT answered
	StepTemplate       = "template"  // load (or synthesize) the template
	StepCloneTemplate  = "clone_tpl" // clone the template's disk into the run dir
	StepCreate         = "create"    // vm.create
	StepBoot           = "boot"      // vm.boot
	StepWarmup         = "warmup"
	StepDigest         = "digest"  // a promoted template's content digest
	StepDiscard        = "discard" // rename a collected snapshot to trash, remove it
)

// Category groups steps for the benchmark's split of an operation's time.
type Category string

// Step categories.
const (
	CatCH    Category = "ch"    // CH API calls (and waits on vm.info)
	CatVMM   Category = "vmm"   // starting and stopping VMM processes
	CatClone Category = "clone" // FICLONE or the sparse-copy fallback
	CatFsync Category = "fsync" // steps whose cost is fsync
	CatGuest Category = "guest" // readiness probe, warmup
	CatHost  Category = "host"  // other filesystem and netlink work
)

// StepCategory returns the category of a step name.
func StepCategory(step string) Category {
	switch step {
	case StepAdopt, StepInfo, StepBalloon, StepPause, StepSnapshot, StepShutdown, StepRestore, StepNIC, StepResume, StepCreate, StepBoot:
		return CatCH
	case StepLaunch, StepTerminate:
		return CatVMM
	case StepCloneDisk, StepCloneTemplate:
		return CatClone
	case StepSyncFiles, StepWriteMeta, StepRename, StepSyncTree, StepDiscard:
		return CatFsync
	case StepProbe, StepWarmup:
		return CatGuest
	}
	return CatHost
}

// StepCall describes a step about to run, for Config.StepHook.
type StepCall struct {
	// Recipe is the recipe's name: its intent kind, or RecipeCold.
	Recipe string
	Step   string
	Op     event.OpID
	// RunDir is the absolute run dir of the VM (or golden build).
	RunDir string
	// Undo is set for rollback actions, which run after a failed step.
	Undo bool
}

// run is one recipe execution: its report and its hook context.
type run struct {
	d      *Driver
	ctx    context.Context
	recipe string
	op     event.OpID
	runDir string
	log    zerolog.Logger
	rep    event.ExecReport
	copied fsx.Method
}

func (d *Driver) begin(ctx context.Context, recipe string, op event.OpID, runDir string) *run {
	return &run{
		d: d, ctx: ctx, recipe: recipe, op: op, runDir: runDir,
		log: d.log.With().Str("recipe", recipe).Str("op", op.String()).Logger(),
	}
}

// step runs one named step, timing it into the report. Errors are wrapped
// with the recipe and step; capacity failures are marked.
func (r *run) step(name string, fn func() error) error {
	if h := r.d.hook; h != nil {
		if err := h(r.ctx, StepCall{Recipe: r.recipe, Step: name, Op: r.op, RunDir: r.runDir}); err != nil {
			return r.wrap(name, err)
		}
	}
	t0 := r.d.now()
	err := fn()
	r.rep.Steps = append(r.rep.Steps, event.Step{Name: name, NS: int64(r.d.now().Sub(t0))})
	if err != nil {
		return r.wrap(name, err)
	}
	return nil
}

func (r *run) wrap(name string, err error) error {
	err = fmt.Errorf("%s %s: %w", r.recipe, name, err)
	if executors.IsCapacity(err) {
		return executors.Capacity(err)
	}
	return err
}

// undo runs a rollback action. It never fails the recipe (the caller returns
// the original error); a failed action is logged and left to a re-run or to
// the start-up sweep. It runs on a context that outlives a cancellation, so
// a shutdown mid-recipe still rolls back. It returns nil only when the
// action ran and succeeded, for a later action that must not run otherwise
// (teardown's unlock).
func (r *run) undo(name string, fn func(ctx context.Context) error) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.ctx), 30*time.Second)
	defer cancel()
	if h := r.d.hook; h != nil {
		if err := h(ctx, StepCall{Recipe: r.recipe, Step: name, Op: r.op, RunDir: r.runDir, Undo: true}); err != nil {
			r.log.Warn().Err(err).Str("step", name).Msg("rollback action skipped")
			return err
		}
	}
	err := fn(ctx)
	if err != nil {
		r.log.Warn().Err(err).Str("step", name).Msg("rollback action failed")
	}
	return err
}

// noteClone records how a disk was cloned; one copy makes the report "copy".
func (r *run) noteClone(m fsx.Method) {
	if r.copied != fsx.Copy {
		r.copied = m
	}
}

func (r *run) result(snapshotDir string) executors.Result {
	rep := r.rep
	if r.copied != 0 {
		rep.CopyMode = r.copied.String()
	}
	return executors.Result{Report: rep, SnapshotDir: snapshotDir}
}

// info is the vm.info step that precedes the balloon wait and the pause.
func (r *run) info(api API) (info *ch.VmInfo, err error) {
	err = r.step(StepInfo, func() error {
		info, err = api.Info(r.ctx)
		return err
	})
	return info, err
}
