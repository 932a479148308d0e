package api_test

import (
	"bytes"
	"encoding/json"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/sbxlog/sbxlog/cmd/sandboxd/node"
	"github.com/sbxlog/sbxlog/cmd/sandboxd/node/nodetest"
	"github.com/sbxlog/sbxlog/fsm"
	"github.com/sbxlog/sbxlog/projections/api"
	"github.com/sbxlog/sbxlog/projections/auth"
)

// tenantList is GET /v1/tenants as root.
func tenantList(t *testing.T, n *nodetest.Node, query string) api.TenantList {
	t.Helper()
	st, b := call(t, n, "GET", "/v1/tenants"+query, rootTok, nil)
	var l api.TenantList
	if st != http.StatusOK || json.Unmarshal(b, &l) != nil {
		t.Fatalf("GET /v1/tenants%s: %d %s", query, st, b)
	}
	return l
}

func listNames(l api.TenantList) []string {
	var out []string
	for _, t := range l.Tenants {
		out = append(out, t.Name)
	}
	return out
}

// mustStatus calls and requires status want.
func mustStatus(t *testing.T, n *nodetest.Node, want int, method, path, token, body string) []byte {
	t.Helper()
	var b []byte
	if body != "" {
		b = []byte(body)
	}
	st, resp := call(t, n, method, path, token, b)
	if st != want {
		t.Fatalf("%s %s: %d %s, want %d", method, path, st, resp, want)
	}
	return resp
}

// errorIs requires resp to be exactly {"error": msg}.
func errorIs(t *testing.T, resp []byte, msg string) {
	t.Helper()
	var e map[string]string
	if err := json.Unmarshal(resp, &e); err != nil || len(e) != 1 || e["error"] != msg {
		t.Fatalf("body %s, want exactly {\"error\":%q}", resp, msg)
	}
}

// A tenant created, rotated or removed over the API authenticates (or
// stops) at the next request; lists carry no token; the old answers.
func TestTenantRoutes(t *testing.T) {
	n := newNode(t, 2, nil)
	mustStatus(t, n, 204, "PUT", "/v1/tenants/acme", rootTok, `{"token":"acme-1","max_claims":2}`)
	claimAs(t, n, "acme-1", "")
	l := tenantList(t, n, "")
	if !slices.Equal(listNames(l), []string{"a", "acme", "b"}) || l.Digest == "" || l.Next != "" {
		t.Fatalf("list %+v", l)
	}
	if got := l.Tenants[1]; got != (api.TenantJSON{Name: "acme", MaxClaims: 2, Claims: 1}) {
		t.Fatalf("acme %+v", got)
	}
	raw := mustStatus(t, n, 200, "GET", "/v1/tenants", rootTok, "")
	if bytes.Contains(raw, []byte("acme-1")) || bytes.Contains(raw, []byte(auth.HashToken("acme-1"))) || bytes.Contains(raw, []byte("token")) {
		t.Fatalf("the list serves a token back: %s", raw)
	}

	// Rotation: the old token is unknown at once, the new one works, the
	// cap is kept only when sent again.
	mustStatus(t, n, 204, "PUT", "/v1/tenants/acme", rootTok, `{"token":"acme-2"}`)
	mustStatus(t, n, 401, "GET", "/v1/sandboxes", "acme-1", "")
	mustStatus(t, n, 200, "GET", "/v1/sandboxes", "acme-2", "")
	// No token keeps the stored one.
	mustStatus(t, n, 204, "PUT", "/v1/tenants/acme", rootTok, `{"max_claims":1}`)
	mustStatus(t, n, 200, "GET", "/v1/sandboxes", "acme-2", "")
	// The cap comes from the table: acme has one live claim.
	errorIs(t, mustStatus(t, n, 429, "POST", "/v1/claim", "acme-2", `{"template":"default"}`), `tenant "acme" is at its cap of 1 claims`)
	// An empty body changes the cap to none.
	mustStatus(t, n, 204, "PUT", "/v1/tenants/acme", rootTok, "")
	claimAs(t, n, "acme-2", "")

	// Removal: the token stops at once, the claims run on and are listed
	// as a removed tenant's.
	mustStatus(t, n, 204, "DELETE", "/v1/tenants/acme", rootTok, "")
	mustStatus(t, n, 401, "POST", "/v1/claim", "acme-2", `{"template":"default"}`)
	l = tenantList(t, n, "")
	if got := l.Tenants[1]; got != (api.TenantJSON{Name: "acme", Claims: 2, Removed: true}) {
		t.Fatalf("removed acme %+v", got)
	}
	errorIs(t, mustStatus(t, n, 404, "DELETE", "/v1/tenants/acme", rootTok, ""), "unknown tenant")

	// A name is URL-decoded from the path.
	mustStatus(t, n, 204, "PUT", "/v1/tenants/u:42%2Fwest", rootTok, `{"token":"west"}`)
	if l := tenantList(t, n, "?after=b"); !slices.Equal(listNames(l), []string{"u:42/west"}) {
		t.Fatalf("after b: %+v", l)
	}
}

func TestTenantRoutesRefuse(t *testing.T) {
	n := newNode(t, 0, func(o *nodetest.Options) { o.NoExecutors = true })
	for _, rt := range []struct{ method, path, body string }{
		{"GET", "/v1/tenants", ""}, {"PUT", "/v1/tenants", `{"tenants":[]}`}, {"PUT", "/v1/tenants/x", `{"token":"x"}`},
		{"DELETE", "/v1/tenants/a", ""}, {"POST", "/v1/drain", ""}, {"DELETE", "/v1/drain", ""},
	} {
		errorIs(t, mustStatus(t, n, 403, rt.method, rt.path, tokA, rt.body), "operator token required")
	}
	for _, tc := range []struct{ method, path, body, msg string }{
		{"PUT", "/v1/tenants/beta", `{"token":"b","egress":{}}`, "invalid request body"},
		{"PUT", "/v1/tenants/beta", `{"max_claims":1}`, `invalid tenant: tenant "beta" needs a token`},
		{"PUT", "/v1/tenants/beta", `{"token":"` + rootTok + `"}`, "must differ from api_token"},
		{"PUT", "/v1/tenants/beta", `{"token":"` + tokA + `"}`, `token reused by tenant "a"`},
		{"PUT", "/v1/tenants/beta", `{"token":"b","max_claims":-1}`, "negative"},
		{"PUT", "/v1/tenants/beta", `{"token":"b","egress_class":"desk"}`, `invalid tenant: tenant "beta" names unknown egress class "desk"`},
		{"PUT", "/v1/tenants/-bad", `{"token":"b"}`, "invalid tenant: name"},
		{"PUT", "/v1/tenants", `{"tenants":[{"name":"a"},{"name":"a"}]}`, "listed twice"},
		{"PUT", "/v1/tenants", `{"tenants":[{"name":"new"}]}`, "needs a token"},
		{"PUT", "/v1/tenants", `{"tenants":[{"name":"a","token":"x"},{"name":"b","token":"x"}]}`, "token reused"},
		{"PUT", "/v1/tenants", `{"tenants":[],"extra":1}`, "invalid request body"},
		{"GET", "/v1/tenants?limit=0", "", "limit must be 1..10000"},
		{"GET", "/v1/tenants?limit=10001", "", "limit must be 1..10000"},
		{"POST", "/v1/drain", `{"x":1}`, "invalid request body"},
	} {
		resp := mustStatus(t, n, 400, tc.method, tc.path, rootTok, tc.body)
		var e struct{ Error string }
		if json.Unmarshal(resp, &e) != nil || !strings.Contains(e.Error, tc.msg) {
			t.Errorf("%s %s %s: %s, want %q", tc.method, tc.path, tc.body, resp, tc.msg)
		}
	}
	if got := listNames(tenantList(t, n, "")); !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("refused requests changed the set: %v", got)
	}

	// A node without a root token cannot manage tenants: 400 to the
	// tenants that reach the routes.
	open := newNode(t, 0, func(o *nodetest.Options) { o.NoExecutors = true; o.RootToken = "" })
	errorIs(t, mustStatus(t, open, 400, "GET", "/v1/tenants", tokA, ""), "invalid tenant: tenants require api_token")
}

func TestPutTenantsWholeSetAndPaging(t *testing.T) {
	n := newNode(t, 0, func(o *nodetest.Options) { o.NoExecutors = true })
	before := tenantList(t, n, "").Digest
	body := `{"tenants":[{"name":"a"},{"name":"c3","token":"t3","max_claims":3},{"name":"c1","token":"t1"},{"name":"c2","token":"t2"}]}`
	var l api.TenantList
	if err := json.Unmarshal(mustStatus(t, n, 200, "PUT", "/v1/tenants?limit=2", rootTok, body), &l); err != nil {
		t.Fatal(err)
	}
	// b was left out: removed; a kept its token; the answer is the list,
	// paged as asked.
	if !slices.Equal(listNames(l), []string{"a", "c1"}) || l.Next != "c1" || l.Digest == before {
		t.Fatalf("put answer %+v", l)
	}
	mustStatus(t, n, 401, "GET", "/v1/sandboxes", tokB, "")
	mustStatus(t, n, 200, "GET", "/v1/sandboxes", tokA, "")
	mustStatus(t, n, 200, "GET", "/v1/sandboxes", "t3", "")
	p2 := tenantList(t, n, "?limit=2&after="+l.Next)
	if !slices.Equal(listNames(p2), []string{"c2", "c3"}) || p2.Next != "" || p2.Tenants[1].MaxClaims != 3 || p2.Digest != l.Digest {
		t.Fatalf("second page %+v", p2)
	}
	// The same set again changes nothing: same digest, no event.
	seq := n.Log.LastSeq()
	mustStatus(t, n, 200, "PUT", "/v1/tenants", rootTok, `{"tenants":[{"name":"a"},{"name":"c1"},{"name":"c2"},{"name":"c3","max_claims":3}]}`)
	if d := tenantList(t, n, "").Digest; d != l.Digest || n.Log.LastSeq() != seq {
		t.Fatalf("a repeated set: digest %s (was %s), log %d -> %d", d, l.Digest, seq, n.Log.LastSeq())
	}
	// A null list is the empty set, as for the old daemon.
	mustStatus(t, n, 200, "PUT", "/v1/tenants", rootTok, `{"tenants":null}`)
	if got := tenantList(t, n, ""); len(got.Tenants) != 0 {
		t.Fatalf("after an empty set: %+v", got)
	}
}

// Tenants created over the API survive a restart (snapshot + tail) and a
// full replay of the log; the data dir holds no raw token anywhere, the
// config's plaintext token included; the config's tenants no longer apply
// once the API changed the set.
func TestTenantsSurviveRestartAndReplay(t *testing.T) {
	const apiToken, cfgToken = "api-raw-token-5d1f0c9e", "config-raw-token-8a2b7e43"
	dir := t.TempDir()
	start := func(full bool, tenants ...auth.TenantConfig) *nodetest.Node {
		return newNode(t, 0, func(o *nodetest.Options) {
			o.Dir, o.Tenants = dir, tenants
			o.Tune = func(c *node.Config) { c.FullReplay = full }
		})
	}
	n := start(false, auth.TenantConfig{Name: "cfg", Token: cfgToken})
	mustStatus(t, n, 200, "GET", "/v1/sandboxes", cfgToken, "")
	mustStatus(t, n, 204, "PUT", "/v1/tenants/made-by-api", rootTok, `{"token":"`+apiToken+`","max_claims":7}`)
	want := tenantList(t, n, "")
	seq := n.Log.LastSeq()
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	// The config now names another tenant: the API owns the set.
	for _, full := range []bool{false, true} {
		n = start(full, auth.TenantConfig{Name: "ignored", Token: "ignored-token"})
		if full && n.Replayed != int(seq) {
			t.Fatalf("full replay applied %d events of %d", n.Replayed, seq)
		}
		if got := tenantList(t, n, ""); got.Digest != want.Digest || !slices.Equal(listNames(got), []string{"cfg", "made-by-api"}) {
			t.Fatalf("after restart (full replay %v): %+v, want %+v", full, got, want)
		}
		mustStatus(t, n, 200, "GET", "/v1/sandboxes", apiToken, "")
		mustStatus(t, n, 200, "GET", "/v1/sandboxes", cfgToken, "")
		mustStatus(t, n, 401, "GET", "/v1/sandboxes", "ignored-token", "")
		seq = n.Log.LastSeq()
		if err := n.Close(); err != nil {
			t.Fatal(err)
		}
	}
	// The log does hold the tenant (its token's hash): the walk reads what
	// the node wrote.
	hashSeen := false
	files := 0
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		files++
		hashSeen = hashSeen || bytes.Contains(b, []byte(auth.HashToken(apiToken)))
		for _, tok := range []string{apiToken, cfgToken, "ignored-token"} {
			if bytes.Contains(b, []byte(tok)) {
				t.Errorf("%s holds the raw token %q", path, tok)
			}
		}
		return nil
	})
	if err != nil || files < 3 || !hashSeen {
		t.Fatalf("walked %d files (the tenant's hash seen: %v): %v", files, hashSeen, err)
	}
}

// Before the API changes the set, an edited config applies at the next
// start.
func TestConfigTenantsApplyUntilTheAPIChangesThem(t *testing.T) {
	dir := t.TempDir()
	start := func(tenants ...auth.TenantConfig) *nodetest.Node {
		return newNode(t, 0, func(o *nodetest.Options) { o.Dir, o.Tenants, o.NoExecutors = dir, tenants, true })
	}
	n := start(auth.TenantConfig{Name: "one", Token: "one-token"})
	n.Close()
	n = start(auth.TenantConfig{Name: "two", TokenSHA256: auth.HashToken("two-token"), MaxClaims: 4})
	if got := tenantList(t, n, ""); !slices.Equal(listNames(got), []string{"two"}) || got.Tenants[0].MaxClaims != 4 {
		t.Fatalf("after the config changed: %+v", got)
	}
	var capOf int
	n.Engine.View(func(st *fsm.State) { capOf = st.TenantCap("two") })
	if capOf != 4 {
		t.Fatalf("cap %d", capOf)
	}
	mustStatus(t, n, 401, "GET", "/v1/sandboxes", "one-token", "")
	mustStatus(t, n, 200, "GET", "/v1/sandboxes", "two-token", "")
}

// Drain refuses claims with the old status and text, empties the warm
// pools, survives a restart and shows in GET /v1/info; uncordon restores
// claims and refills.
func TestDrainRoutes(t *testing.T) {
	dir := t.TempDir()
	n := newNode(t, 2, func(o *nodetest.Options) { o.Dir = dir })
	live := claimAs(t, n, tokA, "")
	var warmVMs []string
	n.Engine.View(func(st *fsm.State) { p, _ := st.Pool(defKey); warmVMs = p.WarmVMs() })
	var in api.Info
	if err := json.Unmarshal(mustStatus(t, n, 200, "POST", "/v1/drain", rootTok, ""), &in); err != nil {
		t.Fatal(err)
	}
	if !in.Draining || in.Pools[0].Warm != 0 || in.Pools[0].Target != 0 {
		t.Fatalf("drain answer %+v", in)
	}
	// The answer waited for the warm VMs' destruction.
	n.Engine.View(func(st *fsm.State) {
		for _, id := range warmVMs {
			if v, ok := st.VM(id); ok {
				t.Errorf("warm VM %s (%s) left after the drain answered", id, v.Status)
			}
		}
	})
	for _, tok := range []string{rootTok, tokA} {
		errorIs(t, mustStatus(t, n, 429, "POST", "/v1/claim", tok, `{"template":"default"}`), fsm.DrainingMsg)
	}
	mustStatus(t, n, 200, "POST", "/v1/drain", rootTok, "") // idempotent
	// Live claims run on.
	mustStatus(t, n, 200, "POST", "/v1/sandboxes/"+live.ID+"/renew", live.Token, `{"ttl_seconds":600}`)
	settle(t, n)
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}

	n = newNode(t, 0, func(o *nodetest.Options) { o.Dir = dir })
	if err := json.Unmarshal(mustStatus(t, n, 200, "GET", "/v1/info", rootTok, ""), &in); err != nil || !in.Draining {
		t.Fatalf("info after a restart: %+v, %v", in, err)
	}
	mustStatus(t, n, 429, "POST", "/v1/claim", rootTok, `{"template":"default"}`)
	in = api.Info{}
	raw := mustStatus(t, n, 200, "DELETE", "/v1/drain", rootTok, "")
	if err := json.Unmarshal(raw, &in); err != nil || in.Draining || bytes.Contains(raw, []byte("draining")) {
		t.Fatalf("uncordon answer %s", raw)
	}
	claimAs(t, n, tokA, "")
	settle(t, n)
	var warm int
	n.Engine.View(func(st *fsm.State) { warm = st.Info().Pools[0].Warm })
	if warm != 2 {
		t.Fatalf("after uncordon the pool has %d warm VMs, want 2", warm)
	}
	if raw := mustStatus(t, n, 200, "GET", "/v1/info", rootTok, ""); bytes.Contains(raw, []byte("draining")) {
		t.Fatalf("info of an uncordoned node: %s", raw)
	}
}

// PUT /v1/tenants reads its answer's page before it changes the set: a bad
// ?limit= is 400 with nothing changed, not a 400 for a change made.
func TestPutTenantsBadPageChangesNothing(t *testing.T) {
	n := newNode(t, 0, func(o *nodetest.Options) { o.NoExecutors = true })
	before, seq := tenantList(t, n, ""), n.Log.LastSeq()
	for _, q := range []string{"?limit=0", "?limit=10001", "?limit=x"} {
		errorIs(t, mustStatus(t, n, 400, "PUT", "/v1/tenants"+q, rootTok, `{"tenants":[{"name":"z","token":"tz"}]}`), "limit must be 1..10000")
	}
	if got := tenantList(t, n, ""); got.Digest != before.Digest || n.Log.LastSeq() != seq {
		t.Fatalf("after refused puts: digest %s (was %s), log %d -> %d", got.Digest, before.Digest, seq, n.Log.LastSeq())
	}
	mustStatus(t, n, 401, "GET", "/v1/sandboxes", "tz", "")
}
