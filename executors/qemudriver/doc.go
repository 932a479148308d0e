// Package qemudriver is the QEMU executors.Driver: it maps the state machine's
// intents to the recipes of package executors/qemu (Golden, Clone, Boot,
// Hibernate, Wake, Destroy) with the same contracts as the Cloud Hypervisor
// driver (executors/chdriver), so sandboxd runs real VMs where CH cannot run
// (`hypervisor: qemu`).
//
// Layout (see executors.Roots):
//
//	<runs>/<instance>/<vm>/           one VM's run dir (intent RunDir): ram,
//	                                  qmp.sock, agent.sock, console.log,
//	                                  qemu.log, qemu.pid, vm.json (package qemu)
//	<runs>/<instance>/golden-<h>/     a golden build's VM (h derived from the op)
//	<store>/golden/<key>-<op>/        a golden: ram state meta.json
//	<store>/hibernate/<vm>-<op>/      a hibernated VM, same files
//	<store>/{,golden/,hibernate/}.sbx-tmp-*
//	                                  snapshots being assembled (swept by Prepare)
//
// Snapshot dirs in intents and results are relative to the store. Their names
// carry the op id, so a re-run of an operation finds its own result and never
// takes another operation's for it. Every run dir an intent names must start
// with this driver's instance id; a destroy of another instance's VM is refused
// (Unrecoverable) and nothing of it is touched.
//
// Intent mapping and re-runs (each recipe is idempotent under its op id; see
// package qemu for the step order, which is DESIGN §3's):
//
//   - BuildGolden: qemu.Golden into golden/<key>-<op> from a run dir derived
//     from the op. A re-run finds a complete golden and only stops a build VM a
//     crash left behind; a build VM without a golden is adopted if it answers,
//     else restarted.
//   - CloneVM: qemu.Clone from in.GoldenDir (must be under golden/), or qemu.Boot
//     of the configured guest when in.Cold. A re-run finds the running VM
//     (pid file + cmdline, QMP status running) and reports it. On error the VM's
//     QEMU and run dir are gone.
//   - HibernateVM: qemu.Hibernate into hibernate/<vm>-<op>. A re-run after a
//     daemon crash adopts the QEMU (pid file + cmdline): past the rename it only
//     quits it; before it (QEMU stopped or in postmigrate, the temp dir swept)
//     it snapshots afresh. A failure before the rename leaves no snapshot and the
//     VM running (qemu.Resume makes sure of it, since a crash can leave it
//     paused); no QEMU and no snapshot means the VM is lost (Unrecoverable, Lost).
//   - WakeVM: qemu.Wake from in.SnapshotDir (must be under hibernate/). The run
//     dir gets its own clone of the RAM file, so Result.AfterCommit removes the
//     snapshot. A missing or damaged snapshot (meta.json unreadable, RAM or state
//     file not the recorded size) is Lost.
//   - DestroyVM: qemu.Destroy (QMP quit, SIGTERM, SIGKILL, each after the cmdline
//     check), then the snapshot when in.SnapshotDir is set.
//   - RestartVM (executors.Restarter): the VM whose QEMU died boots again, cold,
//     in its run dir; the guest has no disk, so it starts empty.
//
// Start-up reconcile (executors/reconcile.Driver: AdoptVM, RemoveRunDir,
// RunDirs, ...): a warm or claimed VM's QEMU is adopted (resumed if a crash
// left it stopped) or reported dead; run dirs no state owns are destroyed.
// OnExit reports a watched QEMU (every VM after Clone, Wake, Restart or
// AdoptVM, until Hibernate or Destroy stops it) that exits on its own. A QEMU
// whose launch a crash cut short before its pid file is found by its cmdline
// (qemu.Driver.Adopt), so every path above also stops or adopts those.
//
// Results carry an event.ExecReport: the recipe's steps (qemu.Step* names plus
// remove_snap) and the copy mode of the RAM clones, "reflink" or "copy" (for a
// re-run that found its result in place: the mode Prepare detected).
//
// Guest: every template boots the one configured guest (Config.Kernel,
// Config.Initrd, built by `make guest`; CachedGuest finds the newest build).
// A missing kernel or initrd fails golden builds and cold boots with an
// *executors.Unrecoverable saying to run `make guest`.
//
// Sizes: a pool's size names memory and vCPUs through Config.Sizes
// (DefaultSizes: small 256 MiB, medium 512 MiB, large 1 GiB, xlarge 2 GiB,
// 2xlarge 4 GiB). Under TCG memory is capped at Config.TCGMaxMemoryMiB
// (default 1 GiB): an emulated guest gains nothing from more, and every VM's RAM
// file is as large as its memory. Restores take memory from the snapshot.
// Pools with net "egress" are refused (Unrecoverable): the QEMU guest has no NIC.
//
// Errors: *executors.Unrecoverable for bad intents (paths outside the roots or
// of another instance, unknown sizes, egress, a missing guest, a missing
// golden), Lost for a VM or snapshot gone for good, executors.ErrCapacity for
// ENOSPC/EDQUOT; anything else is retryable.
package qemudriver
