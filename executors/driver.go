package executors

import (
	"context"
	"time"

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
	// Promote snapshots in.VM into a new golden of in.Target in the store
	// (Result.SnapshotDir, Result.Digest): a running VM in a pause window,
	// after which it runs on; a hibernated one from its image
	// in.SnapshotDir, without waking. On error nothing is left in the
	// store and the VM is as it was (Lost: its VMM died).
	Promote(ctx context.Context, in fsm.PromoteVM) (Result, error)
	// CollectSnapshot removes in.Dir, a snapshot dir nothing references or
	// maps, from the store crash-safely (renamed to a trash name first); a
	// dir already gone is success.
	CollectSnapshot(ctx context.Context, in fsm.CollectSnapshot) (Result, error)
}

// Restarter is implemented by drivers that can boot a claimed VM again,
// cold, from the disk in its run dir after its VMM died (fsm.RestartVM).
// Restart is idempotent under the op id like every Driver method; on error
// no VMM of the VM is left running and its disk is kept. The dispatch table
// fails the restart intents of a driver without it (the claim then fails).
type Restarter interface {
	Restart(ctx context.Context, in fsm.RestartVM) (Result, error)
}

// Checkpointer is implemented by drivers that capture a claim's VM into a
// checkpoint (fsm.CaptureCheckpoint: a running VM paused only for its
// snapshot, a hibernated one exported from its image) and remove one
// (fsm.RemoveCheckpoint). Both are idempotent under the op id like every
// Driver method; a failed capture leaves nothing in the store and the VM
// running (Lost: its VMM died). The dispatch table fails the captures of a
// driver without it.
type Checkpointer interface {
	Checkpoint(ctx context.Context, in fsm.CaptureCheckpoint) (Result, error)
	RemoveCheckpoint(ctx context.Context, in fsm.RemoveCheckpoint) (Result, error)
}

// Archiver is implemented by drivers that have an archive store (package
// executors/archive performs these for every driver): Archive moves a
// hibernated VM's snapshot there (fsm.ArchiveVM), Unarchive brings it back
// (fsm.UnarchiveVM), DeleteArchive is the destroy of an archived VM
// (fsm.DeleteArchiveVM). Each is idempotent under the op id like every
// Driver method. The dispatch table fails them for good on a driver
// without an archive store.
type Archiver interface {
	Archive(ctx context.Context, in fsm.ArchiveVM) (Result, error)
	Unarchive(ctx context.Context, in fsm.UnarchiveVM) (Result, error)
	DeleteArchive(ctx context.Context, in fsm.DeleteArchiveVM) (Result, error)
}

// Result is what a successful Driver call reports.
type Result struct {
	// Report goes into the result event: per-step timings and the copy mode.
	Report event.ExecReport
	// SnapshotDir is the snapshot made (golden, hibernate, promote),
	// relative to the store root.
	SnapshotDir string
	// Digest is a promoted template's content digest (fsx.ContentDigest).
	Digest string
	// Checkpoint is what an import learned of its checkpoint's origin
	// record (CheckpointImporter).
	Checkpoint *fsm.CheckpointMeta
	// AfterCommit, if set, is work that may only run once the result is
	// durable in the log (Wake: drop the snapshot it restored from). The
	// scheduler runs it in the background after a successful Propose, and
	// never when the result was rejected.
	AfterCommit func(ctx context.Context) error
}

// Method is how the executors perform one intent kind: the Driver method
// that does it, and the default bound of one call.
type Method struct {
	// Call runs the Driver method for in, an intent of the method's kind.
	Call func(ctx context.Context, d Driver, in fsm.Intent) (Result, error)
	// Timeout is the default bound of one attempt.
	Timeout time.Duration
}

// methods is the dispatch table: for every intent kind, the Driver method
// performing it. A new intent kind is one Driver method (or an optional
// interface, as Restarter) and one entry here.
var methods = map[fsm.IntentKind]Method{
	fsm.KindGolden:    method(Driver.BuildGolden, 10*time.Minute),
	fsm.KindClone:     method(Driver.Clone, 2*time.Minute),
	fsm.KindHibernate: method(Driver.Hibernate, 10*time.Minute),
	fsm.KindWake:      method(Driver.Wake, 2*time.Minute),
	fsm.KindDestroy:   method(Driver.Destroy, time.Minute),
	fsm.KindRestart:   method(restart, 2*time.Minute),
	// Checkpoints (Checkpointer).
	fsm.KindCheckpoint:       method(checkpoint, 10*time.Minute),
	fsm.KindCheckpointDelete: method(removeCheckpoint, time.Minute),
	fsm.KindPromote:          method(Driver.Promote, 10*time.Minute),
	fsm.KindCollect:          method(Driver.CollectSnapshot, time.Minute),
	// volumes.go: an optional interface, like Restarter.
	fsm.KindAttachVolume: method(attachVolume, time.Minute),
	fsm.KindDetachVolume: method(detachVolume, time.Minute),
	// The archive's kinds (Archiver): archive.go.
	fsm.KindArchive:       method(archiveCall(Archiver.Archive), time.Hour),
	fsm.KindUnarchive:     method(archiveCall(Archiver.Unarchive), time.Hour),
	fsm.KindArchiveDelete: method(archiveCall(Archiver.DeleteArchive), 10*time.Minute),
	// Checkpoint transport (CheckpointImporter): a whole checkpoint over
	// the network.
	fsm.KindCheckpointImport: method(importCheckpoint, time.Hour),
}

// MethodFor returns the Driver method performing intents of kind k; false
// for a kind no driver performs.
func MethodFor(k fsm.IntentKind) (Method, bool) {
	m, ok := methods[k]
	return m, ok
}

// method adapts a Driver method taking the concrete intent type I.
func method[I fsm.Intent](call func(Driver, context.Context, I) (Result, error), timeout time.Duration) Method {
	return Method{Timeout: timeout, Call: func(ctx context.Context, d Driver, in fsm.Intent) (Result, error) {
		t, ok := in.(I)
		if !ok {
			return Result{}, Unrecoverablef("intent %T is not a %T", in, t)
		}
		return call(d, ctx, t)
	}}
}

// restart runs a Restarter's Restart; a driver without one fails the
// intent at once (the claim then fails rather than waiting for ever).
func restart(d Driver, ctx context.Context, in fsm.RestartVM) (Result, error) {
	if r, ok := d.(Restarter); ok {
		return r.Restart(ctx, in)
	}
	return Result{}, Unrecoverablef("restart %s: this hypervisor driver cannot restart VMs", in.VM)
}

// checkpoint runs a Checkpointer's Checkpoint; a driver without one fails
// the capture at once (the checkpoint or fork then fails).
func checkpoint(d Driver, ctx context.Context, in fsm.CaptureCheckpoint) (Result, error) {
	if c, ok := d.(Checkpointer); ok {
		return c.Checkpoint(ctx, in)
	}
	return Result{}, Unrecoverablef("checkpoint %s: this hypervisor driver cannot capture VMs", in.VM)
}

// removeCheckpoint runs a Checkpointer's RemoveCheckpoint; a driver without
// one never made a checkpoint, so there is nothing to remove.
func removeCheckpoint(d Driver, ctx context.Context, in fsm.RemoveCheckpoint) (Result, error) {
	if c, ok := d.(Checkpointer); ok {
		return c.RemoveCheckpoint(ctx, in)
	}
	return Result{}, nil
}

// CheckpointImporter is implemented by drivers that import a checkpoint
// another node took (fsm.FetchCheckpoint; package executors/transport
// performs it for every driver): fetched from its origin, verified, and
// published into the store under its id, idempotent under the op id like
// every Driver method. On error nothing of it is left in the store.
type CheckpointImporter interface {
	ImportCheckpoint(ctx context.Context, in fsm.FetchCheckpoint) (Result, error)
}

// importCheckpoint runs a CheckpointImporter's ImportCheckpoint; a driver
// without one fails the import at once (the claim waiting on it then
// fails).
func importCheckpoint(d Driver, ctx context.Context, in fsm.FetchCheckpoint) (Result, error) {
	if im, ok := d.(CheckpointImporter); ok {
		return im.ImportCheckpoint(ctx, in)
	}
	return Result{}, Unrecoverablef("import of checkpoint %s: this node cannot import checkpoints", in.Checkpoint)
}
