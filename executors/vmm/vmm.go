package vmm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"

	"github.com/sbxlog/sbxlog/executors/ch"
	"github.com/sbxlog/sbxlog/executors/layout"
)

// File names inside a run dir.
const (
	SocketFile = "api.sock"
	PidFile    = "vmm.pid"
	LogFile    = "vmm.log"
)

// DefaultReadyTimeout bounds the wait for a launched VMM's first vmm.ping.
const DefaultReadyTimeout = 10 * time.Second

var (
	// ErrNoProcess: no pid file, or the process it names has exited.
	ErrNoProcess = errors.New("vmm: no VMM process")
	// ErrNotOurs: the pid belongs to a process whose command line does not
	// name this binary and this VM's socket (a reused pid).
	ErrNotOurs = errors.New("vmm: process is not this VM's VMM")
	// ErrAlreadyRunning: Launch found a live VMM serving the run dir.
	ErrAlreadyRunning = errors.New("vmm: a VMM already serves this run dir")
	// ErrUnresponsive: the process is ours but its socket does not answer.
	ErrUnresponsive = errors.New("vmm: VMM does not answer vmm.ping")
	// ErrExited: the VMM exited while being launched.
	ErrExited = errors.New("vmm: VMM exited")
)

// Config describes one VM's VMM process.
type Config struct {
	// Binary is the VMM executable (absolute path).
	Binary string
	// RunDir is the VM's run directory; api.sock, vmm.pid and vmm.log live
	// in it. Launch creates it.
	RunDir string
	// ID names the cgroup scope, vm-<ID>.scope.
	ID string
	// CgroupSlice is the cgroup v2 directory the VM's scope goes under (see
	// DefaultCgroupSlice); empty launches without a scope.
	CgroupSlice string
	// Env is added to the VMM's environment (SBX_CHSIM_* for chsim).
	Env []string
	// ReadyTimeout bounds the wait for the first vmm.ping
	// (DefaultReadyTimeout).
	ReadyTimeout time.Duration
	// ClientOptions configure the API client of the process.
	ClientOptions []ch.Option
	// Log receives notices (a cgroup fallback, a forced kill).
	Log zerolog.Logger
}

// SocketPath is the API socket of the config's run dir.
func (c *Config) SocketPath() string { return filepath.Join(c.RunDir, SocketFile) }

func (c *Config) validate() error {
	if c.Binary == "" || !filepath.IsAbs(c.Binary) {
		return fmt.Errorf("vmm: binary %q is not an absolute path", c.Binary)
	}
	if c.RunDir == "" || !filepath.IsAbs(c.RunDir) {
		return fmt.Errorf("vmm: run dir %q is not an absolute path", c.RunDir)
	}
	if len(c.SocketPath()) > layout.MaxSocketPath {
		return fmt.Errorf("vmm: socket path %q is too long for a unix socket", c.SocketPath())
	}
	if c.CgroupSlice != "" && (c.ID == "" || strings.ContainsAny(c.ID, "/\x00") || c.ID == "." || c.ID == "..") {
		return fmt.Errorf("vmm: id %q cannot name a cgroup scope", c.ID)
	}
	return nil
}

// Process is a VMM this daemon launched or adopted.
type Process struct {
	cfg    Config
	pid    int
	pidfd  int // -1 when the kernel offers none
	client *ch.Client
	scope  string // cgroup scope dir, "" if none

	exited  chan struct{}
	release chan struct{}
	once    sync.Once
	mu      sync.Mutex // guards pidfd against Release during a signal
}

// Pid is the VMM's process id.
func (p *Process) Pid() int { return p.pid }

// Client talks to the VMM's API socket.
func (p *Process) Client() *ch.Client { return p.client }

// SocketPath is the VMM's API socket.
func (p *Process) SocketPath() string { return p.cfg.SocketPath() }

// Scope is the cgroup scope directory the VMM runs in, "" if none.
func (p *Process) Scope() string { return p.scope }

// Exited is closed once the process has exited.
func (p *Process) Exited() <-chan struct{} { return p.exited }

// Alive reports whether the process still runs.
func (p *Process) Alive() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// Release forgets the process without touching it: the VMM keeps running
// and can be adopted again.
func (p *Process) Release() {
	p.once.Do(func() { close(p.release) })
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.pidfd >= 0 {
		unix.Close(p.pidfd)
		p.pidfd = -1
	}
}

// Launch starts a VMM for cfg and waits until it answers vmm.ping.
func Launch(ctx context.Context, cfg Config) (*Process, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.RunDir, 0o700); err != nil {
		return nil, fmt.Errorf("vmm: %w", err)
	}
	sock := cfg.SocketPath()
	if pid, err := readPid(cfg.RunDir); err == nil {
		if ok, _ := matchCmdline(pid, cfg.Binary, sock); ok {
			return nil, fmt.Errorf("%w: pid %d", ErrAlreadyRunning, pid)
		}
	}
	// A VMM whose launcher died before writing the pid file may still serve
	// the socket; never unlink a socket that answers.
	if _, err := os.Lstat(sock); err == nil {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		_, perr := ch.New(sock).Ping(pctx)
		cancel()
		if perr == nil {
			return nil, fmt.Errorf("%w: %s answers", ErrAlreadyRunning, sock)
		}
	}
	for _, f := range []string{PidFile, SocketFile, SocketFile + ".lock"} {
		if err := os.Remove(filepath.Join(cfg.RunDir, f)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("vmm: %w", err)
		}
	}

	logf, err := os.OpenFile(filepath.Join(cfg.RunDir, LogFile), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("vmm: %w", err)
	}
	defer logf.Close()
	logStart, _ := logf.Seek(0, io.SeekEnd)

	scope, scopeFD := prepareScope(&cfg)
	pidfd := -1
	start := func(useScope bool) (*exec.Cmd, error) {
		cmd := exec.Command(cfg.Binary, "--api-socket", "path="+sock)
		cmd.Dir = cfg.RunDir
		cmd.Env = append(os.Environ(), cfg.Env...)
		cmd.Stdout, cmd.Stderr = logf, logf
		attr := &syscall.SysProcAttr{Setpgid: true, PidFD: &pidfd}
		if useScope {
			attr.UseCgroupFD, attr.CgroupFD = true, scopeFD
		}
		cmd.SysProcAttr = attr
		return cmd, cmd.Start()
	}
	cmd, err := start(scopeFD >= 0)
	if err != nil && scopeFD >= 0 {
		logOnce(cfg.Log, "clone:"+cfg.CgroupSlice, "cgroup scope could not be entered; VMMs run in the daemon's cgroup", err, cfg.CgroupSlice)
		_ = unix.Rmdir(scope)
		scope = ""
		cmd, err = start(false)
	}
	if scopeFD >= 0 {
		unix.Close(scopeFD)
	}
	if err != nil {
		if scope != "" {
			_ = unix.Rmdir(scope)
		}
		return nil, fmt.Errorf("vmm: start %s: %w", cfg.Binary, err)
	}
	p := &Process{
		cfg: cfg, pid: cmd.Process.Pid, pidfd: pidfd, scope: scope,
		client:  ch.New(sock, cfg.ClientOptions...),
		exited:  make(chan struct{}),
		release: make(chan struct{}),
	}
	go func() {
		// Wait on the pidfd through the runtime's poller first: a blocking
		// wait would hold an OS thread per VMM for the VM's whole life.
		// A child is always reaped, also after Release.
		p.waitPidfd(false)
		_ = cmd.Wait()
		close(p.exited)
		p.Release() // the pidfd has nothing left to refer to
	}()
	if err := writePid(cfg.RunDir, p.pid); err != nil {
		p.kill()
		return nil, err
	}
	if err := p.waitReady(ctx); err != nil {
		p.kill()
		tail := logTail(filepath.Join(cfg.RunDir, LogFile), logStart)
		return nil, fmt.Errorf("%w\nvmm.log:\n%s", err, tail)
	}
	return p, nil
}

// waitReady polls vmm.ping until it answers, the process exits or time runs
// out. Between attempts it sleeps until something is created in the run dir
// (inotify), so the first ping follows the socket's bind closely without
// spinning; a refused connection means bind happened and listen is next.
func (p *Process) waitReady(ctx context.Context) error {
	timeout := p.cfg.ReadyTimeout
	if timeout <= 0 {
		timeout = DefaultReadyTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	created, stop := watchCreate(p.cfg.RunDir)
	defer stop()
	probe := ch.New(p.SocketPath(), ch.WithTimeouts(ch.Timeouts{Call: time.Second}))
	for {
		_, err := probe.Ping(ctx)
		if err == nil {
			return nil
		}
		wait := 5 * time.Millisecond // a fallback: events can coalesce or be missing
		if created == nil {
			wait = time.Millisecond
		}
		if errors.Is(err, syscall.ECONNREFUSED) {
			wait = 100 * time.Microsecond
		}
		t := time.NewTimer(wait)
		select {
		case <-p.exited:
			t.Stop()
			return fmt.Errorf("%w before answering vmm.ping (pid %d)", ErrExited, p.pid)
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%w within %s: %v", ErrUnresponsive, timeout, err)
		case <-created:
		case <-t.C:
		}
		t.Stop()
	}
}

// watchCreate signals on the returned channel when an entry is created in
// dir. It returns a nil channel where inotify is unavailable.
func watchCreate(dir string) (<-chan struct{}, func()) {
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		return nil, func() {}
	}
	if _, err := unix.InotifyAddWatch(fd, dir, unix.IN_CREATE|unix.IN_MOVED_TO); err != nil {
		unix.Close(fd)
		return nil, func() {}
	}
	f := os.NewFile(uintptr(fd), "inotify") // non-blocking: the runtime poller waits on it
	events := make(chan struct{}, 1)
	go func() {
		buf := make([]byte, 4096)
		for {
			if _, err := f.Read(buf); err != nil {
				return
			}
			select {
			case events <- struct{}{}:
			default:
			}
		}
	}()
	// Closing an inotify instance waits for an SRCU grace period (10+ ms);
	// nothing needs to wait for that.
	return events, func() { go f.Close() }
}

// kill ends a process that failed to launch and cleans up after it.
func (p *Process) kill() {
	_ = p.signal(unix.SIGKILL)
	select {
	case <-p.exited:
	case <-time.After(10 * time.Second):
	}
	p.cleanup()
	p.Release()
}

// Adopt takes over the VMM recorded in cfg.RunDir after a daemon restart. It
// returns ErrNoProcess when there is none, ErrNotOurs when the pid file names
// another process. If the process is ours but does not answer vmm.ping, it
// returns the Process together with an error wrapping ErrUnresponsive, so the
// caller can still Terminate it.
func Adopt(ctx context.Context, cfg Config) (*Process, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	pid, err := readPid(cfg.RunDir)
	if err != nil {
		return nil, err
	}
	sock := cfg.SocketPath()
	if err := checkOurs(pid, cfg.Binary, sock); err != nil {
		return nil, err
	}
	pidfd, err := unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK)
	if err != nil {
		if errors.Is(err, unix.ESRCH) {
			return nil, fmt.Errorf("%w: pid %d exited", ErrNoProcess, pid)
		}
		pidfd = -1
	}
	// The pid could have been reused between the check and pidfd_open.
	if err := checkOurs(pid, cfg.Binary, sock); err != nil {
		if pidfd >= 0 {
			unix.Close(pidfd)
		}
		return nil, err
	}
	p := &Process{
		cfg: cfg, pid: pid, pidfd: pidfd,
		client:  ch.New(sock, cfg.ClientOptions...),
		exited:  make(chan struct{}),
		release: make(chan struct{}),
		scope:   scopeOf(pid, cfg),
	}
	go p.watchAdopted()
	pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	_, err = p.client.Ping(pctx)
	cancel()
	if err != nil {
		return p, fmt.Errorf("%w (pid %d): %w", ErrUnresponsive, pid, err)
	}
	return p, nil
}

func checkOurs(pid int, binary, sock string) error {
	ok, err := matchCmdline(pid, binary, sock)
	switch {
	case err != nil:
		return fmt.Errorf("%w: pid %d: %v", ErrNoProcess, pid, err)
	case !ok:
		return fmt.Errorf("%w: pid %d does not run %s with %s", ErrNotOurs, pid, filepath.Base(binary), sock)
	}
	return nil
}

// watchAdopted closes exited when a process that is not our child exits.
// After Release it returns without reporting anything.
func (p *Process) watchAdopted() {
	exited, usable := p.waitPidfd(true)
	if !usable {
		exited = p.pollProc()
	}
	if exited {
		p.reap()
		close(p.exited)
		p.Release()
	}
}

// waitPidfd waits for the pidfd to become readable, which it does when the
// process exits, or (with stopOnRelease) for Release. usable is false when
// there is no pidfd to wait on.
func (p *Process) waitPidfd(stopOnRelease bool) (exited, usable bool) {
	// Dup under the lock: Release closes p.pidfd, and its number could be
	// reused by the time an unlocked Dup ran.
	p.mu.Lock()
	if p.pidfd < 0 {
		p.mu.Unlock()
		return false, false
	}
	dup, err := unix.Dup(p.pidfd)
	p.mu.Unlock()
	if err != nil {
		return false, false
	}
	// Non-blocking, the pidfd is watched by the runtime's poller.
	if err := unix.SetNonblock(dup, true); err != nil {
		unix.Close(dup)
		return false, false
	}
	f := os.NewFile(uintptr(dup), "pidfd")
	defer f.Close()
	rc, err := f.SyscallConn()
	if err != nil {
		return false, false
	}
	release := p.release
	if !stopOnRelease {
		release = nil
	}
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		select {
		case <-release:
			_ = f.SetReadDeadline(time.Now())
		case <-stop:
		}
	}()
	waited := false
	err = rc.Read(func(uintptr) bool {
		done := waited
		waited = true
		return done
	})
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return false, true
	}
	if err != nil {
		return false, false
	}
	return true, true
}

// pollProc polls /proc until the process is gone; false after Release.
func (p *Process) pollProc() bool {
	for {
		if !processLive(p.pid) {
			return true
		}
		select {
		case <-p.release:
			return false
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// reap collects the exit status if the process happens to be our child
// (after a restart under a subreaper); otherwise it is not ours to wait for.
func (p *Process) reap() {
	var ws unix.WaitStatus
	_, _ = unix.Wait4(p.pid, &ws, unix.WNOHANG, nil)
}

// Stopped says which step of Terminate ended the process.
type Stopped int

// Terminate outcomes.
const (
	AlreadyExited Stopped = iota
	ByVMMShutdown
	BySIGTERM
	BySIGKILL
)

func (s Stopped) String() string {
	return [...]string{"already exited", "vmm.shutdown", "SIGTERM", "SIGKILL"}[s]
}

// Terminate stops the VM and its VMM: vm.shutdown, vmm.shutdown, SIGTERM,
// SIGKILL, waiting grace after each of the last three. It returns which step
// ended the process. It refuses to signal a process whose command line no
// longer matches (ErrNotOurs).
func (p *Process) Terminate(ctx context.Context, grace time.Duration) (Stopped, error) {
	if grace <= 0 {
		grace = 5 * time.Second
	}
	if !p.Alive() {
		p.cleanup()
		return AlreadyExited, nil
	}
	callTimeout := min(grace, 2*time.Second)
	c := ch.New(p.SocketPath(), ch.WithTimeouts(ch.Timeouts{Call: callTimeout}))
	// last is the step that was under way when the process is found gone.
	last := ByVMMShutdown
	err := c.Shutdown(ctx)
	if !ch.IsVMMGone(err) && !errors.Is(err, ch.ErrTimeout) {
		// vm.shutdown without a running VM is a 500; either way ask the VMM
		// to exit. A VMM that answers, or drops the connection as it exits,
		// gets the grace period; one that does not answer at all is hung.
		err := c.ShutdownVMM(ctx)
		if err == nil || errors.Is(err, ch.ErrConnectionLost) {
			if p.waitExit(ctx, grace) {
				p.cleanup()
				return ByVMMShutdown, nil
			}
		}
	}
	for _, step := range []struct {
		sig  unix.Signal
		stop Stopped
	}{{unix.SIGTERM, BySIGTERM}, {unix.SIGKILL, BySIGKILL}} {
		if !p.Alive() {
			p.cleanup()
			return last, nil
		}
		if err := checkOurs(p.pid, p.cfg.Binary, p.SocketPath()); err != nil {
			if !p.Alive() || errors.Is(err, ErrNoProcess) {
				p.cleanup()
				return last, nil
			}
			return 0, err
		}
		if err := p.signal(step.sig); err != nil && !errors.Is(err, unix.ESRCH) {
			return 0, fmt.Errorf("vmm: %s pid %d: %w", step.sig, p.pid, err)
		}
		last = step.stop
		if step.sig == unix.SIGKILL {
			p.cfg.Log.Warn().Int("pid", p.pid).Str("run_dir", p.cfg.RunDir).Msg("VMM ignored vmm.shutdown and SIGTERM; killed")
		}
		if p.waitExit(ctx, grace) {
			p.cleanup()
			return step.stop, nil
		}
	}
	return 0, fmt.Errorf("vmm: pid %d survived SIGKILL for %s", p.pid, grace)
}

func (p *Process) waitExit(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-p.exited:
		return true
	case <-t.C:
	case <-ctx.Done():
	}
	return !p.Alive()
}

// signal sends sig through the pidfd when there is one, so it cannot reach
// a process that reused the pid.
func (p *Process) signal(sig unix.Signal) error {
	if !p.Alive() {
		return unix.ESRCH // its pid may belong to someone else by now
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.pidfd >= 0 {
		return unix.PidfdSendSignal(p.pidfd, sig, nil, 0)
	}
	return unix.Kill(p.pid, sig)
}

// cleanup removes what the exited VMM leaves in its run dir and its scope.
func (p *Process) cleanup() {
	if pid, err := readPid(p.cfg.RunDir); err == nil && pid == p.pid {
		_ = os.Remove(filepath.Join(p.cfg.RunDir, PidFile))
	}
	_ = os.Remove(p.SocketPath())
	_ = os.Remove(p.SocketPath() + ".lock")
	if p.scope != "" {
		removeScope(p.scope)
	}
	p.Release()
}

// readPid reads the run dir's pid file.
func readPid(runDir string) (int, error) {
	data, err := os.ReadFile(filepath.Join(runDir, PidFile))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return 0, fmt.Errorf("%w: no %s in %s", ErrNoProcess, PidFile, runDir)
		}
		return 0, fmt.Errorf("vmm: %w", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil || pid <= 0 {
		return 0, fmt.Errorf("vmm: %s holds %q, not a pid", PidFile, bytes.TrimSpace(data))
	}
	return pid, nil
}

// writePid records pid in the run dir. No fsync: the file only matters while
// the host stays up (a host crash takes every VMM with it), and a rename
// makes it appear whole to a reader.
func writePid(runDir string, pid int) error {
	tmp := filepath.Join(runDir, PidFile+".tmp")
	if err := os.WriteFile(tmp, []byte(strconv.Itoa(pid)+"\n"), 0o600); err != nil {
		return fmt.Errorf("vmm: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(runDir, PidFile)); err != nil {
		return fmt.Errorf("vmm: %w", err)
	}
	return nil
}

// matchCmdline reports whether pid runs binary with --api-socket naming sock.
// An error means the process does not exist (or is a zombie).
func matchCmdline(pid int, binary, sock string) (bool, error) {
	if !processLive(pid) {
		return false, fmt.Errorf("pid %d is not running", pid)
	}
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return false, err
	}
	got, ok := APISocket(data, binary)
	return ok && got == filepath.Clean(sock), nil
}

// APISocket returns the --api-socket path of a VMM command line (NUL
// separated, as in /proc/<pid>/cmdline) whose executable is binary (the same
// path or the same base name). Both "--api-socket path=<p>" and a bare
// absolute path are understood. The start-up reconcile uses it to find VMMs
// of its run dirs that no pid file records.
func APISocket(cmdline []byte, binary string) (string, bool) {
	args := strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")
	if len(args) == 0 || args[0] == "" {
		return "", false
	}
	if args[0] != binary && filepath.Base(args[0]) != filepath.Base(binary) {
		return "", false
	}
	for i := 1; i < len(args); i++ {
		var v string
		switch {
		case args[i] == "--api-socket" && i+1 < len(args):
			v = args[i+1]
		case strings.HasPrefix(args[i], "--api-socket="):
			v = strings.TrimPrefix(args[i], "--api-socket=")
		default:
			continue
		}
		for _, kv := range strings.Split(v, ",") {
			if k, val, ok := strings.Cut(kv, "="); ok && k == "path" {
				return filepath.Clean(val), true
			} else if !ok && filepath.IsAbs(kv) {
				return filepath.Clean(kv), true
			}
		}
	}
	return "", false
}

// processLive reports whether pid exists and is not a zombie.
func processLive(pid int) bool { return ProcessLive("/proc", pid) }

// ProcessLive reports whether pid exists and is not a zombie, reading
// procRoot (normally /proc; tests pass a fake tree).
func ProcessLive(procRoot string, pid int) bool {
	data, err := os.ReadFile(filepath.Join(procRoot, strconv.Itoa(pid), "stat"))
	if err != nil {
		return false
	}
	// The state follows the parenthesised command name, which may contain
	// spaces and parentheses itself.
	i := bytes.LastIndexByte(data, ')')
	if i < 0 || i+2 >= len(data) {
		return false
	}
	st := data[i+2]
	return st != 'Z' && st != 'X'
}

func logTail(path string, from int64) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	size, _ := f.Seek(0, io.SeekEnd)
	from = max(from, size-4096)
	buf := make([]byte, size-from)
	n, _ := f.ReadAt(buf, from)
	return string(buf[:n])
}
