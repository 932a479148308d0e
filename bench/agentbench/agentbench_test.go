package agentbench

import (
	"context"
	"strings"
	"testing"

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
	if len(sec.Rows) != 6 {
		t.Fatalf("section has %d rows", len(sec.Rows))
	}
	for _, r := range sec.Rows {
		if r[1] == "0 ns" {
			t.Errorf("row %q measured nothing", r[0])
		}
	}
}
