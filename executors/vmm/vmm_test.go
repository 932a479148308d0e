package vmm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"

	"github.com/sbxlog/sbxlog/executors/ch"
	"github.com/sbxlog/sbxlog/executors/ch/chsim"
	"github.com/sbxlog/sbxlog/executors/ch/chsimbin"
)

func guestConfig(t *testing.T, dir string) *ch.VmConfig {
	t.Helper()
	kernel := filepath.Join(dir, "vmlinux")
	if err := os.WriteFile(kernel, []byte("kernel"), 0o644); err != nil {
		t.Fatal(err)
	}
	return ch.NewConfig(ch.Payload{Kernel: kernel}, 1, 32<<20)
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

// TestAdoptAfterLauncherDies launches a VMM from a process that then exits
// (the daemon crashing), adopts the VMM by pid file and cmdline, refuses pids
// that are not this VM's VMM, and terminates the adopted one.
func TestAdoptAfterLauncherDies(t *testing.T) {
	ctx := context.Background()
	dir := shortDir(t)
	slice := testSlice(t)
	spec := launchSpec{Binary: chsimBin, RunDir: filepath.Join(dir, "run"), ID: "adopt1", CgroupSlice: slice}
	pid := launchInHelper(t, spec)

	// The VMM outlived its launcher, in its own process group.
	if !processLive(pid) {
		t.Fatalf("VMM %d died with its launcher", pid)
	}
	if pgid, err := unix.Getpgid(pid); err != nil || pgid != pid {
		t.Errorf("VMM pgid = %d, %v; want its own group %d", pgid, err, pid)
	}
	if slice != "" {
		cg, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
		if !strings.Contains(string(cg), "/vm-adopt1.scope") {
			t.Errorf("VMM cgroup = %q, want its scope", cg)
		}
	}

	cfg := Config{Binary: spec.Binary, RunDir: spec.RunDir, ID: spec.ID, CgroupSlice: slice}
	p, err := Adopt(ctx, cfg)
	if err != nil {
		t.Fatalf("Adopt: %v", err)
	}
	if p.Pid() != pid || !p.Alive() {
		t.Fatalf("adopted pid %d (alive %v), want %d", p.Pid(), p.Alive(), pid)
	}
	if got, err := Pid(cfg); err != nil || got != pid {
		t.Fatalf("Pid = %d, %v; want %d", got, err, pid)
	}
	if slice != "" && p.Scope() != filepath.Join(slice, "vm-adopt1.scope") {
		t.Errorf("adopted scope = %q", p.Scope())
	}
	c := p.Client()
	if err := c.Create(ctx, guestConfig(t, dir)); err != nil {
		t.Fatal(err)
	}
	if err := c.Boot(ctx); err != nil {
		t.Fatal(err)
	}

	// Refusals. Another VM's run dir whose pid file names this VMM: the
	// socket in the cmdline is not that VM's.
	other := filepath.Join(dir, "other")
	if err := os.MkdirAll(other, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := writePid(other, pid); err != nil {
		t.Fatal(err)
	}
	if _, err := Adopt(ctx, Config{Binary: chsimBin, RunDir: other}); !errors.Is(err, ErrNotOurs) {
		t.Errorf("adopt with another VM's socket = %v, want ErrNotOurs", err)
	}
	if _, err := Pid(Config{Binary: chsimBin, RunDir: other}); !errors.Is(err, ErrNotOurs) {
		t.Errorf("Pid with another VM's socket = %v, want ErrNotOurs", err)
	}
	// A reused pid: the pid file names a live process running something else.
	sleeper := exec.Command("sleep", "60")
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sleeper.Process.Kill(); _ = sleeper.Wait() })
	if err := writePid(other, sleeper.Process.Pid); err != nil {
		t.Fatal(err)
	}
	if _, err := Adopt(ctx, Config{Binary: chsimBin, RunDir: other}); !errors.Is(err, ErrNotOurs) {
		t.Errorf("adopt of a reused pid = %v, want ErrNotOurs", err)
	}
	// A pid that no longer exists, and no pid file at all.
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	if err := writePid(other, dead.Process.Pid); err != nil {
		t.Fatal(err)
	}
	if _, err := Adopt(ctx, Config{Binary: chsimBin, RunDir: other}); !errors.Is(err, ErrNoProcess) {
		t.Errorf("adopt of an exited pid = %v, want ErrNoProcess", err)
	}
	if _, err := Pid(Config{Binary: chsimBin, RunDir: other}); !errors.Is(err, ErrNoProcess) {
		t.Errorf("Pid of an exited pid = %v, want ErrNoProcess", err)
	}
	if _, err := Adopt(ctx, Config{Binary: chsimBin, RunDir: filepath.Join(dir, "none")}); !errors.Is(err, ErrNoProcess) {
		t.Errorf("adopt without pid file = %v, want ErrNoProcess", err)
	}
	if _, err := Pid(Config{Binary: chsimBin, RunDir: filepath.Join(dir, "none")}); !errors.Is(err, ErrNoProcess) {
		t.Errorf("Pid without pid file = %v, want ErrNoProcess", err)
	}

	// Terminate the adopted VMM: it stops on request, and its traces go.
	stopped, err := p.Terminate(ctx, 2*time.Second)
	if err != nil || stopped != ByVMMShutdown {
		t.Fatalf("Terminate = %v, %v; want by vmm.shutdown", stopped, err)
	}
	select {
	case <-p.Exited():
	case <-time.After(5 * time.Second):
		t.Fatal("Exited not closed after Terminate")
	}
	if processLive(pid) {
		t.Error("VMM still running")
	}
	for _, f := range []string{PidFile, SocketFile} {
		if fileExists(filepath.Join(spec.RunDir, f)) {
			t.Errorf("%s left in the run dir", f)
		}
	}
	if slice != "" && fileExists(filepath.Join(slice, "vm-adopt1.scope")) {
		t.Error("cgroup scope left behind")
	}
}

func TestTerminateEscalates(t *testing.T) {
	ctx := context.Background()
	cases := []struct {
		name  string
		env   []string
		grace time.Duration
		want  Stopped
	}{
		{"polite", nil, time.Second, ByVMMShutdown},
		{"vmm.shutdown hangs", []string{chsim.EnvFail + "=vmm.shutdown:1:hang"}, 500 * time.Millisecond, BySIGTERM},
		{"wedged", []string{chsim.EnvFail + "=vmm.shutdown:1:hang", chsim.EnvIgnoreSIGTERM + "=1"}, 200 * time.Millisecond, BySIGKILL},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := shortDir(t)
			cfg := Config{Binary: chsimBin, RunDir: filepath.Join(dir, "run"), Env: tc.env}
			p, err := Launch(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			if pid, err := readPid(cfg.RunDir); err != nil || pid != p.Pid() {
				t.Fatalf("pid file = %d, %v; want %d", pid, err, p.Pid())
			}
			if err := p.Client().Create(ctx, guestConfig(t, dir)); err != nil {
				t.Fatal(err)
			}
			if err := p.Client().Boot(ctx); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			stopped, err := p.Terminate(ctx, tc.grace)
			if err != nil || stopped != tc.want {
				t.Fatalf("Terminate = %v, %v; want %v", stopped, err, tc.want)
			}
			if p.Alive() {
				t.Fatal("process alive after Terminate")
			}
			t.Logf("stopped by %v in %s", stopped, time.Since(start).Round(time.Millisecond))
			if fileExists(filepath.Join(cfg.RunDir, PidFile)) {
				t.Error("pid file left behind")
			}
			// Terminating again is a no-op.
			if s, err := p.Terminate(ctx, time.Second); err != nil || s != AlreadyExited {
				t.Errorf("second Terminate = %v, %v", s, err)
			}
		})
	}
}

// TestTerminateRechecksCmdline: before each signal the cmdline is read
// again; a process that no longer matches is not signalled.
func TestTerminateRechecksCmdline(t *testing.T) {
	ctx := context.Background()
	dir := shortDir(t)
	cfg := Config{Binary: chsimBin, RunDir: filepath.Join(dir, "run"), Env: []string{chsim.EnvFail + "=vmm.shutdown:1+:hang"}}
	p, err := Launch(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	// As if the pid now named another program.
	p.cfg.Binary = "/usr/libexec/not-a-vmm"
	if _, err := p.Terminate(ctx, 100*time.Millisecond); !errors.Is(err, ErrNotOurs) {
		log, _ := os.ReadFile(filepath.Join(cfg.RunDir, LogFile))
		t.Fatalf("Terminate of a mismatched process = %v, want ErrNotOurs\n%s", err, log)
	}
	if !p.Alive() {
		t.Fatal("a process that did not match was signalled")
	}
	p.cfg.Binary = chsimBin
	if s, err := p.Terminate(ctx, 500*time.Millisecond); err != nil || s != BySIGTERM {
		t.Fatalf("Terminate = %v, %v", s, err)
	}
}

func TestLaunchFailures(t *testing.T) {
	ctx := context.Background()
	t.Run("exits at once", func(t *testing.T) {
		dir := shortDir(t)
		cfg := Config{Binary: chsimBin, RunDir: filepath.Join(dir, "run"), Env: []string{chsim.EnvFail + "=nonsense"}}
		_, err := Launch(ctx, cfg)
		if !errors.Is(err, ErrExited) || !strings.Contains(err.Error(), chsim.EnvFail) {
			t.Fatalf("Launch = %v, want ErrExited with the VMM's complaint", err)
		}
		if fileExists(filepath.Join(cfg.RunDir, PidFile)) {
			t.Error("pid file of a failed launch left behind")
		}
	})
	t.Run("never answers", func(t *testing.T) {
		dir := shortDir(t)
		cfg := Config{Binary: chsimBin, RunDir: filepath.Join(dir, "run"), ReadyTimeout: 300 * time.Millisecond,
			Env: []string{chsim.EnvFail + "=vmm.ping:1+:hang"}}
		_, err := Launch(ctx, cfg)
		if !errors.Is(err, ErrUnresponsive) {
			t.Fatalf("Launch = %v, want ErrUnresponsive", err)
		}
		// The silent VMM was killed, not left running.
		if _, err := Adopt(ctx, cfg); !errors.Is(err, ErrNoProcess) {
			t.Errorf("after failed launch, Adopt = %v", err)
		}
	})
	t.Run("already running", func(t *testing.T) {
		dir := shortDir(t)
		cfg := Config{Binary: chsimBin, RunDir: filepath.Join(dir, "run")}
		p, err := Launch(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _, _ = p.Terminate(ctx, time.Second) })
		if _, err := Launch(ctx, cfg); !errors.Is(err, ErrAlreadyRunning) {
			t.Fatalf("second Launch = %v, want ErrAlreadyRunning", err)
		}
		// Without the pid file the live socket still protects it.
		if err := os.Remove(filepath.Join(cfg.RunDir, PidFile)); err != nil {
			t.Fatal(err)
		}
		if _, err := Launch(ctx, cfg); !errors.Is(err, ErrAlreadyRunning) {
			t.Fatalf("Launch over a live socket = %v, want ErrAlreadyRunning", err)
		}
		if _, err := p.Client().Ping(ctx); err != nil {
			t.Fatalf("the first VMM was disturbed: %v", err)
		}
	})
	t.Run("bad config", func(t *testing.T) {
		for _, cfg := range []Config{
			{Binary: "chsim", RunDir: "/tmp/x"},
			{Binary: chsimBin, RunDir: "run"},
			{Binary: chsimBin, RunDir: "/tmp/" + strings.Repeat("d", 120)},
			{Binary: chsimBin, RunDir: "/tmp/x", CgroupSlice: "/sys/fs/cgroup/s", ID: "../escape"},
		} {
			if _, err := Launch(ctx, cfg); err == nil {
				t.Errorf("Launch(%+v) accepted", cfg)
			}
		}
	})
	t.Run("relaunch after crash", func(t *testing.T) {
		dir := shortDir(t)
		cfg := Config{Binary: chsimBin, RunDir: filepath.Join(dir, "run")}
		p, err := Launch(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := p.signal(unix.SIGKILL); err != nil {
			t.Fatal(err)
		}
		<-p.Exited()
		// The stale socket and pid file stay; a new launch replaces them.
		p2, err := Launch(ctx, cfg)
		if err != nil {
			t.Fatalf("relaunch: %v", err)
		}
		if _, err := p2.Terminate(ctx, time.Second); err != nil {
			t.Fatal(err)
		}
	})
}

func TestCgroupFallbackLogsOnce(t *testing.T) {
	ctx := context.Background()
	dir := shortDir(t)
	notCgroup := filepath.Join(dir, "not-a-cgroup")
	var logs chsimbin.SyncBuffer
	for i := range 2 {
		cfg := Config{Binary: chsimBin, RunDir: filepath.Join(dir, fmt.Sprint("run", i)), ID: fmt.Sprint(i),
			CgroupSlice: notCgroup, Log: zerolog.New(&logs)}
		p, err := Launch(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		if p.Scope() != "" {
			t.Errorf("scope %q outside cgroupfs", p.Scope())
		}
		if _, err := p.Terminate(ctx, time.Second); err != nil {
			t.Fatal(err)
		}
	}
	if n := strings.Count(logs.String(), "\n"); n != 1 || !strings.Contains(logs.String(), "cgroup") {
		t.Errorf("fallback logged %d times, want once:\n%s", n, logs.String())
	}
}

func TestCgroupScope(t *testing.T) {
	slice := testSlice(t)
	if slice == "" {
		t.Skip("cgroup v2 tree not writable here")
	}
	ctx := context.Background()
	dir := shortDir(t)
	p, err := Launch(ctx, Config{Binary: chsimBin, RunDir: filepath.Join(dir, "run"), ID: "scoped", CgroupSlice: slice})
	if err != nil {
		t.Fatal(err)
	}
	scope := filepath.Join(slice, "vm-scoped.scope")
	if p.Scope() != scope {
		t.Fatalf("scope = %q, want %q", p.Scope(), scope)
	}
	procs, err := os.ReadFile(filepath.Join(scope, "cgroup.procs"))
	if err != nil || strings.TrimSpace(string(procs)) != fmt.Sprint(p.Pid()) {
		t.Fatalf("cgroup.procs = %q, %v; want the VMM alone", procs, err)
	}
	if _, err := p.Terminate(ctx, time.Second); err != nil {
		t.Fatal(err)
	}
	if fileExists(scope) {
		t.Error("scope not removed")
	}
	if DefaultCgroupSlice() == "" {
		t.Error("DefaultCgroupSlice empty on a host with cgroup v2")
	}
}

func TestMatchCmdline(t *testing.T) {
	// A shell that stays a shell, with the arguments a VMM would have.
	bin, err := exec.LookPath("sh")
	if err != nil {
		t.Fatal(err)
	}
	sleeper := exec.Command(bin, "-c", "sleep 30; :", "sh", "--api-socket", "path=/run/a/api.sock")
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sleeper.Process.Kill(); _ = sleeper.Wait() })
	pid := sleeper.Process.Pid
	for _, c := range []struct {
		bin, sock string
		want      bool
	}{
		{bin, "/run/a/api.sock", true},
		{"/opt/other/sh", "/run/a//api.sock", true}, // same base name, cleaned path
		{bin, "/run/b/api.sock", false},
		{"/usr/bin/cloud-hypervisor", "/run/a/api.sock", false},
	} {
		if got, err := matchCmdline(pid, c.bin, c.sock); err != nil || got != c.want {
			t.Errorf("matchCmdline(%s, %s) = %v, %v; want %v", c.bin, c.sock, got, err, c.want)
		}
	}
	if _, err := matchCmdline(1<<30, bin, "/x"); err == nil {
		t.Error("matchCmdline of a missing pid gave no error")
	}
}
