package api_test

import (
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sbxlog/sbxlog/cmd/sandboxd/node"
	"github.com/sbxlog/sbxlog/cmd/sandboxd/node/nodetest"
	"github.com/sbxlog/sbxlog/projections/api"
	"github.com/sbxlog/sbxlog/projections/openapi/openapitest"
)

// Caller kinds of the auth matrix.
const (
	cNone         = "no token"
	cWrong        = "wrong token"
	cNotBearer    = "basic scheme"
	cRoot         = "root"
	cTenantA      = "tenant a (owner)"
	cTenantB      = "tenant b"
	cSandboxOwn   = "sandbox token of {id}"
	cSandboxOther = "sandbox token of another sandbox"
)

var matrixCallers = []string{cNone, cWrong, cNotBearer, cRoot, cTenantA, cTenantB, cSandboxOwn, cSandboxOther}

// successStatus is what an allowed caller gets per route. A route missing
// here must still answer 2xx to allowed callers, so a new route is covered
// by the matrix without editing this table.
var successStatus = map[string]int{
	"POST /v1/claim":                           http.StatusOK,
	"GET /v1/sandboxes":                        http.StatusOK,
	"GET /v1/sandboxes/{id}":                   http.StatusOK,
	"POST /v1/sandboxes/{id}/release":          http.StatusNoContent,
	"POST /v1/sandboxes/{id}/hibernate":        http.StatusNoContent,
	"POST /v1/sandboxes/{id}/wake":             http.StatusNoContent,
	"POST /v1/sandboxes/{id}/renew":            http.StatusOK,
	"GET /v1/sandboxes/{id}/owner":             http.StatusOK,
	"GET /v1/pools":                            http.StatusOK,
	"PUT /v1/pools":                            http.StatusOK,
	"GET /v1/info":                             http.StatusOK,
	"GET /v1/events":                           http.StatusOK,
	"GET /healthz":                             http.StatusOK,
	"GET /metrics":                             http.StatusOK,
	"GET /v1/tenants":                          http.StatusOK,
	"PUT /v1/tenants":                          http.StatusOK,
	"PUT /v1/tenants/{name}":                   http.StatusNoContent,
	"DELETE /v1/tenants/{name}":                http.StatusNoContent,
	"POST /v1/drain":                           http.StatusOK,
	"DELETE /v1/drain":                         http.StatusOK,
	"GET /v1/sandboxes/{id}/env":               http.StatusOK,
	"PUT /v1/sandboxes/{id}/env":               http.StatusNoContent,
	"PATCH /v1/sandboxes/{id}/env":             http.StatusNoContent,
	"GET /v1/egress/classes":                   http.StatusOK,
	"PUT /v1/egress/classes/{name}":            http.StatusNoContent,
	"DELETE /v1/egress/classes/{name}":         http.StatusNoContent,
	"POST /v1/sandboxes/{id}/exec":             http.StatusOK,
	"POST /v1/sandboxes/{id}/preview":          http.StatusOK,
	"PUT /v1/sandboxes/{id}/instance-metadata": http.StatusNoContent,

	// Checkpoints.
	"POST /v1/sandboxes/{id}/checkpoint": http.StatusOK,
	"POST /v1/sandboxes/{id}/fork":       http.StatusOK,
	"GET /v1/checkpoints":                http.StatusOK,
	// The matrix's {id} is a sandbox's, which names no checkpoint: the
	// allowed callers get the old daemon's unknown checkpoint (their
	// successes are TestCheckpointRoutes').
	"DELETE /v1/checkpoints/{id}":     http.StatusNotFound,
	"POST /v1/checkpoints/{id}/claim": http.StatusNotFound,
	"GET /v1/checkpoints/{id}/blob":   http.StatusNotFound,
	"HEAD /v1/checkpoints/{id}/blob":  http.StatusNotFound,
	"POST /v1/pools/rebuild":          http.StatusNoContent,
	"GET /v1/store":                   http.StatusOK,
}

// stateRoutes are routes whose allowed callers get an answer that depends
// on the state the matrix leaves (a template promoted by one caller is
// another's 409 or 404): for them the matrix checks the authorisation only
// (never 401 or 403) and a JSON error body; TestPromoteTemplates checks
// their answers.
var stateRoutes = map[string]bool{
	"POST /v1/sandboxes/{id}/promote": true,
	"DELETE /v1/templates":            true,
	"PUT /v1/templates/labels":        true,
}

// routeQuery is a query per route that needs one.
var routeQuery = map[string]string{
	"DELETE /v1/templates":     "?template=matrix-p",
	"PUT /v1/templates/labels": "?template=matrix-p",
}

// routeBody is a valid body per route, so that a denied request is denied
// by authorisation, not by validation.
var routeBody = map[string]string{
	"POST /v1/claim":                `{"template":"default"}`,
	"POST /v1/sandboxes/{id}/renew": `{"ttl_seconds":600}`,
	"PUT /v1/pools":                 `{"pools":[{"template":"default","net":"none","size":"small","warm":4}]}`,
	// The whole set keeps tenants a and b (and matrixTenant, which the
	// {name} routes delete and put back).
	"PUT /v1/tenants":        `{"tenants":[{"name":"a"},{"name":"b"},{"name":"` + matrixTenant + `"}]}`,
	"PUT /v1/tenants/{name}": `{"token":"matrix-tenant-token","max_claims":2}`,
	// The {name} routes delete the class matrixTenant and put it back.
	"PUT /v1/egress/classes/{name}":   `{"egress":{"allow":[{"host":"*"}]}}`,
	"PUT /v1/sandboxes/{id}/env":      `{"env":{"A":{"value":"1"},"B":{"value":"s","guest":false}}}`,
	"PATCH /v1/sandboxes/{id}/env":    `{"env":{"A":null}}`,
	"POST /v1/sandboxes/{id}/exec":    `{"argv":["true"]}`,
	"POST /v1/sandboxes/{id}/preview": `{"port":80}`,

	// Checkpoints.
	"POST /v1/sandboxes/{id}/fork":    `{"count":1}`,
	"POST /v1/sandboxes/{id}/promote": `{"template":"matrix-p"}`,
	"PUT /v1/templates/labels":        `{"labels":{"k":"v"}}`,
	"POST /v1/pools/rebuild":          `{"template":"default"}`,
	// volumes.go: an empty attach and detach change nothing.
	"POST /v1/sandboxes/{id}/volumes/attach":   `{"volumes":[]}`,
	"POST /v1/sandboxes/{id}/volumes/detach":   `{"names":[]}`,
	"PUT /v1/sandboxes/{id}/instance-metadata": `{"region":"local"}`,
}

// matrixTenant is the tenant the matrix puts in place of {name}.
const matrixTenant = "matrix-t"

// sandboxVerbRoutes are the old daemon's sandbox verbs: there a token that
// is no credential for the sandbox named is the 404 of an unknown id, not a
// 401 (only a missing bearer token is 401).
var sandboxVerbRoutes = map[string]bool{
	"POST /v1/sandboxes/{id}/release": true, "POST /v1/sandboxes/{id}/hibernate": true,
	"POST /v1/sandboxes/{id}/wake": true, "POST /v1/sandboxes/{id}/renew": true,
	"GET /v1/sandboxes/{id}/owner": true,
}

// expectStatus is the status caller c must get on route rt, derived from
// the route's declared Auth and server.go's dispatch / claims.go's visible:
// no or unknown token 401; a sandbox token is only recognised on its own
// sandbox's routes (elsewhere it is an unknown token: 401); a known caller
// whose kind the route does not allow 403; a tenant naming another
// tenant's sandbox 404 (as for an id that does not exist). On the sandbox
// verbs an unknown token, another sandbox's included, is that 404 too.
func expectStatus(rt api.Route, c string) (status int, allowed bool) {
	if upgradeRoutes[rt.Method+" "+rt.Path] {
		return expectUpgrade(c)
	}
	if rt.Method+" "+rt.Path == "POST /v1/sandboxes/{id}/exec" {
		return expectSandboxOnly(c, successStatus[rt.Method+" "+rt.Path])
	}
	kinds := strings.Split(rt.Auth, "|")
	has := func(k string) bool { return slices.Contains(kinds, k) }
	ok := successStatus[rt.Method+" "+rt.Path]
	hasID := strings.Contains(rt.Path, "{id}")
	if rt.Auth == "none" {
		return ok, true
	}
	switch c {
	case cWrong, cSandboxOther:
		if sandboxVerbRoutes[rt.Method+" "+rt.Path] {
			return http.StatusNotFound, false
		}
		return http.StatusUnauthorized, false
	case cNone, cNotBearer:
		return http.StatusUnauthorized, false
	case cSandboxOwn:
		switch {
		case !hasID:
			return http.StatusUnauthorized, false
		case !has("sandbox"):
			return http.StatusForbidden, false
		}
		return ok, true
	case cRoot:
		if !has("root") {
			return http.StatusForbidden, false
		}
		return ok, true
	case cTenantA, cTenantB:
		switch {
		case !has("tenant"):
			return http.StatusForbidden, false
		case hasID && c == cTenantB:
			return http.StatusNotFound, false
		}
		return ok, true
	}
	panic("unknown caller " + c)
}

// upgradeRoutes are the data plane's upgrade routes. They answer as the
// old daemon did (a token that is not the sandbox's own is 404, like an
// unknown id), and they check the Upgrade header before the token: their full matrix, upgrade included, is in relay_test.go.
var upgradeRoutes = map[string]bool{
	"GET /v1/sandboxes/{id}/agent":        true,
	"GET /v1/sandboxes/{id}/ports/{port}": true,
}

// expectUpgrade is what caller c gets on an upgrade route from the matrix,
// which sends no Upgrade header: no bearer token is 401, any token 426.
func expectUpgrade(c string) (int, bool) {
	switch c {
	case cNone, cNotBearer:
		return http.StatusUnauthorized, false
	}
	return http.StatusUpgradeRequired, false
}

// expectSandboxOnly is what caller c gets on a data-plane route only the
// sandbox's own token opens (the buffered exec): no bearer token is 401,
// any other token 404.
func expectSandboxOnly(c string, ok int) (int, bool) {
	switch c {
	case cNone, cNotBearer:
		return http.StatusUnauthorized, false
	case cSandboxOwn:
		return ok, true
	}
	return http.StatusNotFound, false
}

// authHeader is the Authorization header caller c sends for sandbox sb
// (other is another tenant's sandbox).
func authHeader(c string, sb, other api.ClaimResponse) string {
	switch c {
	case cNone:
		return ""
	case cWrong:
		return "Bearer not-a-token"
	case cNotBearer:
		return "Basic " + rootTok // the right secret in the wrong scheme
	case cRoot:
		return "Bearer " + rootTok
	case cTenantA:
		return "Bearer " + tokA
	case cTenantB:
		return "Bearer " + tokB
	case cSandboxOwn:
		return "Bearer " + sb.Token
	case cSandboxOther:
		return "Bearer " + other.Token
	}
	panic("unknown caller " + c)
}

// do sends one request with the Authorization header (none when empty)
// and the extra header name, value pairs.
func do(t *testing.T, n *nodetest.Node, method, path, header string, body []byte, extra ...string) (int, http.Header, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, n.URL+path, bytesOrNil(body))
	if err != nil {
		t.Fatal(err)
	}
	if header != "" {
		req.Header.Set("Authorization", header)
	}
	for i := 0; i+1 < len(extra); i += 2 {
		req.Header.Set(extra[i], extra[i+1])
	}
	resp, err := openapitest.Client(t, nil).Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		return resp.StatusCode, resp.Header, nil // a live stream: headers only
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: read body: %v", method, path, err)
	}
	return resp.StatusCode, resp.Header, b
}

// TestAuthMatrix runs every registered route with every kind of caller and
// checks the exact status. Denied requests carry a valid body and must
// change nothing; allowed ones on a sandbox get a fresh sandbox of tenant a
// each, since release and hibernate change it.
func TestAuthMatrix(t *testing.T) {
	n := newNode(t, 8, func(o *nodetest.Options) {
		o.Tune = func(c *node.Config) { c.PreviewListen = "127.0.0.1:0" } // every route answers
	})
	routes := n.Server.Routes()
	if len(routes) < len(successStatus) {
		t.Fatalf("Routes() lists %d routes, the table knows %d", len(routes), len(successStatus))
	}
	shared := claimAs(t, n, tokA, `,"claim_ref":"a-ref","metadata":{"owner":"a"}`)
	other := claimAs(t, n, tokB, `,"claim_ref":"b-ref"`)
	before := getSandbox(t, n, shared.ID)
	if st, b := call(t, n, "PUT", "/v1/tenants/"+matrixTenant, rootTok, []byte(`{"token":"matrix-tenant-token"}`)); st != http.StatusNoContent {
		t.Fatalf("put %s: %d %s", matrixTenant, st, b)
	}
	if st, b := call(t, n, "PUT", "/v1/egress/classes/"+matrixTenant, rootTok, []byte(`{"egress":{"allow":[]}}`)); st != http.StatusNoContent {
		t.Fatalf("put class %s: %d %s", matrixTenant, st, b)
	}

	for _, rt := range routes {
		for _, c := range matrixCallers {
			want, allowed := expectStatus(rt, c)
			sb := shared
			if allowed && strings.Contains(rt.Path, "{id}") {
				sb = claimAs(t, n, tokA, "")
			}
			path := strings.NewReplacer("{id}", sb.ID, "{name}", matrixTenant, "{file}", "app.js").Replace(rt.Path) + routeQuery[rt.Method+" "+rt.Path]
			var body []byte
			if b, ok := routeBody[rt.Method+" "+rt.Path]; ok {
				body = []byte(b)
			}
			st, hdr, resp := do(t, n, rt.Method, path, authHeader(c, sb, other), body)
			name := rt.Method + " " + rt.Path + " as " + c
			switch {
			case allowed && stateRoutes[rt.Method+" "+rt.Path]:
				if st == http.StatusUnauthorized || st == http.StatusForbidden || st >= 500 {
					t.Errorf("%s: %d %s, want it past authorisation", name, st, resp)
				}
			case want == 0 && allowed:
				if st < 200 || st > 299 {
					t.Errorf("%s: %d %s, want 2xx (route not in successStatus)", name, st, resp)
				}
			case st != want:
				t.Errorf("%s: %d %s, want %d", name, st, resp, want)
			}
			if (!allowed || st >= 400) && rt.Method != http.MethodHead { // a HEAD answer has no body
				var e struct{ Error string }
				if hdr.Get("Content-Type") != "application/json" || json.Unmarshal(resp, &e) != nil || e.Error == "" {
					t.Errorf("%s: error body %q (%s), want JSON {\"error\": ...}", name, resp, hdr.Get("Content-Type"))
				}
			}
		}
		if rt.Method == "POST" && rt.Path == "/v1/drain" {
			// The routes after it claim sandboxes: uncordon.
			if st, b := call(t, n, "DELETE", "/v1/drain", rootTok, nil); st != http.StatusOK {
				t.Fatalf("uncordon: %d %s", st, b)
			}
		}
	}
	// No denied request touched tenant a's shared sandbox.
	if after := getSandbox(t, n, shared.ID); after.State != "running" || after.Deadline != before.Deadline {
		t.Fatalf("denied requests changed sandbox %s: before %+v, after %+v", shared.ID, before, after)
	}
}

func getSandbox(t *testing.T, n *nodetest.Node, id string) api.Sandbox {
	t.Helper()
	st, b := call(t, n, "GET", "/v1/sandboxes/"+id, rootTok, nil)
	var sb api.Sandbox
	if st != http.StatusOK || json.Unmarshal(b, &sb) != nil {
		t.Fatalf("GET sandbox %s: %d %s", id, st, b)
	}
	return sb
}

// TestTenantIsolation: tenant b never sees tenant a's sandboxes through any
// read path (list with and without filters, get, owner, and the lifecycle
// routes, which must not reveal that the id exists), and an unknown id
// answers exactly like a foreign one: GET with a 404 naming the id, the
// sandbox verbs with the old daemon's exact 404 bodies.
func TestTenantIsolation(t *testing.T) {
	n := newNode(t, 4, nil)
	a := claimAs(t, n, tokA, `,"claim_ref":"shared-ref","metadata":{"team":"x"}`)
	b := claimAs(t, n, tokB, `,"claim_ref":"shared-ref","metadata":{"team":"x"}`)
	r := claimAs(t, n, rootTok, `,"claim_ref":"shared-ref"`)

	list := func(tok, query string) []string {
		st, body := call(t, n, "GET", "/v1/sandboxes"+query, tok, nil)
		var out struct{ Sandboxes []api.Sandbox }
		if st != http.StatusOK || json.Unmarshal(body, &out) != nil {
			t.Fatalf("list %s: %d %s", query, st, body)
		}
		var ids []string
		for _, s := range out.Sandboxes {
			ids = append(ids, s.ID)
		}
		slices.Sort(ids)
		return ids
	}
	sorted := func(ids ...string) []string { slices.Sort(ids); return ids }
	for _, q := range []string{"", "?claim_ref=shared-ref", "?metadata=team=x", "?state=running"} {
		if got := list(tokA, q); !slices.Equal(got, []string{a.ID}) {
			t.Errorf("tenant a list %q = %v, want [%s]", q, got, a.ID)
		}
		if got := list(tokB, q); !slices.Equal(got, []string{b.ID}) {
			t.Errorf("tenant b list %q = %v, want [%s]", q, got, b.ID)
		}
	}
	if got, want := list(rootTok, "?claim_ref=shared-ref"), sorted(a.ID, b.ID, r.ID); !slices.Equal(got, want) {
		t.Errorf("root list = %v, want %v", got, want)
	}

	unknown := "sb_0123456789abcdef"
	for _, id := range []string{a.ID, r.ID, unknown} {
		for _, rt := range []struct{ method, suffix, body, exact string }{
			{"GET", "", "", `{"error":"unknown sandbox"}`}, {"GET", "/owner", "", `{"error":"not owned here"}`},
			{"POST", "/release", "", `{"error":"unknown sandbox"}`}, {"POST", "/hibernate", "", `{"error":"unknown sandbox"}`},
			{"POST", "/wake", "", `{"error":"unknown sandbox"}`}, {"POST", "/renew", `{"ttl_seconds":60}`, `{"error":"unknown sandbox"}`},
		} {
			var body []byte
			if rt.body != "" {
				body = []byte(rt.body)
			}
			st, resp := call(t, n, rt.method, "/v1/sandboxes/"+id+rt.suffix, tokB, body)
			var e struct{ Error string }
			switch {
			case rt.exact != "":
				if st != http.StatusNotFound || strings.TrimSpace(string(resp)) != rt.exact {
					t.Errorf("tenant b %s %s%s: %d %s, want 404 %s", rt.method, id, rt.suffix, st, resp, rt.exact)
				}
			case st != http.StatusNotFound || json.Unmarshal(resp, &e) != nil || !strings.Contains(e.Error, id):
				t.Errorf("tenant b %s %s%s: %d %s, want 404 naming the id", rt.method, id, rt.suffix, st, resp)
			}
			if strings.Contains(string(resp), "tenant") || strings.Contains(string(resp), "a-ref") {
				t.Errorf("tenant b %s %s%s: reply leaks ownership: %s", rt.method, id, rt.suffix, resp)
			}
		}
	}
	// a's sandbox is untouched by b's attempts.
	if sb := getSandbox(t, n, a.ID); sb.State != "running" || sb.Tenant != "a" {
		t.Fatalf("tenant a's sandbox after b's attempts: %+v", sb)
	}
	// A sandbox token is bound to its sandbox: a's token on b's sandbox is
	// not a credential at all.
	st, _, _ := do(t, n, "GET", "/v1/sandboxes/"+b.ID, "Bearer "+a.Token, nil)
	if st != http.StatusUnauthorized {
		t.Errorf("a's sandbox token on b's sandbox: %d, want 401", st)
	}
	// The VM view is root-only: it names every VM and claim.
	if st, _ := call(t, n, "GET", "/v1/events?view=vms", tokB, nil); st != http.StatusForbidden {
		t.Errorf("tenant GET /v1/events?view=vms: %d, want 403", st)
	}
	if st, _ := call(t, n, "GET", "/v1/events?view=vms", rootTok, nil); st != http.StatusOK {
		t.Errorf("root GET /v1/events?view=vms: %d, want 200", st)
	}
}

// TestEventsTenantIsolation reads /v1/events as tenants a and b and as root
// while both tenants run sandboxes through claim, hibernate, wake and
// release: each tenant sees exactly its own claims' events, root sees all.
// Each stream is read up to a marker claim of its own made after everything
// else, so every earlier event has passed the stream's filter by then.
func TestEventsTenantIsolation(t *testing.T) {
	n := newNode(t, 4, nil)
	from := n.Log.LastSeq() + 1
	q := "/v1/events?from=" + strconv.FormatUint(from, 10)
	streamA, streamB, streamRoot := stream(t, n, q, tokA), stream(t, n, q, tokB), stream(t, n, q, rootTok)

	lifecycle := func(tok string) string {
		c := claimAs(t, n, tok, "")
		for _, step := range []struct{ op, state string }{{"hibernate", "hibernated"}, {"wake", "running"}, {"release", "released"}} {
			if st, b := call(t, n, "POST", "/v1/sandboxes/"+c.ID+"/"+step.op, tok, nil); st != http.StatusNoContent {
				t.Fatalf("%s %s: %d %s", step.op, c.ID, st, b)
			}
			waitState(t, n, c.ID, step.state)
		}
		return c.ID
	}
	a1, b1 := lifecycle(tokA), lifecycle(tokB)
	a2 := claimAs(t, n, tokA, "").ID // interleaved, still live
	b2 := lifecycle(tokB)
	markA, markB := claimAs(t, n, tokA, "").ID, claimAs(t, n, tokB, "").ID

	until := func(id string) func(api.EventJSON) bool {
		return func(e api.EventJSON) bool { return e.Type == "claim_created" && e.Aggregate.ID == id }
	}
	const wait = 30 * time.Second
	gotA := collect(t, streamA, wait, until(markA))
	gotB := collect(t, streamB, wait, until(markB))
	gotRoot := collect(t, streamRoot, wait, until(markB))

	check := func(who string, got []api.EventJSON, mine, theirs []string) {
		seen := map[string]map[string]bool{}
		for _, e := range got {
			if e.Aggregate.Kind != "claim" || !slices.Contains(mine, e.Aggregate.ID) {
				t.Errorf("%s saw event %d %s about %s %s", who, e.Seq, e.Type, e.Aggregate.Kind, e.Aggregate.ID)
			}
			for _, id := range theirs {
				if strings.Contains(string(e.Payload), id) {
					t.Errorf("%s saw event %d %s mentioning %s", who, e.Seq, e.Type, id)
				}
			}
			if seen[e.Aggregate.ID] == nil {
				seen[e.Aggregate.ID] = map[string]bool{}
			}
			seen[e.Aggregate.ID][e.Type] = true
		}
		for _, id := range mine {
			if !seen[id]["claim_created"] {
				t.Errorf("%s did not see claim_created of its own %s (saw %v)", who, id, seen[id])
			}
		}
	}
	check("tenant a", gotA, []string{a1, a2, markA}, []string{b1, b2, markB})
	check("tenant b", gotB, []string{b1, b2, markB}, []string{a1, a2, markA})
	// A full lifecycle shows up whole for its owner.
	for _, want := range []string{"claim_created", "claim_released"} {
		found := false
		for _, e := range gotA {
			found = found || (e.Aggregate.ID == a1 && e.Type == want)
		}
		if !found {
			t.Errorf("tenant a missed %s of %s", want, a1)
		}
	}
	// Root sees every claim, and the stream is the log: contiguous seqs.
	rootIDs := map[string]bool{}
	for i, e := range gotRoot {
		rootIDs[e.Aggregate.ID] = true
		if i > 0 && e.Seq != gotRoot[i-1].Seq+1 {
			t.Fatalf("root stream gap: %d after %d", e.Seq, gotRoot[i-1].Seq)
		}
	}
	for _, id := range []string{a1, a2, b1, b2, markA, markB} {
		if !rootIDs[id] {
			t.Errorf("root did not see %s", id)
		}
	}
}
