package apibench

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/sbxlog/sbxlog/bench/report"
)

// TestRun runs the section in quick mode so the benchmark keeps working;
// SBXLOG_APIBENCH=full runs it at full size (minutes). The figures of record
// come from `make bench`.
func TestRun(t *testing.T) {
	if testing.Short() {
		t.Skip("the section builds thousands of claims on disk")
	}
	full := os.Getenv("SBXLOG_APIBENCH") == "full"
	sec, err := Run(context.Background(), report.Options{Quick: !full, Scratch: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	sec.Text(&b)
	t.Log(b.String())
	cfg := configFor(!full)
	if len(sec.Rows) != 3*len(cfg.levels)+7 || len(sec.Verdicts) != 2 {
		t.Fatalf("section has %d rows and %d verdicts", len(sec.Rows), len(sec.Verdicts))
	}
	for _, r := range sec.Rows {
		if r[4] == "" || r[4] == "0 ns" || r[7] == "0" || r[7] == "" {
			t.Errorf("row %v lacks a p50 or a rate", r)
		}
	}
}
