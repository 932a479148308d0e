package api_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sbxlog/sbxlog/projections/api"
)

// oldStatsKeys are the old daemon's stats fields: every one always present.
var oldStatsKeys = []string{"id", "cpu_count", "mem_total_bytes", "mem_used_bytes", "mem_used_measured", "hibernated", "measured_at"}

// TestSandboxStats: the size's CPUs and memory, the VMM's resident set
// (the fake's VMM is the test process), unmeasured once hibernated, for
// root and the sandbox's own token only, 404 for an unknown or ended one.
func TestSandboxStats(t *testing.T) {
	n := newNode(t, 2, nil)
	cr := claimAs(t, n, tokA, "")
	stats := func(tok string) (int, api.SandboxStats, map[string]json.RawMessage, []byte) {
		t.Helper()
		st, b := call(t, n, "GET", "/v1/sandboxes/"+cr.ID+"/stats", tok, nil)
		var out api.SandboxStats
		var keys map[string]json.RawMessage
		if st == http.StatusOK && (json.Unmarshal(b, &out) != nil || json.Unmarshal(b, &keys) != nil) {
			t.Fatalf("stats body %s", b)
		}
		return st, out, keys, b
	}
	before := time.Now().UTC()
	for _, tok := range []string{rootTok, cr.Token} {
		st, s, keys, b := stats(tok)
		if st != http.StatusOK {
			t.Fatalf("stats as %q: %d %s", tok, st, b)
		}
		for _, k := range oldStatsKeys {
			if _, ok := keys[k]; !ok {
				t.Errorf("stats lacks %q: %s", k, b)
			}
		}
		at, err := time.Parse(time.RFC3339Nano, s.MeasuredAt)
		if s.ID != cr.ID || s.CPUCount != 1 || s.MemTotalBytes != 512<<20 || s.Hibernated || s.State != "running" || s.VM != cr.VM ||
			!s.MemUsedMeasured || s.MemUsedBytes <= 0 || s.CPUSeconds < 0 || err != nil || !strings.HasSuffix(s.MeasuredAt, "Z") || at.Before(before.Add(-time.Second)) {
			t.Fatalf("stats of a running sandbox: %s", b)
		}
	}
	for _, tok := range []string{tokA, tokB} {
		if st, _, _, b := stats(tok); st != http.StatusForbidden {
			t.Errorf("stats as a tenant: %d %s, want 403", st, b)
		}
	}
	if st, b := call(t, n, "GET", "/v1/sandboxes/sb_0123456789abcdef/stats", rootTok, nil); st != http.StatusNotFound || string(b) != `{"error":"unknown sandbox"}`+"\n" {
		t.Errorf("stats of an unknown id: %d %s", st, b)
	}

	// Hibernated: no VMM process, so nothing is measured.
	if st, b := call(t, n, "POST", "/v1/sandboxes/"+cr.ID+"/hibernate", rootTok, nil); st != http.StatusNoContent {
		t.Fatalf("hibernate: %d %s", st, b)
	}
	waitState(t, n, cr.ID, "hibernated")
	if st, s, _, b := stats(rootTok); st != http.StatusOK || !s.Hibernated || s.MemUsedMeasured || s.MemUsedBytes != 0 || s.CPUSeconds != 0 || s.State != "hibernated" {
		t.Fatalf("stats of a hibernated sandbox: %d %s", st, b)
	}
	if got := n.Driver.Calls()["hibernate"]; got != 1 {
		t.Fatalf("stats changed the sandbox: %d hibernates", got)
	}

	// Ended: 410, saying so (ended.go).
	if st, b := call(t, n, "POST", "/v1/sandboxes/"+cr.ID+"/release", rootTok, nil); st != http.StatusNoContent {
		t.Fatalf("release: %d %s", st, b)
	}
	if st, _, _, b := stats(rootTok); st != http.StatusGone || string(b) != goneBody(t, n, cr.ID)+"\n" {
		t.Fatalf("stats of a released sandbox: %d %s", st, b)
	}
}
