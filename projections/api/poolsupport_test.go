package api_test

import (
	"net/http"
	"strings"
	"testing"
)

// What the node cannot serve (PoolSupport: its driver's templates and
// nets) is refused at once by PUT /v1/pools and POST /v1/claim, before
// anything is proposed: the log does not grow and the pools stay as they
// were (issue 22 defect 4: an egress claim on a node without a bridge was
// a late 500, an unknown template a cold boot that failed).
func TestUnservablePoolKeysRefused(t *testing.T) {
	n := newNode(t, 1, nil)
	n.Driver.SetTemplates("default")
	n.Driver.NoBridge.Store(true)
	settle(t, n)
	seq := n.Log.LastSeq()
	const noBridge = "pool default/egress/small: net egress needs a bridge"
	for _, tc := range []struct {
		name, method, path, token, body string
		want                            int
		msg                             string
	}{
		{"pool of an unknown template", "PUT", "/v1/pools", rootTok,
			`{"pools":[{"template":"default","net":"none","size":"small","warm":1},{"template":"nope","net":"none","size":"small","warm":1}]}`,
			http.StatusNotFound, `"error":"unknown template nope; templates here: default (sbxctl templates, GET /v1/templates)"`},
		{"egress pool without a bridge", "PUT", "/v1/pools", rootTok,
			`{"pools":[{"template":"default","net":"egress","size":"small","warm":1}]}`,
			http.StatusConflict, noBridge},
		{"egress claim without a bridge", "POST", "/v1/claim", rootTok, `{"template":"default","net":"egress"}`,
			http.StatusConflict, noBridge},
		{"tenant's egress claim without a bridge", "POST", "/v1/claim", tokA, `{"template":"default","net":"egress"}`,
			http.StatusConflict, noBridge},
		{"claim of an unknown template", "POST", "/v1/claim", tokB, `{"template":"nope"}`,
			http.StatusNotFound, `"error":"unknown template nope; templates here: default (sbxctl templates, GET /v1/templates)"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, b := call(t, n, tc.method, tc.path, tc.token, []byte(tc.body))
			if st != tc.want || !strings.Contains(string(b), tc.msg) {
				t.Fatalf("%d %s, want %d with %q", st, b, tc.want, tc.msg)
			}
		})
	}
	if got := n.Log.LastSeq(); got != seq {
		t.Fatalf("log went from %d to %d: refused requests appended events", seq, got)
	}
	st, b := call(t, n, "GET", "/v1/pools", rootTok, nil)
	if want := `{"pools":[{"template":"default","net":"none","size":"small","warm":1`; st != http.StatusOK || !strings.HasPrefix(string(b), want) || strings.Count(string(b), `"template"`) != 1 {
		t.Fatalf("pools after the refusals: %d %s", st, b)
	}
	// What the node can serve still goes through.
	if st, b := call(t, n, "PUT", "/v1/pools", rootTok, []byte(`{"pools":[{"template":"default","net":"none","size":"medium","warm":0}]}`)); st != http.StatusOK {
		t.Fatalf("a servable pool: %d %s", st, b)
	}
}
