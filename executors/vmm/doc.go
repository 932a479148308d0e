// Package vmm launches, adopts and terminates VMM processes (cloud-hypervisor,
// or chsim where CH cannot run), one per VM, so that a VM outlives the daemon
// that started it.
//
// Contract:
//   - Launch starts Config.Binary with only "--api-socket path=<RunDir>/api.sock",
//     in its own process group, with stdin from /dev/null and stdout/stderr
//     appended to <RunDir>/vmm.log (never pipes: a pipe to a dead daemon would
//     kill the VMM on its next write), with no parent-death signal, and when
//     Config.CgroupSlice is a writable cgroup v2 directory, inside a fresh
//     <CgroupSlice>/vm-<ID>.scope via CLONE_INTO_CGROUP. Where the cgroup tree
//     is not usable it logs that once per slice and launches without a scope.
//     It records the pid in <RunDir>/vmm.pid and returns once the socket
//     answers vmm.ping. A VMM that exits or stays silent is killed and
//     reported with the tail of its log.
//   - Adopt trusts the pid in vmm.pid only if /proc/<pid>/cmdline names the
//     binary (same path, or same base name) and this run dir's socket; a
//     reused pid is refused with ErrNotOurs, a missing one with ErrNoProcess.
//   - Terminate asks politely, then less so: vm.shutdown, vmm.shutdown, then
//     SIGTERM and finally SIGKILL, each after the grace period, re-reading the
//     cmdline before every signal and refusing (ErrNotOurs) to signal a
//     process that no longer matches. Signals go through a pidfd, so they
//     cannot reach a process that reused the pid after this one exited. Once
//     the process is gone it removes the pid file, the socket (and CH's
//     socket lock file) and the cgroup scope; the run dir itself is the
//     caller's.
//
// Errors: ErrNoProcess, ErrNotOurs, ErrAlreadyRunning, ErrUnresponsive,
// ErrExited; failures of the VMM's API are the ch package's typed errors.
package vmm
