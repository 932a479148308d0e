package fsmbench

import (
	"context"
	"strings"
	"testing"

	"github.com/sbxlog/sbxlog/bench/report"
)

// The section runs in quick mode and reports every measure at both sizes,
// with both verdicts. The sizes are cut to keep the test fast under -race;
// `go run ./bench -only fsmbench` measures 1k and 100k.
func TestRunQuick(t *testing.T) {
	saved := sizes
	sizes = []int{200, 2000}
	t.Cleanup(func() { sizes = saved })
	sec, err := Run(context.Background(), report.Options{Quick: true, Scratch: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if len(sec.Rows) != 1+5*len(sizes) || len(sec.Verdicts) != 2 {
		t.Fatalf("%d rows, %d verdicts", len(sec.Rows), len(sec.Verdicts))
	}
	var b strings.Builder
	sec.Text(&b)
	t.Log(b.String())
}
