package chdriver

import (
	"bufio"
	"context"
	"encoding/json"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sbxlog/sbxlog/executors/ch/chsim"
	"github.com/sbxlog/sbxlog/fsm"
)

// clockLine is one of the driver's clock log lines.
type clockLine struct {
	Level   string `json:"level"`
	RunDir  string `json:"run_dir"`
	Off     string `json:"guest_clock_was_off"`
	Message string `json:"message"`
}

// clockLines returns the driver's clock log lines about runDir.
func (h *harness) clockLines(runDir string) []clockLine {
	h.t.Helper()
	var out []clockLine
	sc := bufio.NewScanner(strings.NewReader(h.logs.String()))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var l clockLine
		if json.Unmarshal(sc.Bytes(), &l) == nil && l.RunDir == runDir && strings.Contains(l.Message, "clock") {
			out = append(out, l)
		}
	}
	return out
}

// guestClockSet reads chsim's record of the clock verb on vm's VMM: how
// many sets since its boot or restore, and the time the last one gave.
func (h *harness) guestClockSet(vm string) (int64, time.Time) {
	h.t.Helper()
	c, err := h.api(vm).Counters(context.Background())
	if err != nil {
		h.t.Fatalf("counters of %s: %v", vm, err)
	}
	g := c["chsim-guest"]
	return g["clock_sets"], time.Unix(0, g["clock_told_ns"])
}

// A clone from a golden and a wake of a hibernated VM each set the guest's
// clock once the probe has reached its agent: chsim's guest, restored at
// its snapshot's moment, is told the driver's (injected) time, and the
// driver logs how far behind it was. The driver's clock is moved an hour
// on before each restore, so the guest is an hour behind it each time.
func TestRestoresSetGuestClock(t *testing.T) {
	t.Parallel()
	var shift atomic.Int64
	now := func() time.Time { return time.Now().Add(time.Duration(shift.Load())) }
	h := newHarness(t, "", func(c *Config) { c.Now = now })
	ctx := context.Background()

	golden := h.buildGolden(testKey)
	const vm = "vm-00000000000000c1"
	run := h.runDir(vm)
	check := func(what string, lines int) {
		t.Helper()
		n, told := h.guestClockSet(vm)
		if d := told.Sub(now()); n != 1 || d > 0 || d < -time.Minute {
			t.Fatalf("%s: chsim's agent saw %d sets since the restore, the last to %v (%v before the driver's clock); want 1, just before", what, n, told, -d)
		}
		got := h.clockLines(run)
		if len(got) != lines {
			t.Fatalf("%s: %d clock log lines about %s, want %d: %+v", what, len(got), run, lines, got)
		}
		l := got[lines-1]
		off, err := time.ParseDuration(l.Off)
		if err != nil || l.Message != "chdriver: guest clock set" || l.Level != "info" || off > -59*time.Minute || off < -61*time.Minute {
			t.Fatalf("%s: log line %+v (offset %v, %v); want an info line of about -1h", what, l, off, err)
		}
	}

	shift.Add(int64(time.Hour))
	h.clone(vm, golden)
	check("clone", 1)

	hib := fsm.HibernateVM{OpID: newOp(), VM: vm, Key: testKey, RunDir: testInstance + "/" + vm}
	hres, err := h.d.Hibernate(ctx, hib)
	if err != nil {
		t.Fatal(err)
	}
	shift.Add(int64(time.Hour))
	if _, err := h.d.Wake(ctx, fsm.WakeVM{OpID: newOp(), VM: vm, Key: testKey, RunDir: hib.RunDir, SnapshotDir: hres.SnapshotDir}); err != nil {
		t.Fatal(err)
	}
	check("wake", 2)
}

// A guest whose agent refuses the clock verb (one that predates it) is no
// failure: the clone and the wake succeed, the guest keeps its clock, and
// the driver warns.
func TestGuestClockRefusedIsNoFailure(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "", func(c *Config) { c.VMMEnv = append(c.VMMEnv, chsim.EnvNoClockVerb+"=1") })
	ctx := context.Background()
	golden := h.buildGolden(testKey)
	const vm = "vm-00000000000000c2"
	run := h.runDir(vm)
	h.clone(vm, golden)
	hib := fsm.HibernateVM{OpID: newOp(), VM: vm, Key: testKey, RunDir: testInstance + "/" + vm}
	hres, err := h.d.Hibernate(ctx, hib)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.d.Wake(ctx, fsm.WakeVM{OpID: newOp(), VM: vm, Key: testKey, RunDir: hib.RunDir, SnapshotDir: hres.SnapshotDir}); err != nil {
		t.Fatalf("wake with an agent without the clock verb: %v", err)
	}
	if n, _ := h.guestClockSet(vm); n != 0 {
		t.Fatalf("chsim's agent counted %d clock sets, want 0", n)
	}
	got := h.clockLines(run)
	if len(got) != 2 {
		t.Fatalf("%d clock log lines about %s, want 2 (clone, wake): %+v", len(got), run, got)
	}
	for _, l := range got {
		if l.Level != "warn" || !strings.Contains(l.Message, "cannot set its clock") {
			t.Fatalf("log line %+v, want the warning", l)
		}
	}
}
