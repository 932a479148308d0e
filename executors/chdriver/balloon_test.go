package chdriver

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sbxlog/sbxlog/eventlog/event"
	"github.com/sbxlog/sbxlog/executors/ch"
	"github.com/sbxlog/sbxlog/executors/templates"
	"github.com/sbxlog/sbxlog/fsm"
)

const mib = 1 << 20

// balloonTemplate writes a chsim template whose config has a balloon of
// size bytes, and returns its pool key.
func balloonTemplate(t *testing.T, h *harness, size int64) fsm.PoolKey {
	t.Helper()
	k := fsm.PoolKey{Template: "balloon", Net: "none", Size: "small"}
	dir := filepath.Join(h.cfg.Roots.Templates, k.Template)
	if err := templates.Synthesize(dir, testSynth); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, templates.ConfigFile)
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	if err := json.Unmarshal(data, &cfg); err != nil {
		t.Fatal(err)
	}
	cfg["balloon"] = map[string]any{"size": size}
	if data, err = json.Marshal(cfg); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return k
}

// balloonActual reads how much the balloon held when chsim took a snapshot.
func balloonActual(t *testing.T, dir string) int64 {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, StateFile))
	if err != nil {
		t.Fatal(err)
	}
	var st struct {
		BalloonActual int64 `json:"balloon_actual"`
	}
	if err := json.Unmarshal(data, &st); err != nil {
		t.Fatal(err)
	}
	return st.BalloonActual
}

func stepDur(rep event.ExecReport, name string) time.Duration {
	for _, s := range rep.Steps {
		if s.Name == name {
			return time.Duration(s.NS)
		}
	}
	return -1
}

// TestBalloonSettles is acceptance 4: with the balloon inflating, the golden
// build and a hibernate wait until memory_actual_size equals memory minus
// the balloon before pausing, so the snapshot holds a settled balloon.
func TestBalloonSettles(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "", func(c *Config) {
		// 64 MiB/s: a 32 MiB balloon takes half a second.
		c.VMMEnv = append(c.VMMEnv, "SBX_CHSIM_BALLOON_RATE=64M")
	})
	k := balloonTemplate(t, h, 32*mib)
	ctx := context.Background()
	gres, err := h.d.BuildGolden(ctx, fsm.BuildGolden{OpID: newOp(), Key: k})
	if err != nil {
		t.Fatal(err)
	}
	if got := balloonActual(t, h.store(gres.SnapshotDir)); got != 32*mib {
		t.Fatalf("golden paused with %d MiB in the balloon, want 32", got/mib)
	}
	if d := stepDur(gres.Report, StepBalloon); d < 300*time.Millisecond {
		t.Fatalf("golden build waited %v for a balloon that takes ~500 ms", d)
	}

	const vm = "vm-00000000000000e1"
	if _, err := h.d.Clone(ctx, cloneIntent(vm, gres.SnapshotDir, k)); err != nil {
		t.Fatal(err)
	}
	// Grow the balloon; hibernate right away.
	if err := h.api(vm).Resize(ctx, ch.ResizeBalloon(48*mib)); err != nil {
		t.Fatal(err)
	}
	var infos []int64
	h.d.newAPI = func(s string) API { return infoRecorder{API: ch.New(s), sizes: &infos} }
	hres, err := h.d.Hibernate(ctx, fsm.HibernateVM{OpID: newOp(), VM: vm, Key: k, RunDir: testInstance + "/" + vm})
	if err != nil {
		t.Fatal(err)
	}
	if got := balloonActual(t, h.store(hres.SnapshotDir)); got != 48*mib {
		t.Fatalf("hibernate paused with %d MiB in the balloon, want 48", got/mib)
	}
	// vm.info was polled while it moved, and its last answer before the
	// pause was the settled size. How far it had moved by the first poll
	// is the host's timing (a loaded host starts the hibernate late), so
	// two polls, the first seeing it unsettled, are the proof of a wait.
	if len(infos) < 2 || infos[0] == 16*mib || infos[len(infos)-1] != 16*mib {
		t.Fatalf("memory_actual_size polled %v MiB, want a wait ending at 16", mibs(infos))
	}
	if strings.Contains(h.logs.String(), "no progress") {
		t.Fatal("settling balloon logged as stalled")
	}
}

// TestBalloonStall: a balloon that makes no progress is given up after
// Balloon.Stall, logged, and the hibernate goes on.
func TestBalloonStall(t *testing.T) {
	t.Parallel()
	const stall = 300 * time.Millisecond
	h := newHarness(t, "", func(c *Config) {
		// 1 byte/s rounds to no progress per guest tick: a stuck balloon.
		c.VMMEnv = append(c.VMMEnv, "SBX_CHSIM_BALLOON_RATE=1")
		c.Balloon = Balloon{Poll: 20 * time.Millisecond, Stall: stall, Max: time.Minute}
	})
	k := balloonTemplate(t, h, 32*mib)
	ctx := context.Background()
	gres, err := h.d.BuildGolden(ctx, fsm.BuildGolden{OpID: newOp(), Key: k})
	if err != nil {
		t.Fatal(err)
	}
	const vm = "vm-00000000000000e2"
	if _, err := h.d.Clone(ctx, cloneIntent(vm, gres.SnapshotDir, k)); err != nil {
		t.Fatal(err)
	}
	hres, err := h.d.Hibernate(ctx, fsm.HibernateVM{OpID: newOp(), VM: vm, Key: k, RunDir: testInstance + "/" + vm})
	if err != nil {
		t.Fatal(err)
	}
	if d := stepDur(hres.Report, StepBalloon); d < stall || d > stall+time.Second {
		t.Fatalf("balloon wait %v, want about %v", d, stall)
	}
	if got := balloonActual(t, h.store(hres.SnapshotDir)); got != 0 {
		t.Fatalf("stuck balloon holds %d bytes?", got)
	}
	if n := strings.Count(h.logs.String(), "balloon made no progress"); n != 2 {
		t.Fatalf("stall logged %d times, want 2 (golden, hibernate):\n%s", n, h.logs.String())
	}
}

// TestBalloonMax: a balloon that moves but too slowly is given up after
// Balloon.Max in all.
func TestBalloonMax(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "", func(c *Config) {
		c.VMMEnv = append(c.VMMEnv, "SBX_CHSIM_BALLOON_RATE=4M")
		c.Balloon = Balloon{Poll: 20 * time.Millisecond, Stall: time.Minute, Max: 400 * time.Millisecond}
	})
	k := balloonTemplate(t, h, 32*mib)
	gres, err := h.d.BuildGolden(context.Background(), fsm.BuildGolden{OpID: newOp(), Key: k})
	if err != nil {
		t.Fatal(err)
	}
	if d := stepDur(gres.Report, StepBalloon); d < 400*time.Millisecond || d > 1400*time.Millisecond {
		t.Fatalf("balloon wait %v, want about 400ms", d)
	}
	got := balloonActual(t, h.store(gres.SnapshotDir))
	if got <= 0 || got >= 32*mib {
		t.Fatalf("balloon at %d MiB, want partly inflated", got/mib)
	}
	if !strings.Contains(h.logs.String(), "balloon did not settle in time") {
		t.Fatal("give-up not logged")
	}
}

// infoRecorder notes memory_actual_size from every vm.info.
type infoRecorder struct {
	API
	sizes *[]int64
}

func (r infoRecorder) Info(ctx context.Context) (*ch.VmInfo, error) {
	i, err := r.API.Info(ctx)
	if err == nil {
		*r.sizes = append(*r.sizes, i.MemoryActualSize)
	}
	return i, err
}

func mibs(v []int64) []int64 {
	out := make([]int64, len(v))
	for i, x := range v {
		out[i] = x / mib
	}
	return out
}
