// Package qemu is the QEMU executor driver: it runs the project's test guest (or any
// kernel+initrd with the executors/guest/agent protocol on ttyS1) under qemu-system-x86_64
// and implements the recipes of DESIGN §3 with QEMU's mechanisms, for machines where
// Cloud Hypervisor cannot run.
//
// Process model: one QEMU per VM, in its own process group, started with the guest
// RAM in a memory-backend-file (share=on) at <run dir>/ram, a QMP socket, the
// console (ttyS0) in console.log and the agent (ttyS1) on agent.sock. The pid is
// recorded in qemu.pid and the launch parameters in vm.json; after a daemon restart
// a pid is trusted only if /proc/<pid>/cmdline names the QEMU binary and this run
// dir's QMP socket (Adopt); a QEMU started just before a crash, with vm.json but no
// pid file yet, is found by the same check over /proc.
//
// Snapshots live in the store as directories holding ram (a reflink of the RAM
// file), state (the migration stream, saved with x-ignore-shared so it holds only
// device state and firmware RAM, ~0.5 MB), disk.raw when the VM has a disk, and
// meta.json (what a restore needs to start a matching QEMU).
//
// Recipes (each a method taking a context and a Spec, returning per-step timings
// in a Result and which clone path ran):
//
//   - Boot: cold boot until the agent answers.
//   - Golden: Boot; stop; migrate the state into a temp dir inside the store;
//     clone RAM and disk next to it; meta.json; SyncTree; rename into place; quit.
//   - Clone / Wake: clone RAM and disk from the snapshot into the run dir; launch
//     with -incoming defer -S; migrate-incoming from the state file; cont; agent
//     ready. The snapshot is only read, so it can be removed right after.
//   - Hibernate: stop; as Golden from the migration on; then quit and remove the
//     run dir. A failure before the rename removes the temp dir and resumes the VM.
//   - Destroy: quit, SIGTERM, SIGKILL (each after checking the cmdline), remove the
//     run dir.
//   - Resume: cont a VM left stopped by a hibernate that a crash cut short before
//     its rename (reconcile decides between this and re-running Hibernate).
//
// Every recipe can be re-run after a crash: Golden and Hibernate find a complete
// snapshot (one with meta.json; SyncTree runs before the rename) and only finish
// the teardown; Boot, Clone and Wake find a running VM and report Already; Destroy
// of nothing succeeds. Temp dirs left in the store by a crash are removed by
// fsx.SweepTemp at start-up.
//
// Errors: ErrInvalidSpec, ErrNotRunning, ErrNoSnapshot, ErrExited, ErrMigration,
// ErrSnapshotExists (all wrapped with detail); QMP failures are *qmp.Error.
package qemu
