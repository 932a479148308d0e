package chdriver

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/sbxlog/sbxlog/eventlog/event"
	"github.com/sbxlog/sbxlog/executors"
	"github.com/sbxlog/sbxlog/executors/ch"
	"github.com/sbxlog/sbxlog/executors/ch/chsimbin"
	"github.com/sbxlog/sbxlog/executors/fsx"
	"github.com/sbxlog/sbxlog/executors/layout"
	"github.com/sbxlog/sbxlog/executors/templates"
	"github.com/sbxlog/sbxlog/executors/vmm"
	"github.com/sbxlog/sbxlog/fsm"
)

var chsimBin string

// TestMain builds chsim once. The crash scenarios spend most of their time
// waiting on VMM processes, not on the CPU, so unless -parallel was given
// they run 8 at a time instead of GOMAXPROCS.
func TestMain(m *testing.M) {
	flag.Parse()
	explicit := false
	flag.Visit(func(f *flag.Flag) { explicit = explicit || f.Name == "test.parallel" })
	if !explicit {
		_ = flag.Set("test.parallel", "8")
	}
	code := chsimbin.RunTests(m, &chsimBin)
	if shared.dir != "" {
		os.RemoveAll(shared.dir)
	}
	os.Exit(code)
}

const testInstance = "i1"

var (
	testKey    = fsm.PoolKey{Template: "default", Net: "none", Size: "small"}
	testSizes  = templates.Sizes{"small": {VCPUs: 1, MemoryBytes: 64 << 20}}
	testSynth  = templates.SynthOptions{DiskSize: 16 << 20, DataBytes: 512 << 10}
	opCounter  atomic.Uint64
	testVMMEnv = []string{"SBX_CHSIM_DIRTY_BYTES=256K"}
)

// trace is the merged, ordered record of a recipe's side effects: FS steps
// (from an fsx.Recorder), CH calls (from recAPI) and driver steps (from the
// step hook), as strings "fs <op> <paths>", "ch <endpoint>", "step <name>".
type trace struct {
	mu      sync.Mutex
	entries []string
}

func (tr *trace) add(s string) {
	tr.mu.Lock()
	tr.entries = append(tr.entries, s)
	tr.mu.Unlock()
}

func (tr *trace) reset() []string {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	out := tr.entries
	tr.entries = nil
	return out
}

func (tr *trace) snapshot() []string {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return append([]string(nil), tr.entries...)
}

// recAPI records every CH call after it returns, and can fail one before it
// is sent.
type recAPI struct {
	inner API
	h     *harness
}

var _ API = recAPI{}

func (a recAPI) call(name string, fn func() error) error {
	if f := a.h.chFail.Load(); f != nil {
		if err := (*f)(name); err != nil {
			a.h.tr.add("ch " + name + " (refused)")
			return err
		}
	}
	err := fn()
	a.h.tr.add("ch " + name)
	return err
}

func (a recAPI) Info(ctx context.Context) (i *ch.VmInfo, err error) {
	err = a.call(CallInfo, func() error { i, err = a.inner.Info(ctx); return err })
	return i, err
}
func (a recAPI) Create(ctx context.Context, c *ch.VmConfig) error {
	return a.call(CallCreate, func() error { return a.inner.Create(ctx, c) })
}
func (a recAPI) Boot(ctx context.Context) error {
	return a.call(CallBoot, func() error { return a.inner.Boot(ctx) })
}
func (a recAPI) Pause(ctx context.Context) error {
	return a.call(CallPause, func() error { return a.inner.Pause(ctx) })
}
func (a recAPI) Resume(ctx context.Context) error {
	return a.call(CallResume, func() error { return a.inner.Resume(ctx) })
}
func (a recAPI) Snapshot(ctx context.Context, u string) error {
	return a.call(CallSnapshot, func() error { return a.inner.Snapshot(ctx, u) })
}
func (a recAPI) Restore(ctx context.Context, rc ch.RestoreConfig) error {
	return a.call(CallRestore, func() error { return a.inner.Restore(ctx, rc) })
}
func (a recAPI) Shutdown(ctx context.Context) error {
	return a.call(CallShutdown, func() error { return a.inner.Shutdown(ctx) })
}
func (a recAPI) AddNet(ctx context.Context, nc ch.NetConfig) (p *ch.PciDeviceInfo, err error) {
	err = a.call(CallAddNet, func() error { p, err = a.inner.AddNet(ctx, nc); return err })
	return p, err
}
func (a recAPI) RemoveDevice(ctx context.Context, id string) error {
	return a.call(CallRemoveDevice, func() error { return a.inner.RemoveDevice(ctx, id) })
}

// syncBuf collects the driver's log lines.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// harness is one data dir with a driver on it, everything recorded.
type harness struct {
	t      *testing.T
	data   string
	cfg    Config
	d      *Driver
	rec    *fsx.Recorder
	tr     *trace
	logs   *syncBuf
	hook   atomic.Pointer[func(context.Context, StepCall) error]
	fsFail atomic.Pointer[func(fsx.Step) error]
	chFail atomic.Pointer[func(string) error]
}

// newHarness makes a driver on dataDir ("" for a short temp dir), with the
// test defaults, modified by opts.
func newHarness(t *testing.T, dataDir string, opts ...func(*Config)) *harness {
	t.Helper()
	if dataDir == "" {
		dataDir = chsimbin.ShortTempDir(t)
	}
	h := &harness{t: t, data: dataDir, tr: &trace{}, logs: &syncBuf{}}
	h.rec = fsx.NewRecorder(fsx.NewOS(zerolog.New(h.logs)))
	h.rec.Before = func(s fsx.Step) error {
		if f := h.fsFail.Load(); f != nil {
			return (*f)(s)
		}
		return nil
	}
	h.rec.Sink = func(s fsx.Step) {
		mark := ""
		if s.Err != nil {
			mark = " (failed)"
		}
		h.tr.add("fs " + s.String() + mark)
	}
	h.cfg = Config{
		Roots:        layout.RootsIn(dataDir),
		Instance:     testInstance,
		VMM:          chsimBin,
		Hypervisor:   CHSim,
		VMMEnv:       append([]string(nil), testVMMEnv...),
		Sizes:        testSizes,
		Synth:        testSynth,
		FS:           h.rec,
		NewAPI:       func(s string) API { return recAPI{inner: ch.New(s), h: h} },
		ReadyTimeout: 10 * time.Second,
		BootTimeout:  10 * time.Second,
		StopGrace:    2 * time.Second,
		Log:          zerolog.New(h.logs).Level(zerolog.DebugLevel),
		StepHook: func(ctx context.Context, s StepCall) error {
			if s.Undo {
				h.tr.add("undo " + s.Step)
			} else {
				h.tr.add("step " + s.Step)
			}
			if f := h.hook.Load(); f != nil {
				return (*f)(ctx, s)
			}
			return nil
		},
	}
	for _, o := range opts {
		o(&h.cfg)
	}
	h.start()
	t.Cleanup(func() {
		h.d.Close()
		killVMMs(t, h.cfg.Roots.Runs)
		if t.Failed() {
			t.Logf("driver log:\n%s", h.logs.String())
		}
	})
	return h
}

// start makes a fresh driver on the same data dir, as a restarted daemon
// does: nothing is remembered but what is on disk, and Prepare sweeps.
func (h *harness) start() {
	h.t.Helper()
	if h.d != nil {
		h.d.Close()
	}
	d, err := New(h.cfg)
	if err != nil {
		h.t.Fatal(err)
	}
	if _, err := d.Prepare(context.Background()); err != nil {
		h.t.Fatal(err)
	}
	h.d = d
}

func (h *harness) setHook(f func(context.Context, StepCall) error) {
	if f == nil {
		h.hook.Store(nil)
		return
	}
	h.hook.Store(&f)
}

// killVMMs SIGKILLs every chsim left under runs (a failed test's VMs).
func killVMMs(t *testing.T, runs string) {
	_ = filepath.WalkDir(runs, func(p string, de os.DirEntry, err error) error {
		if err != nil || de.Name() != vmm.PidFile {
			return nil
		}
		if pid, ok := vmmPid(filepath.Dir(p)); ok {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		return nil
	})
}

// vmmPid returns the live chsim pid recorded in runDir.
func vmmPid(runDir string) (int, bool) {
	data, err := os.ReadFile(filepath.Join(runDir, vmm.PidFile))
	if err != nil {
		return 0, false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil {
		return 0, false
	}
	cmd, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil || !strings.Contains(string(cmd), "chsim") {
		return 0, false
	}
	return pid, true
}

// killVMM SIGKILLs the VMM of runDir and waits until it is gone.
func killVMM(t *testing.T, runDir string) {
	t.Helper()
	pid, ok := vmmPid(runDir)
	if !ok {
		return
	}
	_ = syscall.Kill(pid, syscall.SIGKILL)
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil || strings.Contains(string(st), ") Z") {
			return
		}
		time.Sleep(2 * time.Millisecond)
	}
	t.Fatalf("VMM %d survived SIGKILL", pid)
}

func newOp() event.OpID {
	return event.OpIDFromUint(uint64(time.Now().UnixMilli()), opCounter.Add(1))
}

func (h *harness) runDir(vm string) string {
	return filepath.Join(h.cfg.Roots.Runs, testInstance, vm)
}

func (h *harness) store(rel string) string { return filepath.Join(h.cfg.Roots.Store, rel) }

// buildGolden builds the test key's golden and returns its snapshot dir.
func (h *harness) buildGolden(k fsm.PoolKey) string {
	h.t.Helper()
	res, err := h.d.BuildGolden(context.Background(), fsm.BuildGolden{OpID: newOp(), Key: k})
	if err != nil {
		h.t.Fatalf("golden: %v", err)
	}
	return res.SnapshotDir
}

func cloneIntent(vm, golden string, k fsm.PoolKey) fsm.CloneVM {
	return fsm.CloneVM{OpID: newOp(), VM: vm, Key: k, Instance: testInstance, RunDir: testInstance + "/" + vm, GoldenDir: golden}
}

// clone clones a running VM from golden.
func (h *harness) clone(vm, golden string) executors.Result {
	h.t.Helper()
	res, err := h.d.Clone(context.Background(), cloneIntent(vm, golden, testKey))
	if err != nil {
		h.t.Fatalf("clone %s: %v", vm, err)
	}
	return res
}

// api talks to the VMM of vm directly (not recorded).
func (h *harness) api(vm string) *ch.Client {
	return ch.New(filepath.Join(h.runDir(vm), vmm.SocketFile))
}

// vmState returns vm.info's state, or "" when no VMM answers.
func (h *harness) vmState(vm string) ch.VmState {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	info, err := h.api(vm).Info(ctx)
	if err != nil {
		return ""
	}
	return info.State
}

// heartbeats reads the simulated guest's heartbeat counter.
func (h *harness) heartbeats(vm string) int64 {
	h.t.Helper()
	c, err := h.api(vm).Counters(context.Background())
	if err != nil {
		h.t.Fatalf("counters of %s: %v", vm, err)
	}
	return c["chsim-guest"]["heartbeats"]
}

// storeTemps lists temp dirs in the store.
func (h *harness) storeTemps() []string {
	h.t.Helper()
	ents, err := os.ReadDir(h.cfg.Roots.Store)
	if err != nil {
		h.t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), fsx.TempPrefix) {
			out = append(out, e.Name())
		}
	}
	return out
}

// storeEntries lists the snapshots under store/<sub>.
func (h *harness) storeEntries(sub string) []string {
	h.t.Helper()
	ents, err := os.ReadDir(filepath.Join(h.cfg.Roots.Store, sub))
	if err != nil {
		h.t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

// sha digests a file's content without reading its holes (fsx.ContentSum).
func sha(t *testing.T, path string) string {
	t.Helper()
	sum, err := fsx.ContentSum(path)
	if err != nil {
		t.Fatal(err)
	}
	return sum
}

// waitFor polls cond until it holds or d passes.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func stepNames(rep event.ExecReport) []string {
	var out []string
	for _, s := range rep.Steps {
		out = append(out, s.Name)
	}
	return out
}

// snapshotHeartbeats reads the guest heartbeat counter chsim stores in a
// snapshot's state.json.
func snapshotHeartbeats(t *testing.T, dir string) int64 {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, StateFile))
	if err != nil {
		t.Fatal(err)
	}
	var st struct {
		Heartbeats int64 `json:"heartbeats"`
	}
	if err := json.Unmarshal(data, &st); err != nil {
		t.Fatal(err)
	}
	return st.Heartbeats
}
