package agentbench

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/sbxlog/sbxlog/bench/report"
)

// TestRun runs the section in quick mode so the benchmark keeps working;
// the figures of record come from `make bench`.
func TestRun(t *testing.T) {
	sec, err := Run(context.Background(), report.Options{Quick: true, Scratch: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	sec.Text(&b)
	t.Log(b.String())
	if len(sec.Rows) != 6 || len(sec.Verdicts) != 2 {
		t.Fatalf("section has %d rows and %d verdicts", len(sec.Rows), len(sec.Verdicts))
	}
	for _, r := range sec.Rows {
		if r[1] == "0 ns" {
			t.Errorf("row %q measured nothing", r[0])
		}
	}
}

// TestTargets pins what each RPC may add to its floors: the verdicts'
// arithmetic, which a quick run on a loaded machine cannot check.
func TestTargets(t *testing.T) {
	for _, tc := range []struct {
		name      string
		got, want time.Duration
	}{
		{"exec: a tenth of the floor and two info round trips", execTarget(10*time.Millisecond, 50*time.Microsecond), 11*time.Millisecond + 100*time.Microsecond},
		{"exec: no info time, the slack only", execTarget(time.Millisecond, 0), 1100 * time.Microsecond},
		{"session: the shell line and the fixed allowance", sessionTarget(100 * time.Microsecond), 600 * time.Microsecond},
	} {
		if tc.got != tc.want {
			t.Errorf("%s: %s, want %s", tc.name, tc.got, tc.want)
		}
	}
}
