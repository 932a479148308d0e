package qemu

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestCmdline(t *testing.T) {
	m := Meta{Machine: "pc", Accel: AccelTCG, MemoryMiB: 256, CPUs: 2, Kernel: "/k", Initrd: "/i", Append: "sbx.x=1"}
	run := "/r/vm,1"
	tests := []struct {
		name     string
		m        Meta
		incoming bool
		want     []string // consecutive pairs that must appear
		absent   []string
	}{
		{"cold boot", m, false, []string{
			"-machine", "pc,accel=tcg,memory-backend=mem",
			"-m", "256M",
			"-smp", "2",
			"-object", "memory-backend-file,id=mem,size=256M,mem-path=/r/vm,,1/ram,share=on",
			"-append", DefaultAppend + " sbx.x=1",
			"-chardev", "socket,id=qmp,path=/r/vm,,1/qmp.sock,server=on,wait=off",
			"-chardev", "socket,id=agent,path=/r/vm,,1/agent.sock,server=on,wait=off",
		}, []string{"-incoming", "-S", "-cpu", "-drive"}},
		{"restore", m, true, []string{"-S", "-incoming", "-incoming", "defer"}, []string{"-cpu"}},
		{"kvm with disk", func() Meta { k := m; k.Accel, k.Disk = AccelKVM, true; return k }(), false, []string{
			"-machine", "pc,accel=kvm,memory-backend=mem",
			"-cpu", "host",
			"-drive", "file=/r/vm,,1/disk.qcow2,format=qcow2,if=none,id=disk0",
			"-device", "virtio-blk-pci,drive=disk0",
		}, []string{"-incoming"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			args := cmdline(run, tc.m, tc.incoming)
			for i := 0; i < len(tc.want); i += 2 {
				found := false
				for j := 0; j+1 < len(args); j++ {
					if args[j] == tc.want[i] && args[j+1] == tc.want[i+1] {
						found = true
					}
				}
				if !found {
					t.Errorf("args lack %q %q: %q", tc.want[i], tc.want[i+1], args)
				}
			}
			for _, a := range tc.absent {
				if slices.Contains(args, a) {
					t.Errorf("args contain %q: %q", a, args)
				}
			}
		})
	}
}

func TestSpecValidation(t *testing.T) {
	dir := t.TempDir()
	k := filepath.Join(dir, "vmlinuz")
	if err := os.WriteFile(k, []byte("k"), 0o600); err != nil {
		t.Fatal(err)
	}
	good := Spec{RunDir: filepath.Join(dir, "run"), StoreDir: filepath.Join(dir, "store"), MemoryMiB: 256, Kernel: k, Initrd: k}
	tests := []struct {
		name   string
		mutate func(*Spec)
		want   string
	}{
		{"good", func(*Spec) {}, ""},
		{"relative run dir", func(s *Spec) { s.RunDir = "run" }, "run dir"},
		{"no store", func(s *Spec) { s.StoreDir = "" }, "store dir"},
		{"socket too long", func(s *Spec) { s.RunDir = "/" + strings.Repeat("x", 100) }, "socket path"},
		{"tiny memory", func(s *Spec) { s.MemoryMiB = 1 }, "memory"},
		{"negative cpus", func(s *Spec) { s.CPUs = -1 }, "CPUs"},
		{"no kernel", func(s *Spec) { s.Kernel = "" }, "no kernel"},
		{"missing initrd", func(s *Spec) { s.Initrd = filepath.Join(dir, "absent") }, "initrd"},
		{"disk is a dir", func(s *Spec) { s.Disk = dir }, "disk"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := good
			tc.mutate(&s)
			err := s.validateBoot()
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if !errors.Is(err, ErrInvalidSpec) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want ErrInvalidSpec mentioning %q", err, tc.want)
			}
		})
	}
	for _, name := range []string{"", ".", "..", "a/b", ".sbx-tmp-x", "nul\x00"} {
		if err := validateName(name); !errors.Is(err, ErrInvalidSpec) {
			t.Errorf("validateName(%q) = %v", name, err)
		}
	}
	if err := validateName("hib-1"); err != nil {
		t.Error(err)
	}
}

func TestRecipesRejectBadInputWithoutSideEffects(t *testing.T) {
	q, err := NewRecipes(RecipesConfig{Accel: AccelTCG})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	spec := Spec{RunDir: filepath.Join(dir, "run"), StoreDir: filepath.Join(dir, "store")}
	ctx := context.Background()
	if _, err := q.Boot(ctx, spec); !errors.Is(err, ErrInvalidSpec) {
		t.Errorf("Boot without kernel = %v", err)
	}
	if _, err := q.Golden(ctx, spec, "a/b"); !errors.Is(err, ErrInvalidSpec) {
		t.Errorf("Golden with bad name = %v", err)
	}
	if _, err := q.Wake(ctx, spec, "missing"); !errors.Is(err, ErrNoSnapshot) {
		t.Errorf("Wake of missing snapshot = %v", err)
	}
	if _, err := q.Clone(ctx, spec, "missing"); !errors.Is(err, ErrNoSnapshot) {
		t.Errorf("Clone of missing golden = %v", err)
	}
	if _, err := q.Hibernate(ctx, spec, "h"); !errors.Is(err, ErrNotRunning) {
		t.Errorf("Hibernate of no VM = %v", err)
	}
	if _, err := q.Status(ctx, spec); !errors.Is(err, ErrNotRunning) {
		t.Errorf("Status of no VM = %v", err)
	}
	if _, err := NewRecipes(RecipesConfig{Accel: "hvf"}); !errors.Is(err, ErrInvalidSpec) {
		t.Errorf("NewRecipes with accel hvf = %v", err)
	}
	if _, err := os.Stat(spec.RunDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a rejected recipe created the run dir: %v", err)
	}
}

func TestReadMeta(t *testing.T) {
	good := Meta{Format: MetaFormat, Machine: "pc", Accel: AccelTCG, MemoryMiB: 256, Kernel: "/k", Initrd: "/i"}
	tests := []struct {
		name string
		body func() []byte
		want error // nil: must succeed; errAny: must fail somehow; else the errors.Is target
	}{
		{"good", func() []byte { b, _ := json.Marshal(good); return b }, nil},
		{"missing", nil, ErrNoSnapshot},
		{"garbage", func() []byte { return []byte("{") }, errAny},
		{"future format", func() []byte { m := good; m.Format = 2; b, _ := json.Marshal(m); return b }, errAny},
		{"no kernel", func() []byte { m := good; m.Kernel = ""; b, _ := json.Marshal(m); return b }, errAny},
		{"auto accel", func() []byte { m := good; m.Accel = AccelAuto; b, _ := json.Marshal(m); return b }, errAny},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if tc.body != nil {
				if err := os.WriteFile(filepath.Join(dir, FileMeta), tc.body(), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			m, err := ReadMeta(dir)
			switch {
			case tc.want == nil && (err != nil || !reflect.DeepEqual(m, good)):
				t.Fatalf("ReadMeta = %+v, %v", m, err)
			case tc.want == errAny && err == nil:
				t.Fatalf("ReadMeta accepted %s", tc.name)
			case tc.want != nil && tc.want != errAny && !errors.Is(err, tc.want):
				t.Fatalf("ReadMeta = %v, want %v", err, tc.want)
			}
		})
	}
}

var errAny = errors.New("any error")

func TestAccelAuto(t *testing.T) {
	dir := t.TempDir()
	dev := filepath.Join(dir, "kvm")
	if err := os.WriteFile(dev, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	hang := func(ctx context.Context, _ Spec) error { <-ctx.Done(); return ctx.Err() }
	tests := []struct {
		name   string
		cfg    RecipesConfig
		want   Accel
		probed bool
	}{
		{"configured tcg never probes", RecipesConfig{Accel: AccelTCG}, AccelTCG, false},
		{"configured kvm never probes", RecipesConfig{Accel: AccelKVM}, AccelKVM, false},
		{"no kvm device", RecipesConfig{Accel: AccelAuto, KVMDevice: filepath.Join(dir, "absent")}, AccelTCG, false},
		{"probe answers", RecipesConfig{KVMDevice: dev, Probe: func(context.Context, Spec) error { return nil }}, AccelKVM, true},
		{"probe fails", RecipesConfig{KVMDevice: dev, Probe: func(context.Context, Spec) error { return errors.New("no") }}, AccelTCG, true},
		// Nested KVM hangs; the probe must be cut off after ProbeTimeout.
		{"probe hangs", RecipesConfig{KVMDevice: dev, ProbeTimeout: 50 * time.Millisecond, Probe: hang}, AccelTCG, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			probes := 0
			if p := tc.cfg.Probe; p != nil {
				tc.cfg.Probe = func(ctx context.Context, s Spec) error { probes++; return p(ctx, s) }
			} else {
				tc.cfg.Probe = func(context.Context, Spec) error { probes++; return nil }
			}
			q, err := NewRecipes(tc.cfg)
			if err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			got, why := q.Accel(context.Background(), Spec{})
			if got != tc.want || why == "" {
				t.Fatalf("Accel = %s (%s), want %s", got, why, tc.want)
			}
			if time.Since(start) > 5*time.Second {
				t.Fatalf("resolving took %v", time.Since(start))
			}
			// The decision is remembered: no second probe.
			if again, _ := q.Accel(context.Background(), Spec{}); again != got {
				t.Fatalf("second Accel = %s, first %s", again, got)
			}
			if (probes > 0) != tc.probed || probes > 1 {
				t.Fatalf("probed %d times, want probed=%v once", probes, tc.probed)
			}
		})
	}
}

// A pid file naming a process that is not this VM's QEMU (a recycled pid) must
// neither be adopted nor signalled.
func TestAdoptChecksCmdline(t *testing.T) {
	q, err := NewRecipes(RecipesConfig{Accel: AccelTCG, StopGrace: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	spec := Spec{RunDir: filepath.Join(dir, "run"), StoreDir: filepath.Join(dir, "store")}
	if err := os.MkdirAll(spec.RunDir, 0o700); err != nil {
		t.Fatal(err)
	}
	sleeper := exec.Command("sleep", "60")
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sleeper.Process.Kill(); _ = sleeper.Wait() })
	pidFile := filepath.Join(spec.RunDir, FilePID)
	for _, content := range []string{strconv.Itoa(sleeper.Process.Pid), "garbage", "-5"} {
		if err := os.WriteFile(pidFile, []byte(content+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := q.Adopt(spec); !errors.Is(err, ErrNotRunning) {
			t.Fatalf("Adopt with pid file %q = %v", content, err)
		}
	}
	if err := os.WriteFile(pidFile, []byte(strconv.Itoa(sleeper.Process.Pid)), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := q.Destroy(context.Background(), spec); err != nil {
		t.Fatal(err)
	}
	if err := sleeper.Process.Signal(syscall.Signal(0)); err != nil {
		t.Fatalf("Destroy signalled a process that is not its QEMU: %v", err)
	}
	if _, err := os.Stat(spec.RunDir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("run dir not removed: %v", err)
	}
}

func TestResultDurations(t *testing.T) {
	r := RecipeResult{Steps: []Step{{StepClone, 2 * time.Millisecond}, {StepSync, 3 * time.Millisecond}, {StepClone, time.Millisecond}}}
	if r.Dur(StepClone) != 3*time.Millisecond || r.Dur(StepQuit) != 0 || r.Total() != 6*time.Millisecond {
		t.Fatalf("Dur/Total wrong: %v %v %v", r.Dur(StepClone), r.Dur(StepQuit), r.Total())
	}
	// Steps are timed by the injected clock.
	now := time.Unix(100, 0)
	q, err := NewRecipes(RecipesConfig{Accel: AccelTCG, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	var res RecipeResult
	tm := q.timer(&res)
	now = now.Add(7 * time.Millisecond)
	tm.mark(StepStop)
	now = now.Add(time.Second)
	tm.skip()
	now = now.Add(2 * time.Millisecond)
	tm.mark(StepMigrate)
	if res.Dur(StepStop) != 7*time.Millisecond || res.Dur(StepMigrate) != 2*time.Millisecond {
		t.Fatalf("timer steps %v", res.Steps)
	}
}

// A QEMU that answers neither quit nor SIGTERM is killed with SIGKILL; the
// pid is checked against the cmdline before each signal.
func TestDestroyEscalatesToSIGKILL(t *testing.T) {
	q, err := NewRecipes(RecipesConfig{Accel: AccelTCG, StopGrace: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	spec := Spec{RunDir: filepath.Join(dir, "run"), StoreDir: filepath.Join(dir, "store")}
	if err := os.MkdirAll(spec.RunDir, 0o700); err != nil {
		t.Fatal(err)
	}
	fake, waited := startFakeQEMU(t, spec.RunDir)
	if err := os.WriteFile(filepath.Join(spec.RunDir, FilePID), []byte(strconv.Itoa(fake.Process.Pid)), 0o600); err != nil {
		t.Fatal(err)
	}
	// The fake must have ignored SIGTERM before Destroy sends it.
	deadline := time.Now().Add(5 * time.Second)
	for {
		b, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(fake.Process.Pid), "status"))
		if i := strings.Index(string(b), "SigIgn:"); i >= 0 {
			var mask uint64
			if _, err := fmt.Sscanf(string(b[i+len("SigIgn:"):]), "%x", &mask); err == nil && mask&(1<<(uint(syscall.SIGTERM)-1)) != 0 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("fake QEMU never ignored SIGTERM")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if pid, err := q.Adopt(spec); err != nil || pid != fake.Process.Pid {
		t.Fatalf("Adopt(fake) = %d, %v", pid, err)
	}
	start := time.Now()
	if _, err := q.Destroy(context.Background(), spec); err != nil {
		t.Fatal(err)
	}
	// quit (no QMP: fails at once) and SIGTERM (ignored) each get the grace.
	if el := time.Since(start); el < 200*time.Millisecond {
		t.Fatalf("Destroy took %v: it cannot have waited out SIGTERM", el)
	}
	select {
	case err := <-waited:
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
			t.Fatalf("fake QEMU ended with %v, want SIGKILL", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("fake QEMU still running after Destroy")
	}
	if _, err := os.Stat(spec.RunDir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("run dir left: %v", err)
	}
}

// A daemon killed between starting QEMU and writing its pid file leaves a QEMU
// only its cmdline names. With vm.json in the run dir (a launch began) Adopt
// finds it over /proc and writes the pid file, so Destroy stops it; without
// vm.json nothing is scanned for.
func TestAdoptWithoutPidFile(t *testing.T) {
	q, err := NewRecipes(RecipesConfig{Accel: AccelTCG, StopGrace: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	spec := Spec{RunDir: filepath.Join(dir, "run"), StoreDir: filepath.Join(dir, "store")}
	if err := os.MkdirAll(spec.RunDir, 0o700); err != nil {
		t.Fatal(err)
	}
	fake, waited := startFakeQEMU(t, spec.RunDir)
	// The exec must have happened before /proc shows the fake's cmdline.
	deadline := time.Now().Add(5 * time.Second)
	for !q.isOurs(fake.Process.Pid, spec.RunDir) {
		if time.Now().After(deadline) {
			t.Fatal("fake QEMU's cmdline never appeared")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if _, err := q.Adopt(spec); !errors.Is(err, ErrNotRunning) {
		t.Fatalf("Adopt without vm.json = %v, want ErrNotRunning", err)
	}
	if err := os.WriteFile(filepath.Join(spec.RunDir, FileVM), []byte("{}"), 0o600); err != nil {
		t.Fatal(err)
	}
	pid, err := q.Adopt(spec)
	if err != nil || pid != fake.Process.Pid {
		t.Fatalf("Adopt = %d, %v; want %d", pid, err, fake.Process.Pid)
	}
	if b, err := os.ReadFile(filepath.Join(spec.RunDir, FilePID)); err != nil || strings.TrimSpace(string(b)) != strconv.Itoa(pid) {
		t.Fatalf("pid file after Adopt: %q, %v", b, err)
	}
	if _, err := q.Destroy(context.Background(), spec); err != nil {
		t.Fatal(err)
	}
	select {
	case <-waited:
	case <-time.After(5 * time.Second):
		t.Fatal("fake QEMU still running after Destroy")
	}
}

// startFakeQEMU starts the test binary as a QEMU of runDir (argv[0]
// qemu-system-x86_64 and runDir's QMP socket in its cmdline, so the driver's
// cmdline check accepts it) that ignores quit and SIGTERM. The channel yields
// its Wait error; t.Cleanup kills it.
func startFakeQEMU(t *testing.T, runDir string) (*exec.Cmd, <-chan error) {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	fake := &exec.Cmd{
		Path: self,
		Args: []string{"qemu-system-x86_64", "-chardev", "socket,id=qmp,path=" + QMPSocket(runDir) + ",server=on,wait=off"},
		Env:  append(os.Environ(), fakeQEMUEnv+"=stubborn"),
	}
	if err := fake.Start(); err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() { waited <- fake.Wait() }()
	t.Cleanup(func() { _ = fake.Process.Kill() })
	return fake, waited
}
