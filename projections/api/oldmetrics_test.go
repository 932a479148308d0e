package api_test

import (
	"bytes"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/sbxlog/sbxlog/cmd/sandboxd/node/nodetest"
	"github.com/sbxlog/sbxlog/projections/api"
)

// scrape reads /metrics as a Prometheus server parses it: family name ->
// "type {label=value,...}" -> value.
func scrape(t *testing.T, n *nodetest.Node, tok string) map[string]map[string]float64 {
	t.Helper()
	st, b := call(t, n, "GET", "/metrics", tok, nil)
	if st != http.StatusOK {
		t.Fatalf("GET /metrics: %d %s", st, b)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	out := map[string]map[string]float64{}
	for name, f := range fams {
		out[name] = map[string]float64{}
		for _, m := range f.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, l.GetName()+"="+l.GetValue())
			}
			sort.Strings(labels)
			v := m.GetGauge().GetValue()
			if f.GetType() == dto.MetricType_COUNTER {
				v = m.GetCounter().GetValue()
			}
			out[name][strings.ToLower(f.GetType().String())+" {"+strings.Join(labels, ",")+"}"] = v
		}
	}
	return out
}

// TestOldMetrics: the old daemon's sandboxd_* families, with its names,
// labels and types, follow what the node does: claims by tier, a tenant's
// live claims, hibernate, wake, release, the pool's warm and target.
func TestOldMetrics(t *testing.T) {
	n := newNode(t, 1, nil)
	a := claimAs(t, n, tokA, "")
	r := claimAs(t, n, rootTok, "")
	for _, step := range []struct{ op, state string }{{"hibernate", "hibernated"}, {"wake", "running"}} {
		if st, b := call(t, n, "POST", "/v1/sandboxes/"+r.ID+"/"+step.op, rootTok, nil); st != http.StatusNoContent {
			t.Fatalf("%s: %d %s", step.op, st, b)
		}
		waitState(t, n, r.ID, step.state)
	}
	if st, b := call(t, n, "POST", "/v1/sandboxes/"+r.ID+"/release", rootTok, nil); st != http.StatusNoContent {
		t.Fatalf("release: %d %s", st, b)
	}
	settle(t, n)

	tiers := map[string]float64{"warm": 0, "clone": 0, "cold": 0}
	tiers[a.Tier]++
	tiers[r.Tier]++
	want := map[string]map[string]float64{
		"sandboxd_claimed":             {"gauge {}": 1},
		"sandboxd_hibernated":          {"gauge {}": 0},
		"sandboxd_archived":            {"gauge {}": 0},
		"sandboxd_failed":              {"gauge {}": 0},
		"sandboxd_draining":            {"gauge {}": 0},
		"sandboxd_tenant_claims":       {"gauge {tenant=a}": 1},
		"sandboxd_pool_warm":           {"gauge {net=none,size=small,template=default}": 1},
		"sandboxd_pool_target":         {"gauge {net=none,size=small,template=default}": 1},
		"sandboxd_claims_total":        {"counter {tier=warm}": tiers["warm"], "counter {tier=clone}": tiers["clone"], "counter {tier=cold}": tiers["cold"]},
		"sandboxd_wakes_total":         {"counter {}": 1},
		"sandboxd_hibernates_total":    {"counter {}": 1},
		"sandboxd_releases_total":      {"counter {}": 1},
		"sandboxd_reaps_total":         {"counter {}": 0},
		"sandboxd_claim_seconds_total": nil, // values checked below
		"sandboxd_wake_seconds_total":  nil,
		// One node, no fleet: nothing to differ from.
		"sandboxd_config_digest_mismatch": {"gauge {}": 0},
	}
	// The store recipes' counters: none ran (TestOldStoreMetrics).
	for _, f := range oldStoreFamilies {
		want[f] = map[string]float64{"counter {}": 0}
	}
	// The counters follow commits, which reach the metrics just after
	// the answers: poll.
	var got map[string]map[string]float64
	deadline := time.Now().Add(10 * time.Second)
	for {
		got = scrape(t, n, rootTok)
		if diff := compareFamilies(got, want); diff == "" {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("sandboxd_* families: %s", diff)
		}
		time.Sleep(5 * time.Millisecond)
	}
	for _, name := range []string{"sandboxd_claim_seconds_total", "sandboxd_wake_seconds_total"} {
		if v, ok := got[name]["counter {}"]; !ok || v < 0 || len(got[name]) != 1 {
			t.Errorf("%s: %v, want one counter >= 0", name, got[name])
		}
	}
	// What sbxlog does not do is not served.
	for name := range got {
		if strings.HasPrefix(name, "sandboxd_") {
			if _, ok := want[name]; !ok {
				t.Errorf("unexpected family %s", name)
			}
		}
	}
	// The sbx_* families are still there.
	if _, ok := got["sbx_claims_total"]; !ok {
		t.Error("sbx_claims_total is gone")
	}

	// Only tenants holding live claims are listed: a's release empties it.
	if st, b := call(t, n, "POST", "/v1/sandboxes/"+a.ID+"/release", rootTok, nil); st != http.StatusNoContent {
		t.Fatalf("release a: %d %s", st, b)
	}
	if got := scrape(t, n, rootTok); got["sandboxd_tenant_claims"] != nil || got["sandboxd_claimed"]["gauge {}"] != 0 {
		t.Errorf("after every release: tenant_claims %v, claimed %v", got["sandboxd_tenant_claims"], got["sandboxd_claimed"])
	}
}

// compareFamilies returns what differs between got and want ("" if
// nothing); a nil entry in want only requires the family to exist.
func compareFamilies(got, want map[string]map[string]float64) string {
	var diffs []string
	for name, samples := range want {
		g, ok := got[name]
		switch {
		case !ok:
			diffs = append(diffs, name+" missing")
		case samples == nil:
		case fmt.Sprint(g) != fmt.Sprint(samples):
			diffs = append(diffs, fmt.Sprintf("%s = %v, want %v", name, g, samples))
		}
	}
	sort.Strings(diffs)
	return strings.Join(diffs, "; ")
}

// TestMetricsAuth: /metrics is the root token's, as the old daemon's; open
// on a node without a root token, and with metrics_auth "none".
func TestMetricsAuth(t *testing.T) {
	guarded := newNode(t, 0, nil)
	for _, tc := range []struct {
		tok  string
		want int
	}{{"", http.StatusUnauthorized}, {"not-a-token", http.StatusUnauthorized}, {tokA, http.StatusForbidden}, {rootTok, http.StatusOK}} {
		if st, b := call(t, guarded, "GET", "/metrics", tc.tok, nil); st != tc.want {
			t.Errorf("GET /metrics with %q: %d %.100s, want %d", tc.tok, st, b, tc.want)
		}
	}
	noRoot := newNode(t, 0, func(o *nodetest.Options) { o.RootToken = "" })
	open := newNode(t, 0, func(o *nodetest.Options) { o.Config.MetricsAuth = api.MetricsAuthNone })
	for name, n := range map[string]*nodetest.Node{"no root token": noRoot, "metrics_auth none": open} {
		for _, tok := range []string{"", tokA} {
			if st, b := call(t, n, "GET", "/metrics", tok, nil); st != http.StatusOK || !bytes.Contains(b, []byte("sandboxd_claimed")) {
				t.Errorf("%s: GET /metrics with %q: %d %.100s, want 200", name, tok, st, b)
			}
		}
	}
}
