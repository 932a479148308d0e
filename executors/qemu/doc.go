// Package qemu runs sandbox VMs under qemu-system-x86_64, for machines where
// Cloud Hypervisor cannot run (`hypervisor: qemu`): the project's guests (see
// Templates below), or any kernel+initrd that speaks the executors/guest/agent
// protocol on ttyS1 (and, for the data plane, silkd on TCP port 2048 of its NIC).
// It has two layers:
//
//   - Driver (Config, New) is the executors.Driver: it maps the state
//     machine's intents to recipes with the same contracts as the Cloud
//     Hypervisor driver (executors/chdriver), and implements the start-up
//     reconcile's view (executors/reconcile.Driver), executors.Restarter and
//     exit watching (OnExit).
//   - Recipes (RecipesConfig, NewRecipes) runs the recipes on one VM described
//     by a Spec: Boot, Golden, Clone, Hibernate, Wake, Resume, Destroy, each
//     returning per-step timings in a RecipeResult and which clone path ran.
//     QMP goes through the subpackage qmp.
//
// Process model: one QEMU per VM, in its own process group, started with the
// guest RAM in a memory-backend-file (share=on) at <run dir>/ram, a QMP socket,
// the console (ttyS0) in console.log, the agent (ttyS1) on agent.sock and the
// agent network's NIC (below). The
// pid is recorded in qemu.pid and the launch parameters in vm.json; after a
// daemon restart a pid is trusted only if /proc/<pid>/cmdline names the QEMU
// binary and this run dir's QMP socket (Recipes.Adopt); a QEMU started just
// before a crash, with vm.json but no pid file yet, is found by the same check
// over /proc.
//
// Agent network (the data plane's transport; executors.AgentDialer): there
// is no vhost-vsock on the machines this driver is for, so the guest agent's
// silkd port is reached over QEMU's user-mode networking, restricted to the
// one VM:
//   - every machine booted by this driver gets a virtio NIC on a user-mode
//     netdev with restrict=on: the guest can send nothing to the host or to
//     any network (no NAT, no DNS, no host services); its only reachable
//     peer is the one forward below;
//   - one hostfwd, from 127.0.0.1:<port> on the host to the agent's TCP
//     port 2048 in the guest (10.0.2.15, set by the guest's init); the port
//     is free when chosen at every launch (a launch whose port was taken
//     before QEMU bound it is retried with another) and bound on loopback
//     only, so it is reachable from this host alone;
//   - as other local processes can reach a loopback port (and can bind it
//     while the VM's QEMU is dead), every connection starts with a mutual
//     challenge-response (package executors/guest/agent): host and guest
//     each send a fresh 32-byte nonce and prove they hold the VM's key with
//     an HMAC-SHA256 over both nonces and a direction label; the key never
//     crosses the wire. The key is 32 random bytes made at every launch,
//     kept in the run dir's agent.json (0600, next to the port) and given
//     to the guest agent over its serial port once it answers (every boot
//     and restore: a restored guest still holds the key of the VM it was
//     snapshotted from, a golden's for a clone). The agent refuses a host
//     that cannot prove the key and, until it has one, everyone. DialAgent
//     reads agent.json, connects, sends its nonce, checks the guest's proof
//     before it sends anything else (a listener that cannot prove the key
//     is refused: agent.ErrGuestUnproven), sends its own and reads "OK"; a
//     guest that refuses or cannot prove the key (a VM adopted after a
//     crash between launch and arming) is given it again over the serial
//     port, once.
//
// Many connections run at once (each is a TCP connection through QEMU's
// user-mode stack). Snapshots record the NIC (Meta.AgentNet), so a restore
// builds the same machine; one made before the NIC existed restores
// without it, and its VM has no data plane.
//
// Snapshots live in the store as directories holding ram (a reflink of the RAM
// file), state (the migration stream, saved with x-ignore-shared so it holds
// only device state and firmware RAM, ~0.5 MB), disk.qcow2 when the VM has a
// disk (a clone of the VM's, taken in the same stop as the RAM, so the two
// agree), and meta.json (what a restore needs to start a matching QEMU).
//
// Recipes:
//
//   - Boot: cold boot until the agent answers.
//   - Golden: Boot; stop; migrate the state into a temp dir inside the store;
//     clone RAM and disk next to it; meta.json; SyncTree; rename into place;
//     quit. A snapshot is therefore visible under its name only when complete.
//   - Clone / Wake: clone RAM and disk from the snapshot into the run dir;
//     launch with -incoming defer -S; migrate-incoming from the state file;
//     cont; agent ready. The snapshot is only read, so it can be removed right
//     after.
//   - Hibernate: stop; as Golden from the migration on; then quit and remove
//     the run dir. A failure before the rename removes the temp dir and resumes
//     the VM; so does a rename that landed and then failed (the store's fsync),
//     which removes the snapshot too: a failed hibernate names none, and a
//     re-run finding it would quit the VM that ran on. Once QEMU was told to
//     quit, the snapshot is the VM's only memory and stays for the re-run.
//   - Destroy: quit, SIGTERM, SIGKILL (each after checking the cmdline), remove
//     the run dir.
//   - Resume: cont a VM left stopped by a hibernate that a crash cut short
//     before its rename (reconcile decides between this and re-running
//     Hibernate).
//
// Every recipe can be re-run after a crash: Golden and Hibernate find a
// complete snapshot (one with meta.json; SyncTree runs before the rename) and
// only finish the teardown; Boot, Clone and Wake find a running VM and report
// Already; Destroy of nothing succeeds. Temp dirs left in the store by a crash
// are removed by fsx.SweepTemp (Driver.Prepare, at start-up).
//
// Driver layout (see layout.Roots):
//
//	<runs>/<instance>/<vm>/           one VM's run dir (intent RunDir): ram,
//	                                  disk.qcow2, qmp.sock, agent.sock, console.log,
//	                                  qemu.log, qemu.pid, vm.json, agent.json
//	<runs>/<instance>/golden-<h>/     a golden build's VM (h derived from the op)
//	<store>/golden/<key>-<op>/        a golden: ram state [disk.qcow2] meta.json
//	<store>/hibernate/<vm>-<op>/      a hibernated VM, same files
//	<store>/{,golden/,hibernate/}.sbx-tmp-*
//	                                  snapshots being assembled (swept by Prepare)
//
// Snapshot dirs in intents and results are relative to the store. Their names
// carry the op id, so a re-run of an operation finds its own result and never
// takes another operation's for it. Every run dir an intent names must start
// with the driver's instance id; a destroy of another instance's VM is refused
// (Unrecoverable) and nothing of it is touched.
//
// Intent mapping and re-runs (each recipe is idempotent under its op id):
//
//   - BuildGolden: Golden into golden/<key>-<op> from a run dir derived from
//     the op. A re-run finds a complete golden and only stops a build VM a
//     crash left behind; a build VM without a golden is adopted if it answers,
//     else restarted.
//   - CloneVM: Clone from in.GoldenDir (must be under golden/), or Boot of the
//     configured guest when in.Cold. A re-run finds the running VM (pid file +
//     cmdline, QMP status running) and reports it. On error the VM's QEMU and
//     run dir are gone.
//   - HibernateVM: Hibernate into hibernate/<vm>-<op>. A re-run after a daemon
//     crash adopts the QEMU (pid file + cmdline): past the rename it only quits
//     it; before it (QEMU stopped or in postmigrate, the temp dir swept) it
//     snapshots afresh. A failure before the rename leaves no snapshot and the
//     VM running (Resume makes sure of it, since a crash can leave it paused);
//     no QEMU and no snapshot means the VM is lost (Unrecoverable, Lost).
//   - WakeVM: Wake from in.SnapshotDir (must be under hibernate/). The run dir
//     gets its own clone of the RAM file, so Result.AfterCommit removes the
//     snapshot. A missing or damaged snapshot (meta.json unreadable, RAM or
//     state file not the recorded size) is Lost.
//   - DestroyVM: Destroy, then the snapshot when in.SnapshotDir is set.
//   - RestartVM (executors.Restarter): the VM whose QEMU died boots again,
//     cold, in its run dir, from its template: memory and disk start afresh
//     (what the VM wrote is lost).
//
// Start-up reconcile (AdoptVM, RemoveRunDir, RunDirs, ...): a warm or claimed
// VM's QEMU is adopted (resumed if a crash left it stopped) or reported dead;
// run dirs no state owns are destroyed. OnExit reports a watched QEMU (every VM
// after Clone, Wake, Restart or AdoptVM, until Hibernate or Destroy stops it)
// that exits on its own. A QEMU whose launch a crash cut short before its pid
// file is found by its cmdline (Recipes.Adopt), so every path above also stops
// or adopts those.
//
// Results carry an event.ExecReport: the recipe's steps (the Step* names plus
// StepRemoveSnapshot) and the copy mode of the RAM clones, "reflink" or "copy"
// (for a re-run that found its result in place: the mode Prepare detected).
//
// Templates: Config.Templates maps a pool's template name to the Guest it
// boots (kernel, initrd, optional disk); Driver.Templates lists the names, and
// a template not in the table is refused (*executors.Unrecoverable naming the
// ones served). CachedTemplates makes the table from the build caches:
// "busybox", the initramfs of executors/guest/build.sh alone (busybox and the
// agent; the fastest boot, for tests), and each root disk built by
// executors/guest/template.sh under its name, "default" being the Debian
// system `make guest` builds (bash, python3, git, ca-certificates, dropbear on
// port 22). A missing kernel, initrd or disk fails golden builds and cold
// boots with an *executors.Unrecoverable saying to run `make guest`.
//
// Disks: a template's disk is a qcow2 overlay over its read-only raw
// rootfs.img (named by absolute path in the overlay's header). Boot clones
// the template's empty overlay into the run dir, snapshots and restores clone
// the VM's overlay, so a clone copies what the VMs wrote (a few MB) and never
// the image, also where the store cannot reflink; the rootfs.img is shared by
// every VM and snapshot of the template, and must outlive them: a snapshot
// whose backing file is gone is incomplete (ErrNoSnapshot). A VM with a disk
// boots with RootAppend on its command line: the initramfs mounts the disk
// and switches into it (executors/guest/init).
//
// Sizes: a pool's size names vCPUs and memory in the one size table,
// fsm.Sizes (Config.Sizes overrides it). Under KVM a VM gets them as they are,
// as under Cloud Hypervisor. Under TCG it gets half of each (at least one
// vCPU), its memory capped at Config.TCGMaxMemoryMiB (default 1 GiB): small
// 256 MiB, medium 512 MiB, larger sizes 1 GiB. An emulated guest gains little
// from more, and every VM's RAM file is as large as its memory. Restores take
// memory and vCPUs from the snapshot.
//
// Egress network (egress.go; Config.Egress, from the node's lane, proxy and
// CA): every machine of a `net: egress` pool has a second virtio NIC at PCI
// slot 0x10 (EgressPCISlot), recorded in its snapshots (Meta.EgressNIC). A
// golden's has no backend; every VM's is on its own tap (executors/tap,
// named for the instance and the VM), attached to the bridge, isolated
// and locked by the lane (executors/egress/nft) before QEMU opens it, with
// the VM's own MAC (tap.MAC, so no two VMs share one on the bridge) and the
// address the lane leased it, pinned on the bridge. A restored guest holds
// the golden's (or its own last) MAC and address, so after every boot and
// restore, right after the data-plane key, the host gives the guest agent
// its network over the serial port (agent.NetConfig: MAC, address,
// gateway = the door's address, the proxy URL, NO_PROXY, the node CA),
// kept in agent.json with the key; the agent applies it (netlink), writes
// the trust store and makes the proxy and CA variables the environment of
// every process it starts. Its proxy door opens once the guest runs and
// closes before its tap is deleted (hibernate, destroy); the tap goes
// before its lock. A wake or restart makes tap and lock again (the same
// door and address when they are free). At start-up ReconcileEgress
// repairs the instance's locks as the Cloud Hypervisor driver's does, and
// AdoptVM reopens the doors. Without Config.Egress, egress pools are
// refused (Unrecoverable).
//
// Errors: the recipes return ErrInvalidSpec, ErrNotRunning, ErrNoSnapshot,
// ErrExited, ErrMigration, ErrSnapshotExists (all wrapped with detail); QMP
// failures are *qmp.Error. Driver turns them into the executors' classes:
// *executors.Unrecoverable for bad intents (paths outside the roots or of
// another instance, unknown sizes, egress without a lane, a missing guest, a missing golden,
// ErrInvalidSpec, ErrSnapshotExists), Lost for a VM or snapshot gone for good,
// executors.ErrCapacity for ENOSPC/EDQUOT; anything else is retryable.
package qemu
