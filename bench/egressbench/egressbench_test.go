package egressbench

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/sbxlog/sbxlog/bench/report"
	"github.com/sbxlog/sbxlog/executors/egress/netnstest"
)

// The section runs in quick mode end to end (namespaces, nftables, the
// proxy, the built sandboxd on chsim) and reports every row and its
// verdict.
func TestRunQuick(t *testing.T) {
	if testing.Short() {
		t.Skip("builds sandboxd and chsim and runs network namespaces")
	}
	netnstest.Require(t)
	sec, err := Run(context.Background(), report.Options{Quick: true, Scratch: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if len(sec.Rows) != 6 || len(sec.Verdicts) != 1 {
		t.Fatalf("%d rows, %d verdicts", len(sec.Rows), len(sec.Verdicts))
	}
	var b strings.Builder
	sec.Text(&b)
	t.Log(b.String())
	if os.Getenv("SBX_BENCH_VERDICTS") == "1" && strings.Contains(b.String(), "MISS") {
		t.Fatal("a target was missed")
	}
}
