package reconcile

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sbxlog/sbxlog/executors/vmm"
)

// The orphan scan (step 1 of Run) is the Cloud Hypervisor-only part of this
// package: it reads CH's command line (vmm.APISocket) and pid file.

// pidFile is the VMM's pid file in its run dir.
const pidFile = vmm.PidFile

// vmmProc is a live VMM process of this instance.
type vmmProc struct {
	pid    int
	socket string
	runDir string
	// filePid is what the run dir's pid file says (0: none).
	filePid int
}

// recorded reports whether the run dir's pid file names this process, which
// makes it the VMM the driver adopts (or stops) for that run dir.
func (p vmmProc) recorded() bool { return p.filePid == p.pid }

// scanVMMs lists live processes running binary with an API socket in a run
// dir directly under instRoot.
func scanVMMs(procRoot, binary, instRoot string) ([]vmmProc, error) {
	ents, err := os.ReadDir(procRoot)
	if err != nil {
		return nil, err
	}
	var out []vmmProc
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid <= 0 {
			continue
		}
		sock, ok := vmmSocket(procRoot, pid, binary)
		if !ok || filepath.Dir(filepath.Dir(sock)) != instRoot || !vmm.ProcessLive(procRoot, pid) {
			continue
		}
		p := vmmProc{pid: pid, socket: sock, runDir: filepath.Dir(sock)}
		if data, err := os.ReadFile(filepath.Join(p.runDir, pidFile)); err == nil {
			p.filePid, _ = strconv.Atoi(strings.TrimSpace(string(data)))
		}
		out = append(out, p)
	}
	return out, nil
}

// vmmSocket returns the API socket named by pid's command line when the
// process runs binary (same path or same base name).
func vmmSocket(procRoot string, pid int, binary string) (string, bool) {
	data, err := os.ReadFile(filepath.Join(procRoot, strconv.Itoa(pid), "cmdline"))
	if err != nil {
		return "", false
	}
	return vmm.APISocket(data, binary)
}

// killOrphan stops p: SIGTERM, then SIGKILL after grace. Signals go through
// a pidfd opened after which the command line is checked again, so a pid
// reused by another program is never signalled.
func killOrphan(ctx context.Context, procRoot string, p vmmProc, binary string, grace time.Duration) error {
	fd, err := unix.PidfdOpen(p.pid, 0)
	if errors.Is(err, unix.ESRCH) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("pidfd_open %d: %w", p.pid, err)
	}
	defer unix.Close(fd)
	if sock, ok := vmmSocket(procRoot, p.pid, binary); !ok || sock != p.socket {
		return nil // it exited and the pid was reused
	}
	for _, sig := range []unix.Signal{unix.SIGTERM, unix.SIGKILL} {
		if err := unix.PidfdSendSignal(fd, sig, nil, 0); err != nil {
			if errors.Is(err, unix.ESRCH) {
				return nil
			}
			return fmt.Errorf("%s pid %d: %w", sig, p.pid, err)
		}
		if waitPidfd(ctx, fd, grace) {
			return nil
		}
	}
	return fmt.Errorf("pid %d survived SIGKILL for %s", p.pid, grace)
}

// waitPidfd waits until the process behind fd exits, for at most d.
func waitPidfd(ctx context.Context, fd int, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for {
		left := time.Until(deadline)
		if left <= 0 || ctx.Err() != nil {
			return false
		}
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, int(min(left, 100*time.Millisecond)/time.Millisecond)+1)
		if err != nil && !errors.Is(err, unix.EINTR) {
			return false
		}
		if n > 0 {
			return true
		}
	}
}
