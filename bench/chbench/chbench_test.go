package chbench

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/sbxlog/sbxlog/bench/report"
)

// TestRun runs the section in quick mode (a few seconds) so the benchmark
// keeps working; SBXLOG_CHBENCH=full runs it at full size. The figures of
// record come from `make bench`.
func TestRun(t *testing.T) {
	if testing.Short() {
		t.Skip("the section starts a few hundred VMM processes")
	}
	full := os.Getenv("SBXLOG_CHBENCH") == "full"
	sec, err := Run(context.Background(), report.Options{Quick: !full, Scratch: t.TempDir()})
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
		if r[3] == "" || r[3] == "0 ns" {
			t.Errorf("row %q has no p50", r[0])
		}
		if strings.HasPrefix(r[0], "clone") && (r[5] == "" || r[5] == "0/s") {
			t.Errorf("row %q has no rate", r[0])
		}
	}
}
