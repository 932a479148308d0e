package restartbench

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/sbxlog/sbxlog/bench/report"
)

// TestRun runs the section in quick mode (2k claims, 20k events) so the
// benchmark keeps working; SBXLOG_RESTARTBENCH=full runs it at full size.
// The figures of record come from `make bench`.
func TestRun(t *testing.T) {
	full := os.Getenv("SBXLOG_RESTARTBENCH") == "full"
	sec, err := Run(context.Background(), report.Options{Quick: !full, Scratch: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	sec.Text(&b)
	t.Log(b.String())
	if len(sec.Rows) != 2 || len(sec.Verdicts) != 1 {
		t.Fatalf("section has %d rows and %d verdicts", len(sec.Rows), len(sec.Verdicts))
	}
	for _, r := range sec.Rows {
		if r[1] == "0" && strings.HasPrefix(r[0], "no snapshot") {
			t.Errorf("row %q replayed nothing", r[0])
		}
		if r[6] == "" || r[6] == "0 ns" {
			t.Errorf("row %q has no total", r[0])
		}
	}
}
