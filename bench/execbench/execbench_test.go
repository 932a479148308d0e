package execbench

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/sbxlog/sbxlog/bench/report"
	"github.com/sbxlog/sbxlog/executors/fsx/xfstest"
)

// The section runs in quick mode end to end (XFS loop mount, chsim, the CLI
// comparator) and reports both paths, the two splits and both verdicts.
func TestRunQuick(t *testing.T) {
	if testing.Short() {
		t.Skip("builds chsim and the CLI and mounts XFS")
	}
	xfstest.RequireRoot(t)
	sec, err := Run(context.Background(), report.Options{Quick: true, Scratch: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if len(sec.Rows) != 2+2*numParts || len(sec.Verdicts) != 2 {
		t.Fatalf("%d rows, %d verdicts", len(sec.Rows), len(sec.Verdicts))
	}
	var b strings.Builder
	sec.Text(&b)
	t.Log(b.String())
	if os.Getenv("SBX_BENCH_VERDICTS") == "1" && strings.Contains(b.String(), "MISS") {
		t.Fatal("a target was missed")
	}
}
