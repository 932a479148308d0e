package diskbench

import (
	"context"
	"os/exec"
	"strings"
	"testing"

	"github.com/sbxlog/sbxlog/bench/report"
	"github.com/sbxlog/sbxlog/executors/fsx/xfstest"
)

// The step clock gives each hook step the time until the next one, and the
// last step the time until stop; repeated steps add up in first-seen order.
func TestStepClock(t *testing.T) {
	var c stepClock
	c.start()
	for _, s := range []string{"a", "b", "a", "c"} {
		if err := c.hook(s, ""); err != nil {
			t.Fatal(err)
		}
	}
	c.stop()
	if len(c.order) != 3 || c.order[0] != "a" || c.order[1] != "b" || c.order[2] != "c" {
		t.Fatalf("order %v", c.order)
	}
	if got := c.String(); !strings.HasPrefix(got, "a ") || !strings.Contains(got, ", b ") || !strings.Contains(got, ", c ") {
		t.Fatalf("String %q", got)
	}
}

// TestRunArchive runs archivebench in quick mode (root and mkfs.xfs for
// its loop-mounted XFS; skipped without them unless SBX_REQUIRE_XFS=1).
func TestRunArchive(t *testing.T) {
	if testing.Short() {
		t.Skip("copies 96 MiB four ways per round")
	}
	xfstest.RequireRoot(t)
	if _, err := exec.LookPath("mkfs.xfs"); err != nil {
		xfstest.Unavailable(t, "mkfs.xfs not found (apt-get install xfsprogs)")
	}
	sec, err := RunArchive(context.Background(), report.Options{Quick: true, Scratch: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	sec.Text(&b)
	t.Log(b.String())
	if len(sec.Rows) != 2 || len(sec.Verdicts) != 1 || !strings.Contains(b.String(), "verify ") {
		t.Fatalf("%d rows, %d verdicts, step breakdown missing", len(sec.Rows), len(sec.Verdicts))
	}
}
