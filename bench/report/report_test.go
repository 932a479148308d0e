package report

import (
	"strings"
	"testing"
	"time"
)

func TestQuantileNearestRank(t *testing.T) {
	var d Durations
	for i := 100; i >= 1; i-- {
		d = append(d, time.Duration(i))
	}
	for _, tc := range []struct {
		q    float64
		want time.Duration
	}{{0.5, 50}, {0.99, 99}, {1, 100}, {0.001, 1}} {
		if got := d.Quantile(tc.q); got != tc.want {
			t.Errorf("Quantile(%v) = %v, want %v", tc.q, got, tc.want)
		}
	}
	if Durations(nil).Quantile(0.5) != 0 {
		t.Error("empty quantile not zero")
	}
}

func TestSpliceKeepsOtherSections(t *testing.T) {
	a := &Section{Name: "a", Title: "A", Header: []string{"x"}, Rows: [][]string{{"1"}}}
	b := &Section{Name: "b", Title: "B", Header: []string{"y"}, Rows: [][]string{{"2"}}}
	doc := Splice(nil, "m1\n", []*Section{a, b})
	a.Rows = [][]string{{"3"}}
	doc = Splice(doc, "m2\n", []*Section{a})
	s := string(doc)
	if !strings.Contains(s, "| 3 |") || strings.Contains(s, "| 1 |") {
		t.Errorf("section a not rewritten:\n%s", s)
	}
	if !strings.Contains(s, "| 2 |") {
		t.Errorf("section b lost:\n%s", s)
	}
	if !strings.Contains(s, "m2") || strings.Contains(s, "m1") {
		t.Errorf("machine line not refreshed:\n%s", s)
	}
}

// A partial run keeps the time of the last full run in the machine line.
func TestMachineLineOfAPartialRun(t *testing.T) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	full := Machine(now, nil, "")
	if !strings.HasPrefix(full, "Last run: 2026-11-30T12:00:00Z,") {
		t.Fatalf("full run: %q", full)
	}
	later := now.Add(time.Hour)
	part := Machine(later, []string{"apibench"}, "<!-- begin machine -->\n"+full+"<!-- end machine -->\n")
	if !strings.HasPrefix(part, "Last full run: 2026-11-30T12:00:00Z; rerun since: apibench (last at 2026-11-30T13:00:00Z),") {
		t.Fatalf("partial run: %q", part)
	}
	again := Machine(later.Add(time.Hour), []string{"logbench"}, part)
	if !strings.HasPrefix(again, "Last full run: 2026-11-30T12:00:00Z; rerun since: apibench, logbench (last at 2026-11-30T14:00:00Z),") {
		t.Fatalf("second partial run lost the full run's time or the first rerun: %q", again)
	}
}
