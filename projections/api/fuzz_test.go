package api_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/sbxlog/sbxlog/cmd/sandboxd/node/nodetest"
	"github.com/sbxlog/sbxlog/projections/api"
)

// The fuzz targets feed arbitrary bodies to the claim and pools handlers of
// a real node (in-process hypervisor fake) through Server.ServeHTTP, so a
// panic fails the run instead of being swallowed by net/http. Their seed
// corpus (the bad-input table's bodies plus valid ones) runs in every
// `go test`; `make test` also fuzzes each briefly.

// maxSeed keeps the oversize rows out of the corpus: the table covers them
// over HTTP, and megabyte seeds would slow the mutator to a crawl.
const maxSeed = 64 << 10

func addSeeds(f *testing.F, rows []badInput, valid ...string) {
	for _, r := range rows {
		if len(r.body) <= maxSeed {
			f.Add([]byte(r.body))
		}
	}
	for _, v := range valid {
		f.Add([]byte(v))
	}
}

// serve runs one request through the handler and checks the invariants
// every reply must hold: no 5xx, a JSON {"error": ...} body on 4xx.
func serve(t *testing.T, n *nodetest.Node, method, path string, body []byte) *httptest.ResponseRecorder {
	t.Helper()
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(method, path, bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+rootTok)
	n.Server.ServeHTTP(rec, req)
	if rec.Code >= 500 {
		t.Fatalf("%s %s %.200q: %d %s", method, path, body, rec.Code, rec.Body.Bytes())
	}
	if rec.Code >= 400 {
		var e struct {
			Error string `json:"error"`
		}
		if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
			t.Fatalf("%s %s %.200q: %d with Content-Type %q", method, path, body, rec.Code, ct)
		}
		if err := json.Unmarshal(rec.Body.Bytes(), &e); err != nil || e.Error == "" {
			t.Fatalf("%s %s %.200q: %d body %q, want {\"error\": ...}", method, path, body, rec.Code, rec.Body.Bytes())
		}
	}
	return rec
}

func FuzzClaim(f *testing.F) {
	addSeeds(f, claimRows(),
		`{"template":"default"}`,
		`{"template":"default","net":"none","size":"small","ttl_seconds":86400,"claim_ref":"r","metadata":{"k":"v"}}`,
		`{"template":"default","ttl_seconds":0}`,
		` {"template" : "default"} `,
	)
	n := newNode(f, 4, nil)
	f.Fuzz(func(t *testing.T, body []byte) {
		rec := serve(t, n, "POST", "/v1/claim", body)
		if rec.Code != http.StatusOK {
			return
		}
		var cr api.ClaimResponse
		if err := json.Unmarshal(rec.Body.Bytes(), &cr); err != nil || !strings.HasPrefix(cr.ID, "sb_") || cr.Token == "" || cr.Deadline == "" {
			t.Fatalf("claim %.200q: 200 with %s", body, rec.Body.Bytes())
		}
	})
}

func FuzzPutPools(f *testing.F) {
	addSeeds(f, poolsRows(),
		`{"pools":[]}`,
		`{"pools":[{"template":"default","net":"none","size":"small","warm":2}]}`,
		`{"pools":[{"template":"default","warm":1,"warm_max":3,"idle_hibernate_seconds":60},{"template":"other","net":"egress","size":"2xlarge","warm":0}]}`,
	)
	// No executors: an accepted body may ask for thousands of warm VMs, and
	// filling them is not what this target tests.
	n := newNode(f, 0, func(o *nodetest.Options) { o.NoExecutors = true })
	f.Fuzz(func(t *testing.T, body []byte) {
		rec := serve(t, n, "PUT", "/v1/pools", body)
		if rec.Code != http.StatusOK {
			return
		}
		var info api.Info
		if err := json.Unmarshal(rec.Body.Bytes(), &info); err != nil || info.Pools == nil {
			t.Fatalf("put pools %.200q: 200 with %s", body, rec.Body.Bytes())
		}
	})
}
