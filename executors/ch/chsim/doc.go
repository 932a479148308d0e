// Package chsim simulates the Cloud Hypervisor REST API: one Server is one
// VMM process serving one VM over a unix socket, like cloud-hypervisor
// started with only --api-socket. It runs no guest code and needs no KVM.
//
// What it reproduces, so that code tested against it behaves the same on CH:
//   - the endpoints under /api/v1 with the real server's status codes and
//     error bodies (a JSON array of strings, the error chain), including the
//     places where the server differs from its OpenAPI file: vmm.shutdown
//     answers 200; a wrong method or a body on a bodiless action is 400 (405
//     is never sent); wrong-state calls are 500; pausing a paused VM is 500
//     with InvalidStateTransition(Paused, Paused); 404 for no VM or an
//     unknown device id; 409 for a duplicate device id;
//   - the VM state machine: no VM -> Created -> Running <-> Paused ->
//     Shutdown (-> Running again on vm.boot), vm.delete back to no VM;
//   - snapshots written for real: vm.snapshot needs a Paused VM and an
//     existing file:// directory and creates config.json, memory-ranges (a
//     sparse file of the guest's memory size holding only the data the guest
//     wrote, DirtyBytes at boot) and state.json, each O_EXCL, without fsync;
//   - vm.restore reading them back: Copy into anonymous memory; CopyOnWrite
//     (and OnDemand) by mapping memory-ranges MAP_PRIVATE for the VM's
//     lifetime, so the running guest's writes never reach the file and its
//     pages are shared with the page cache; a truncated file faults (SIGBUS)
//     like it kills a real guest. A memory file that does not match
//     state.json's checksum fails a Copy restore (which reads it all); a
//     mapped restore stays O(1) and its guest crashes on its first run
//     instead, ending the VMM process as a dying guest ends CH;
//   - devices opened the way CH opens them: disk images must exist and are
//     OFD-locked (two VMs on one image fail), the vsock socket is bound
//     without unlinking (a stale path fails), serial/console files created;
//   - a balloon that inflates at BalloonRate while the guest runs, so
//     vm.info's memory_actual_size converges to memory size minus balloon
//     size; vm.resize moves the target;
//   - hybrid vsock: "CONNECT <port>\n" is answered "OK <n>\n" once the VM runs
//     (and AgentDelay after boot has passed); then, on the silkd port (2048),
//     a simulated guest agent speaks the real silkd protocol (guest.go:
//     silkagent's simulated guest, which says it is simulated, simulates a
//     few commands and never runs a host one, and forwards
//     silkagent.SimEchoPort to an echo server and SimHTTPPort to an HTTP
//     server; chsim keeps the guest's files
//     in memory and in its snapshots); on agent.VsockPort (1024) the
//     guest's control agent (clock.go: the line protocol of
//     executors/guest/agent, serving ready, key and clock); on any other
//     port lines are echoed;
//   - the guest's wall clock, simulated (clock.go): the host's at boot, it
//     stands still while the VM is paused (CH saves and sets back the KVM
//     clock), is kept in the snapshot and restored at the snapshot's moment,
//     and the control agent's clock verb sets it, recording the time it was
//     told (vm.counters) and answering the simulated clock it replaced. It
//     never reads or sets anything of the host's but its time.
//
// Fault injection (Options, or the SBX_CHSIM_* environment variables listed
// with ApplyEnv and in Usage): latency per call, failing the n-th call of an
// endpoint with a status (or exiting, or hanging), dying mid-snapshot after K
// bytes, dying at a random time. Crashes are SIGKILL to itself, which leaves
// the API socket file behind exactly as a crashed VMM does.
//
// vm.counters carries, besides per-device counters, a "chsim-guest" entry
// (heartbeats, resumes, data_bytes) so tests can see the guest run.
package chsim
