package ckptbench

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/sbxlog/sbxlog/bench/report"
	"github.com/sbxlog/sbxlog/executors/fsx/xfstest"
	"github.com/sbxlog/sbxlog/executors/guest/guesttest"
)

func ms(n int) time.Duration { return time.Duration(n) * time.Millisecond }

// TestPauseSection pins the pause verdict's arithmetic and the rows.
func TestPauseSection(t *testing.T) {
	for _, tc := range []struct {
		name           string
		pause, capture int
		pass           bool
	}{
		{"pause as long as the capture", 50, 50, true},
		{"pause at the target's edge", 125, 100, true},
		{"pause past the target", 126, 100, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := pauseSample{call: ms(300), pause: ms(tc.pause), after: ms(100), capture: ms(tc.capture), hib: ms(400),
				parts: [4]time.Duration{ms(5), ms(20), ms(20), ms(1)}}
			sec := pauseSection(pauseConfigFor(true), []pauseSample{s})
			if len(sec.Rows) != 9 || len(sec.Verdicts) != 1 {
				t.Fatalf("%d rows, %d verdicts", len(sec.Rows), len(sec.Verdicts))
			}
			if got := strings.HasPrefix(sec.Verdicts[0], "PASS"); got != tc.pass {
				t.Fatalf("verdict %q, want pass %v", sec.Verdicts[0], tc.pass)
			}
		})
	}
}

// TestForkSection pins the fork verdict: per child at the largest size
// against a warm claim plus a clone-tier claim.
func TestForkSection(t *testing.T) {
	for _, tc := range []struct {
		name  string
		fork  time.Duration // the fork of 32
		pass  bool
		ratio string
	}{
		{"32 children at the target", 32 * ms(11), true, "1.00x"},
		{"32 children past it", 32*ms(11) + 32*time.Microsecond, false, "1.00x"},
		{"32 children at half", 32*ms(5) + 16*ms(1), true, "0.50x"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &forkRuns{warm: report.Durations{ms(1)}, clone: report.Durations{ms(10)}, checkpoint: report.Durations{ms(3)},
				fork: map[int]report.Durations{1: {ms(12)}, 8: {ms(40)}, 32: {tc.fork}}}
			sec := forkSection(forkConfigFor(true), r)
			if len(sec.Rows) != 6 || len(sec.Verdicts) != 1 {
				t.Fatalf("%d rows, %d verdicts", len(sec.Rows), len(sec.Verdicts))
			}
			if got := strings.HasPrefix(sec.Verdicts[0], "PASS"); got != tc.pass {
				t.Fatalf("verdict %q, want pass %v", sec.Verdicts[0], tc.pass)
			}
			if got := sec.Rows[5][4]; got != tc.ratio {
				t.Errorf("per-child ratio %s, want %s", got, tc.ratio)
			}
		})
	}
}

// checkRun logs a quick run's section and fails on a MISS when
// SBX_BENCH_VERDICTS=1.
func checkRun(t *testing.T, sec *report.Section, rows int) {
	t.Helper()
	var b strings.Builder
	sec.Text(&b)
	t.Log(b.String())
	if len(sec.Rows) != rows || len(sec.Verdicts) != 1 {
		t.Fatalf("%d rows, %d verdicts", len(sec.Rows), len(sec.Verdicts))
	}
	for _, r := range sec.Rows {
		if strings.HasPrefix(r[1], "0 ns") {
			t.Errorf("row %q measured nothing", r[0])
		}
	}
	if t.Failed() {
		return
	}
	if strings.Contains(b.String(), "MISS") && os.Getenv("SBX_BENCH_VERDICTS") == "1" {
		t.Fatal("a target was missed")
	}
}

// TestRunPause runs pausebench in quick mode on a real guest (the
// real-guest suite: SBX_E2E=1; skipped without QEMU or root unless
// SBX_REQUIRE_QEMU / SBX_REQUIRE_XFS say otherwise).
func TestRunPause(t *testing.T) {
	guesttest.Require(t)
	requireXFS(t)
	sec, err := RunPause(context.Background(), report.Options{Quick: true, Scratch: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	checkRun(t, sec, 9)
}

// TestRunFork runs forkbench in quick mode: it builds sandboxd and chsim
// and loop-mounts XFS (root; skipped without it unless SBX_REQUIRE_XFS=1).
func TestRunFork(t *testing.T) {
	if testing.Short() {
		t.Skip("builds sandboxd and chsim and forks 41 children")
	}
	requireXFS(t)
	sec, err := RunFork(context.Background(), report.Options{Quick: true, Scratch: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	checkRun(t, sec, 6)
}

// requireXFS skips t (fails it with SBX_REQUIRE_XFS=1) without root or
// mkfs.xfs, which the sections' loop-mounted XFS needs.
func requireXFS(t *testing.T) {
	t.Helper()
	xfstest.RequireRoot(t)
	if _, err := exec.LookPath("mkfs.xfs"); err != nil {
		xfstest.Unavailable(t, "mkfs.xfs not found (apt-get install xfsprogs)")
	}
}
