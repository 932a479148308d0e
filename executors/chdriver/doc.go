// Package chdriver is the Cloud Hypervisor executors.Driver: the side-effect
// recipes (clone from golden, hibernate, wake, destroy, golden build) over
// the CH REST API, run against cloud-hypervisor or the chsim simulator (the
// binary is injected; the recipes do not know which).
//
// Layout (see layout.Roots):
//
//	<runs>/<instance>/<vm>/        one VM's run dir (intent RunDir)
//	    api.sock vmm.pid vmm.log   the VMM (package vmm)
//	    cow.raw                    the VM's disk (reflink of the golden's)
//	    vsock.sock console.log     per-VM device files
//	    restore/                   vm.restore's source: config.json (paths
//	                               rewritten), state.json, memory-ranges (a
//	                               hard link to the snapshot's, which the VM
//	                               maps copy-on-write)
//	<runs>/<instance>/golden-<h>/  a golden build's VM
//	<store>/golden/<key>-<op>/     a golden: config.json state.json
//	                               memory-ranges cow.raw meta.json
//	<store>/hibernate/<vm>-<op>/   a hibernated VM, same files
//	<store>/.sbx-tmp-*             snapshots being assembled (swept by Prepare)
//
// meta.json is written last, atomically, before the directory is renamed
// into place: a snapshot dir with a meta.json naming the op is complete.
// Only the store is made durable. Run dirs are not fsynced: a host crash
// kills their VMs anyway, and every recipe starts a run dir over unless it
// finds its own VM running there.
// Snapshot names carry the op id, so a re-run of an operation finds its own
// result and never collides with another operation's.
//
// Recipes are sequences of named steps (the Step* constants); each step's
// duration goes into the result's ExecReport together with the copy mode of
// the disk clone ("reflink" or "copy"). Re-running a recipe with the same op
// id after a crash at any step completes it or rolls it back:
//
//   - Clone / Wake: a VMM already serving the run dir with the VM Running (or
//     Paused after its restore) is adopted and finished (resume, probe);
//     anything else in the run dir is torn down and the recipe starts over.
//     Wake leaves the snapshot alone; Result.AfterCommit removes it, which
//     is safe because the run dir holds its own link to memory-ranges and a
//     reflink copy of cow.raw, so nothing maps the snapshot's names.
//   - Hibernate: a complete snapshot under the op's name means the crash hit
//     after the rename: SyncTree it again and finish stopping the VM.
//     Otherwise pause (idempotent) and snapshot afresh. A failure before the
//     rename removes the temp dir and resumes the VM; if the VMM is gone by
//     then, the VM is lost (Unrecoverable with Lost). A failure after the
//     rename (its SyncTree, stopping the VM) while the VM is still paused in
//     a live VMM removes the snapshot too and resumes the VM: a failed
//     hibernate's state never names a snapshot, so none is left for the
//     start-up sweep; once the VMM is gone or the VM shut down the snapshot
//     is its only memory and stays for the re-run. A re-run that found its
//     snapshot and fails the same way rolls back the same way.
//   - Golden: a complete golden under the op's name is kept and the build VM
//     removed; otherwise the build starts over from the template.
//   - Destroy: every step tolerates what is already gone.
//
// Hibernate's durability order: vm.snapshot into a temp dir in the store;
// FICLONE cow.raw into it; SyncTree the temp dir (every file fsynced before
// the rename, as the issue asks); meta.json (temp, fsync, rename, fsync dir);
// rename into the store (fsyncs both parents); SyncTree the final dir (the
// order the recipe requires: every file, the dir and its parent durable
// before the VM stops; nearly free after the first); only then vm.shutdown
// and terminate the VMM.
//
// The probe step of every recipe that boots or restores a VM (clone from a
// golden or checkpoint, cold boot, wake, restart, golden build, and the
// adoption of an interrupted one) ends by setting the guest's clock to the
// host's over the control agent on vsock port Config.AgentPort
// (executors.SyncGuestClock, shared with QEMU): CH restores the KVM clock
// with the snapshot, so a clone starts at its golden's build time and a
// woken VM at its hibernate. The correction is logged; an agent that
// refuses the verb is a warning, not a failure.
//
// Templates: under chsim a missing template directory of a configured pool
// (a golden build, or a cold boot with CloneVM.Pooled) is synthesized
// (templates.Synthesize). Otherwise (a template no pool names, and always
// with cloud-hypervisor) a missing template is an Unrecoverable error
// naming the path.
//
// Tests and benchmarks observe or break recipes through Config.FS (an
// fsx.Recorder), Config.NewAPI (a recording API wrapper) and
// Config.StepHook (called before every step and every rollback action).
package chdriver
