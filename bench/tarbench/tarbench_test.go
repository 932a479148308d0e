package tarbench

import (
	"context"
	"strconv"
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
	if len(sec.Rows) != 8 || len(sec.Verdicts) != 6 {
		t.Fatalf("section has %d rows and %d verdicts", len(sec.Rows), len(sec.Verdicts))
	}
	for _, r := range sec.Rows {
		for _, cell := range r[1:3] {
			if _, err := strconv.ParseFloat(cell, 64); err != nil {
				t.Errorf("row %q: %q is not a rate", r[0], cell)
			}
		}
	}
}
