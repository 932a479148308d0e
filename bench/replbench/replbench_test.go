package replbench

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/sbxlog/sbxlog/bench/report"
)

// TestRun runs the section when SBXLOG_REPLBENCH is "quick" or "full" and
// prints its table; the figures of record come from `make bench`.
func TestRun(t *testing.T) {
	mode := os.Getenv("SBXLOG_REPLBENCH")
	if mode == "" {
		t.Skip("set SBXLOG_REPLBENCH=quick or full to run the replication benchmark")
	}
	sec, err := Run(context.Background(), report.Options{Quick: mode == "quick", Scratch: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	sec.Text(&b)
	t.Log(b.String())
	if len(sec.Rows) != 8 || len(sec.Verdicts) != 6 {
		t.Fatalf("section has %d rows and %d verdicts", len(sec.Rows), len(sec.Verdicts))
	}
}

func TestRunFleet(t *testing.T) {
	mode := os.Getenv("SBXLOG_REPLBENCH")
	if mode == "" {
		t.Skip("set SBXLOG_REPLBENCH=quick or full to run the fleet benchmark")
	}
	quick := mode == "quick"
	sec, err := RunFleet(context.Background(), report.Options{Quick: quick, Scratch: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	sec.Text(&b)
	t.Log(b.String())
	faults := fleetConfigFor(quick).faults
	if len(sec.Rows) != 4+faults || len(sec.Verdicts) != 2+faults {
		t.Fatalf("section has %d rows and %d verdicts, want %d and %d", len(sec.Rows), len(sec.Verdicts), 4+faults, 2+faults)
	}
}
