package logbench

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/sbxlog/sbxlog/bench/report"
)

// TestRun runs the section: by default at smoke size, so the section keeps
// working in CI; SBXLOG_LOGBENCH=quick or full runs it as `go run ./bench`
// would (figures of record come from `make bench`).
func TestRun(t *testing.T) {
	scratch := os.Getenv("SBXLOG_LOGBENCH_SCRATCH")
	if scratch == "" {
		scratch = t.TempDir()
	}
	var sec *report.Section
	var err error
	switch mode := os.Getenv("SBXLOG_LOGBENCH"); mode {
	case "quick", "full":
		sec, err = Run(context.Background(), report.Options{Quick: mode == "quick", Scratch: scratch})
	default:
		sec, err = runWith(context.Background(), scratch, config{
			latencySamples: 20, tputFor: 100 * time.Millisecond, writers: []int{16, 64},
			fillTo: 3000, payloadEvents: 200, oldSizes: []int{1000}, oldCommits: []int{2},
		})
	}
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	sec.Text(&b)
	t.Log(b.String())
	// 3 latency rows, one per writer count, one per old size, 2 replay rows.
	if len(sec.Verdicts) != 4 || len(sec.Rows) < 3+2+1+2 {
		t.Fatalf("section has %d rows and %d verdicts", len(sec.Rows), len(sec.Verdicts))
	}
}
