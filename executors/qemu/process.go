package qemu

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sbxlog/sbxlog/executors/fsx"
	"github.com/sbxlog/sbxlog/executors/qemu/qmp"
)

// launch starts QEMU for m in runDir and returns its pid and a QMP connection.
// QEMU runs in its own process group with its output in qemu.log, so neither a
// signal to the daemon's group nor the daemon's exit reaches it. A machine with
// an agent network gets a fresh one (port and key) in agent.json first; if
// another process took the port before QEMU bound it, the launch is retried
// with another.
func (q *Recipes) launch(ctx context.Context, runDir string, m Meta, incoming bool, eg *EgressNet) (int, *qmp.Client, error) {
	if eg != nil && (!m.EgressNIC || !m.AgentNet) {
		return 0, nil, fmt.Errorf("%w: an egress NIC for a machine without one (snapshot made for another pool?)", ErrInvalidSpec)
	}
	for attempt := 1; ; attempt++ {
		var an *agentNet
		if m.AgentNet {
			n, err := newAgentNet()
			if err != nil {
				return 0, nil, err
			}
			n.Egress = eg
			if err := writeAgentNet(runDir, n); err != nil {
				return 0, nil, fmt.Errorf("qemu: launch: %w", err)
			}
			an = &n
		}
		pid, c, err := q.launchOnce(ctx, runDir, m, incoming, an)
		if err != nil && an != nil && attempt < launchAttempts && hostPortTaken(err) {
			q.log.Warn().Err(err).Str("run_dir", runDir).Msg("qemu: agent network port taken; launching again")
			continue
		}
		return pid, c, err
	}
}

func (q *Recipes) launchOnce(ctx context.Context, runDir string, m Meta, incoming bool, an *agentNet) (int, *qmp.Client, error) {
	// vm.json first: whoever finds the pid file can then always learn how the VM
	// was started, even after a daemon restart.
	vm, err := json.Marshal(m)
	if err != nil {
		return 0, nil, fmt.Errorf("qemu: launch: %w", err)
	}
	if err := fsx.WriteFileAtomic(filepath.Join(runDir, FileVM), vm, 0o600); err != nil {
		return 0, nil, fmt.Errorf("qemu: launch: %w", err)
	}
	for _, f := range []string{FileQMP, FileAgent, FilePID} {
		if err := os.Remove(filepath.Join(runDir, f)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return 0, nil, fmt.Errorf("qemu: launch: %w", err)
		}
	}
	logf, err := os.OpenFile(filepath.Join(runDir, FileLog), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return 0, nil, fmt.Errorf("qemu: launch: %w", err)
	}
	args := cmdline(runDir, m, incoming)
	if an != nil {
		args = append(args, an.args()...)
	}
	if m.EgressNIC {
		var eg *EgressNet
		if an != nil {
			eg = an.Egress
		}
		args = append(args, egressArgs(eg)...)
	}
	cmd := exec.Command(q.qemu, args...)
	cmd.Dir = runDir
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	err = cmd.Start()
	logf.Close()
	if err != nil {
		return 0, nil, fmt.Errorf("qemu: launch %s: %w", q.qemu, err)
	}
	pid := cmd.Process.Pid
	exited := make(chan struct{})
	children.Lock()
	children.m[pid] = exited
	children.Unlock()
	go func() {
		_ = cmd.Wait()
		children.Lock()
		delete(children.m, pid)
		children.Unlock()
		close(exited)
	}()
	fail := func(err error) (int, *qmp.Client, error) {
		_ = cmd.Process.Kill()
		<-exited
		return 0, nil, err
	}
	if err := fsx.WriteFileAtomic(filepath.Join(runDir, FilePID), []byte(strconv.Itoa(pid)+"\n"), 0o644); err != nil {
		return fail(fmt.Errorf("qemu: pid file: %w", err))
	}
	c, err := q.dialQMP(ctx, runDir, exited)
	if err != nil {
		return fail(err)
	}
	return pid, c, nil
}

// dialQMP connects to the QMP socket of runDir, retrying while QEMU starts up.
// exited, if not nil, ends the wait early when the process is gone.
func (q *Recipes) dialQMP(ctx context.Context, runDir string, exited <-chan struct{}) (*qmp.Client, error) {
	ctx, cancel := context.WithTimeout(ctx, q.startTimeout)
	defer cancel()
	var last error
	for {
		actx, acancel := context.WithTimeout(ctx, time.Second)
		c, err := qmp.Dial(actx, QMPSocket(runDir))
		acancel()
		if err == nil {
			return c, nil
		}
		last = err
		select {
		case <-exited:
			return nil, fmt.Errorf("%w before QMP answered: %s", ErrExited, logTail(runDir))
		case <-ctx.Done():
			return nil, fmt.Errorf("qemu: QMP at %s: %w (last: %w)", QMPSocket(runDir), ctx.Err(), last)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// logTail returns the last lines of qemu.log, for errors.
func logTail(runDir string) string {
	b, err := os.ReadFile(filepath.Join(runDir, FileLog))
	if err != nil {
		return "(no qemu.log: " + err.Error() + ")"
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > 8 {
		lines = lines[len(lines)-8:]
	}
	return strings.Join(lines, " | ")
}

// Adopt returns the pid of the QEMU process of the VM in spec.RunDir, or
// ErrNotRunning. A pid is trusted only if /proc/<pid>/cmdline names the QEMU binary
// and this run dir's QMP socket, so a recycled pid is never mistaken for the VM.
// A QEMU whose launch a crash cut short before its pid file was written (vm.json
// is there, qemu.pid is not) is found by that same cmdline check over /proc and
// gets its pid file.
func (q *Recipes) Adopt(spec Spec) (int, error) {
	if err := spec.validateDirs(); err != nil {
		return 0, err
	}
	return q.adopt(spec.RunDir)
}

func (q *Recipes) adopt(runDir string) (int, error) {
	pid, err := q.pid(runDir)
	if !errors.Is(err, os.ErrNotExist) {
		return pid, err
	}
	// launch writes vm.json before it starts QEMU and the pid file after: a
	// daemon killed in between leaves a QEMU that only its cmdline names.
	// Without vm.json no launch began, so the scan is skipped.
	if _, serr := os.Stat(filepath.Join(runDir, FileVM)); serr == nil {
		if pid := q.findByCmdline(runDir); pid > 0 {
			if err := fsx.WriteFileAtomic(filepath.Join(runDir, FilePID), []byte(strconv.Itoa(pid)+"\n"), 0o644); err != nil {
				return 0, fmt.Errorf("qemu: adopt: pid file: %w", err)
			}
			q.log.Warn().Int("pid", pid).Str("run_dir", runDir).Msg("qemu: adopted a QEMU that had no pid file (daemon died while launching it)")
			return pid, nil
		}
	}
	return 0, err
}

// pid returns the pid runDir's pid file names, trusted only if the process
// is this run dir's QEMU (else ErrNotRunning). A missing pid file is
// ErrNotRunning and os.ErrNotExist both.
func (q *Recipes) pid(runDir string) (int, error) {
	b, err := os.ReadFile(filepath.Join(runDir, FilePID))
	if errors.Is(err, os.ErrNotExist) {
		return 0, fmt.Errorf("%w: no pid file in %s: %w", ErrNotRunning, runDir, err)
	}
	if err != nil {
		return 0, fmt.Errorf("qemu: pid file: %w", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return 0, fmt.Errorf("%w: bad pid file %s: %q", ErrNotRunning, runDir, b)
	}
	if !q.isOurs(pid, runDir) {
		return 0, fmt.Errorf("%w: pid %d is not the QEMU of %s", ErrNotRunning, pid, runDir)
	}
	return pid, nil
}

// findByCmdline returns the live QEMU of runDir found by scanning /proc, or 0.
func (q *Recipes) findByCmdline(runDir string) int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err == nil && pid > 0 && q.isOurs(pid, runDir) {
			return pid
		}
	}
	return 0
}

// isOurs reports whether pid is alive and is the QEMU of runDir. A zombie has an
// empty cmdline, so an exited but unreaped process counts as gone.
func (q *Recipes) isOurs(pid int, runDir string) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil || len(b) == 0 {
		return false
	}
	args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
	if filepath.Base(args[0]) != filepath.Base(q.qemu) {
		return false
	}
	want := "path=" + escape(QMPSocket(runDir)) + ","
	for _, a := range args[1:] {
		if strings.Contains(a, want) && strings.HasPrefix(a, "socket,id=qmp,") {
			return true
		}
	}
	return false
}

// waitGone waits until pid is no longer the QEMU of runDir, or timeout.
func (q *Recipes) waitGone(ctx context.Context, pid int, runDir string, timeout time.Duration) bool {
	children.Lock()
	exited := children.m[pid]
	children.Unlock()
	t := time.NewTimer(timeout)
	defer t.Stop()
	if exited != nil {
		// Our own child: wait for the reaper so that no zombie outlives the call.
		select {
		case <-exited:
			return true
		case <-t.C:
			return false
		case <-ctx.Done():
			return false
		}
	}
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for q.isOurs(pid, runDir) {
		select {
		case <-tick.C:
		case <-t.C:
			return !q.isOurs(pid, runDir)
		case <-ctx.Done():
			return false
		}
	}
	return true
}

// terminate ends the VM's QEMU: QMP quit (through c when given, else a fresh
// connection), then SIGTERM, then SIGKILL, each after a grace period and each only
// after checking that pid still is this VM's QEMU.
func (q *Recipes) terminate(ctx context.Context, pid int, runDir string, c *qmp.Client) error {
	if !q.isOurs(pid, runDir) {
		return nil
	}
	qctx, cancel := context.WithTimeout(ctx, q.stopGrace)
	if c == nil {
		if nc, err := qmp.Dial(qctx, QMPSocket(runDir)); err == nil {
			c = nc
			defer nc.Close()
		}
	}
	if c != nil {
		// QEMU may exit before its answer is read; the wait below decides.
		_ = c.Execute(qctx, "quit", nil, nil)
	}
	cancel()
	if q.waitGone(ctx, pid, runDir, q.stopGrace) {
		return nil
	}
	// Signals go through a pidfd opened before the cmdline check, so the checked
	// process is the one signalled even if the pid is recycled in between.
	pidfd, err := unix.PidfdOpen(pid, 0)
	if errors.Is(err, unix.ESRCH) {
		return nil
	}
	if err != nil {
		pidfd = -1 // no pidfd support: fall back to kill after the check
	} else {
		defer unix.Close(pidfd)
	}
	for _, sig := range []unix.Signal{unix.SIGTERM, unix.SIGKILL} {
		if !q.isOurs(pid, runDir) {
			return nil
		}
		q.log.Warn().Int("pid", pid).Str("run_dir", runDir).Stringer("signal", sig).Msg("qemu did not exit; signalling")
		if pidfd >= 0 {
			err = unix.PidfdSendSignal(pidfd, sig, nil, 0)
		} else {
			err = unix.Kill(pid, sig)
		}
		if err != nil && !errors.Is(err, unix.ESRCH) {
			return fmt.Errorf("qemu: signal %d: %w", pid, err)
		}
		if q.waitGone(ctx, pid, runDir, q.stopGrace) {
			return nil
		}
	}
	return fmt.Errorf("qemu: pid %d survived SIGKILL for %s", pid, q.stopGrace)
}

// launchedMeta reads the Meta the VM in runDir was launched with.
func launchedMeta(runDir string) (Meta, error) {
	var m Meta
	b, err := os.ReadFile(filepath.Join(runDir, FileVM))
	if err != nil {
		return m, fmt.Errorf("qemu: %w", err)
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return m, fmt.Errorf("qemu: %s/%s: %w", runDir, FileVM, err)
	}
	return m, nil
}
