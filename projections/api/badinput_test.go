package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/sbxlog/sbxlog/cmd/sandboxd/node/nodetest"
	"github.com/sbxlog/sbxlog/projections/api"
	"github.com/sbxlog/sbxlog/projections/openapi/openapitest"
)

// badInput is one row of the bad-input table.
type badInput struct {
	name         string
	method, path string // path may hold {id}: a live sandbox of the root
	header       map[string]string
	body         string
	status       int
	// invalidBody: the error is the old daemon's "invalid request body".
	invalidBody bool
	// contains must appear in the error message.
	contains string
}

func claimRows() []badInput {
	row := func(name, body string, status int, invalid bool, contains string) badInput {
		return badInput{name: "claim: " + name, method: "POST", path: "/v1/claim", body: body, status: status, invalidBody: invalid, contains: contains}
	}
	return []badInput{
		row("malformed JSON", `{"template":`, 400, true, ""),
		row("not an object", `["default"]`, 400, true, ""),
		row("wrong type", `{"template":7}`, 400, true, ""),
		row("unknown key", `{"template":"default","tempalte":"x"}`, 400, true, "tempalte"),
		row("empty body", ``, 400, true, "empty"),
		row("trailing data", `{"template":"default"}{"template":"default"}`, 400, true, "trailing"),
		row("null", `null`, 400, false, "template"),
		row("ttl overflow", `{"template":"default","ttl_seconds":99999999999999999999}`, 400, true, ""),
		row("ttl float", `{"template":"default","ttl_seconds":1.5}`, 400, true, ""),
		row("template missing", `{"net":"none"}`, 400, false, "template"),
		row("template leading dash", `{"template":"-bad"}`, 400, false, "template"),
		row("template with space", `{"template":"a b"}`, 400, false, "template"),
		row("template too long", `{"template":"`+strings.Repeat("t", 64)+`"}`, 400, false, "template"),
		row("template traversal", `{"template":"../etc"}`, 400, false, "template"),
		row("net unknown", `{"template":"default","net":"bridge"}`, 400, false, "net"),
		row("size unknown", `{"template":"default","size":"huge"}`, 400, false, "size"),
		row("metadata empty key", `{"template":"default","metadata":{"":"v"}}`, 400, false, "metadata"),
		row("volume not in the catalog", `{"template":"default","volumes":[{"name":"data"}]}`, 400, false, "unknown or not available"),
		row("volume bad name", `{"template":"default","volumes":[{"name":"Data"}]}`, 400, false, "invalid volume request"),
		row("volume mount in the OS tree", `{"template":"default","volumes":[{"name":"data","mount":"/etc/data"}]}`, 400, false, "outside the guest OS tree"),
		row("volume unknown field", `{"template":"default","volumes":[{"name":"data","path":"/host"}]}`, 400, false, "unknown field"),
		row("volumes_attach_only", `{"template":"default","volumes_attach_only":true}`, 400, false, "volumes_attach_only"),
		row("on_expire archive", `{"template":"default","on_expire":"archive"}`, 400, false, "archive"),
		row("on_expire unknown", `{"template":"default","on_expire":"keep"}`, 400, false, "must be destroy or archive"),
		row("env guest null", `{"template":"default","env":{"A":{"value":"1","guest":null}}}`, 400, false, "guest must be true or false"),
		row("env entry unknown field", `{"template":"default","env":{"A":{"value":"1","secret":true}}}`, 400, false, "unknown field"),
		row("env null entry", `{"template":"default","env":{"A":null}}`, 400, false, "only PATCH removes"),
		row("env bad name", `{"template":"default","env":{"1A":{"value":"1"}}}`, 400, false, "must match"),
		row("env control character", `{"template":"default","env":{"A":{"value":"a\u0000"}}}`, 400, false, "control character"),
		row("env inject on a guest entry", `{"template":"default","env":{"A":{"value":"1","inject":{"hosts":["a.com"],"header":"X"}}}}`, 400, false, "inject needs guest: false"),
		row("env inject not intercepted", `{"template":"default","env":{"A":{"value":"1","guest":false,"inject":{"hosts":["a.com"],"header":"X"}}}}`, 400, false, "a.com is not intercepted"),
		row("require_promoted", `{"template":"default","require_promoted":true}`, 404, false, "unknown template"),
		row("egress not a bool", `{"template":"default","egress":"yes"}`, 400, true, ""),
		row("metadata not strings", `{"template":"default","metadata":{"k":1}}`, 400, true, ""),
		row("claim_ref too long", `{"template":"default","claim_ref":"`+strings.Repeat("r", 10_000)+`"}`, 400, false, "claim_ref"),
		row("oversize body", `{"template":"default","claim_ref":"`+strings.Repeat("x", api.MaxBody)+`"}`, 400, true, "body over"),
	}
}

func poolsRows() []badInput {
	row := func(name, body string, status int, invalid bool, contains string) badInput {
		return badInput{name: "put pools: " + name, method: "PUT", path: "/v1/pools", body: body, status: status, invalidBody: invalid, contains: contains}
	}
	pool := func(fields string) string {
		return `{"pools":[{"template":"default","net":"none","size":"small",` + fields + `}]}`
	}
	return []badInput{
		row("malformed JSON", `{"pools":[`, 400, true, ""),
		row("unknown top-level key", `{"pools":[],"drain":true}`, 400, true, "drain"),
		row("unknown pool key", pool(`"warm":1,"wram":2`), 400, true, "wram"),
		row("pools missing", `{}`, 400, true, "pools"),
		row("pools null", `{"pools":null}`, 400, true, "pools"),
		row("pools not a list", `{"pools":{"template":"default"}}`, 400, true, ""),
		row("warm negative", pool(`"warm":-1`), 400, false, "warm"),
		row("warm over max", pool(`"warm":10001`), 400, false, "warm"),
		row("warm_max below warm", pool(`"warm":4,"warm_max":2`), 400, false, "warm_max"),
		row("warm_max over max", pool(`"warm":4,"warm_max":10001`), 400, false, "warm_max"),
		row("idle negative", pool(`"warm":1,"idle_hibernate_seconds":-5`), 400, false, "idle_hibernate_seconds"),
		row("archive_after_seconds", pool(`"warm":1,"archive_after_seconds":600`), 400, false, "archive_after_seconds is not supported"),
		row("archive_delete_after_seconds", pool(`"warm":1,"archive_delete_after_seconds":600`), 400, false, "archive_delete_after_seconds is not supported"),
		row("egress rule without a host", pool(`"warm":1,"egress":{"allow":[{"host":""}]}`), 400, false, "allow[0]: host must not be empty"),
		row("egress unknown secret", pool(`"warm":1,"egress":{"allow":[{"host":"*","secret":"gh"}]}`), 400, false, `unknown secret "gh"`),
		row("egress intercept without a CA", pool(`"warm":1,"egress":{"allow":[{"host":"*","intercept":true}]}`), 400, false, "intercept needs egress_ca"),
		row("egress intercept not a mode", pool(`"warm":1,"egress":{"allow":[{"host":"*","intercept":"yes"}]}`), 400, false, `intercept must be true, false or "inject"`),
		row("egress unknown field", pool(`"warm":1,"egress":{"allow":[],"socks":true}`), 400, true, ""),
		row("bad template", `{"pools":[{"template":"a b","warm":1}]}`, 400, false, "template"),
		row("bad net", `{"pools":[{"template":"default","net":"bridge","warm":1}]}`, 400, false, "net"),
		row("bad size", `{"pools":[{"template":"default","size":"tiny","warm":1}]}`, 400, false, "size"),
		row("listed twice", `{"pools":[{"template":"default","warm":1},{"template":"default","warm":2}]}`, 400, false, "twice"),
		row("oversize body", `{"pools":[],"x":"`+strings.Repeat("x", api.MaxBody)+`"}`, 400, true, "body over"),
	}
}

func otherRows() []badInput {
	const unknown = "/v1/sandboxes/sb_0123456789abcdef"
	return []badInput{
		{name: "renew: on_expire archive", method: "POST", path: "/v1/sandboxes/{id}/renew", body: `{"ttl_seconds":60,"on_expire":"archive"}`, status: 400, contains: "archive"},
		{name: "renew: on_expire unknown", method: "POST", path: "/v1/sandboxes/{id}/renew", body: `{"on_expire":"keep"}`, status: 400, contains: "on_expire"},
		{name: "renew: ttl not a number", method: "POST", path: "/v1/sandboxes/{id}/renew", body: `{"ttl_seconds":"60"}`, status: 400, invalidBody: true},
		{name: "renew: unknown key", method: "POST", path: "/v1/sandboxes/{id}/renew", body: `{"ttl":60}`, status: 400, invalidBody: true},
		{name: "renew: malformed", method: "POST", path: "/v1/sandboxes/{id}/renew", body: `{`, status: 400, invalidBody: true},
		{name: "renew: unknown id", method: "POST", path: unknown + "/renew", body: `{"ttl_seconds":60}`, status: 404, contains: "unknown sandbox"},
		{name: "release: body with unknown key", method: "POST", path: "/v1/sandboxes/{id}/release", body: `{"force":true}`, status: 400, invalidBody: true},
		{name: "release: oversize body", method: "POST", path: "/v1/sandboxes/{id}/release", body: `"` + strings.Repeat("x", api.MaxBody) + `"`, status: 400, invalidBody: true},
		{name: "release: unknown id", method: "POST", path: unknown + "/release", status: 404, contains: "unknown sandbox"},
		{name: "hibernate: unknown id", method: "POST", path: unknown + "/hibernate", status: 404},
		{name: "wake: unknown id", method: "POST", path: unknown + "/wake", status: 404},
		{name: "get: unknown id", method: "GET", path: unknown, status: 404},
		{name: "get: malformed id", method: "GET", path: "/v1/sandboxes/not-an-id", status: 404},
		{name: "owner: unknown id", method: "GET", path: unknown + "/owner", status: 404},
		{name: "list: metadata filter without =", method: "GET", path: "/v1/sandboxes?metadata=team", status: 400, contains: "metadata"},
		{name: "list: metadata filter with an empty key", method: "GET", path: "/v1/sandboxes?metadata==a", status: 400, contains: "empty key"},
		{name: "list: metadata filter key twice", method: "GET", path: "/v1/sandboxes?metadata=team%3Da&metadata=team%3Db", status: 400, contains: "twice"},
		{name: "list: unknown state", method: "GET", path: "/v1/sandboxes?state=bogus", status: 400, contains: "unknown state"},
		{name: "events: bad from", method: "GET", path: "/v1/events?from=abc", status: 400, contains: "from"},
		{name: "events: bad Last-Event-ID", method: "GET", path: "/v1/events", header: map[string]string{"Last-Event-ID": "x"}, status: 400, contains: "Last-Event-ID"},
		{name: "events: unknown view", method: "GET", path: "/v1/events?view=all", status: 400, contains: "view"},
		{name: "wrong method: GET claim", method: "GET", path: "/v1/claim", status: 405, contains: "POST"},
		{name: "wrong method: DELETE sandbox", method: "DELETE", path: "/v1/sandboxes/{id}", status: 405},
		{name: "wrong method: POST pools", method: "POST", path: "/v1/pools", body: `{"pools":[]}`, status: 405, contains: "GET, PUT"},
		{name: "wrong method: PUT info", method: "PUT", path: "/v1/info", status: 405},
		{name: "wrong method: GET release", method: "GET", path: "/v1/sandboxes/{id}/release", status: 405},
		{name: "unknown route", method: "GET", path: "/v2/claim", status: 404, contains: "no route"},
		{name: "unknown sandbox sub-route", method: "POST", path: "/v1/sandboxes/{id}/destroy", status: 404, contains: "no route"},
		{name: "empty sandbox id", method: "GET", path: "/v1/sandboxes/", status: 404},
	}
}

// TestBadInput: every row is a 4xx with a JSON {"error": ...} body, the
// exact status, and nothing changed on the node. Rows go through a real
// loopback HTTP connection, oversize bodies included.
func TestBadInput(t *testing.T) {
	n := newNode(t, 2, nil)
	sb := claimAs(t, n, rootTok, "")
	before := getSandbox(t, n, sb.ID)
	settle(t, n)
	seq := n.Log.LastSeq()
	rows := append(append(claimRows(), poolsRows()...), otherRows()...)
	for _, r := range rows {
		t.Run(r.name, func(t *testing.T) {
			req, err := http.NewRequest(r.method, n.URL+strings.ReplaceAll(r.path, "{id}", sb.ID), strings.NewReader(r.body))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Authorization", "Bearer "+rootTok)
			for k, v := range r.header {
				req.Header.Set(k, v)
			}
			resp, err := openapitest.Client(t, nil).Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var body bytes.Buffer
			if _, err := body.ReadFrom(resp.Body); err != nil {
				t.Fatal(err)
			}
			checkError(t, resp.StatusCode, resp.Header, body.Bytes(), r)
			if r.status == 405 && resp.Header.Get("Allow") == "" {
				t.Errorf("405 without an Allow header")
			}
		})
	}
	if got := n.Log.LastSeq(); got != seq {
		sub, _ := n.Log.Subscribe(seq + 1)
		ev, _ := sub.Next(context.Background())
		t.Errorf("bad input appended to the log: seq %d -> %d: %s %s %s", seq, got, ev.Type, ev.AggID, ev.Payload)
	}
	if after := getSandbox(t, n, sb.ID); after.State != before.State || after.Deadline != before.Deadline {
		t.Errorf("bad input changed sandbox %s: %+v -> %+v", sb.ID, before, after)
	}
}

func checkError(t *testing.T, status int, hdr http.Header, body []byte, r badInput) {
	t.Helper()
	if status != r.status {
		t.Errorf("status %d, want %d (body %.200s)", status, r.status, body)
	}
	if ct := hdr.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type %q, want application/json", ct)
	}
	var e map[string]any
	if err := json.Unmarshal(body, &e); err != nil {
		t.Fatalf("body %.200q is not JSON: %v", body, err)
	}
	msg, _ := e["error"].(string)
	if msg == "" || len(e) != 1 {
		t.Fatalf("body %.200s, want exactly {\"error\": \"...\"}", body)
	}
	if r.invalidBody && !strings.HasPrefix(msg, "invalid request body") {
		t.Errorf("error %q, want the old daemon's \"invalid request body\"", msg)
	}
	if r.contains != "" && !strings.Contains(msg, r.contains) {
		t.Errorf("error %q does not mention %q", msg, r.contains)
	}
}

// TestBadInputUnauthenticated: validation runs after
// authentication, so an anonymous bad body is a 401, not a 400 that would
// tell a stranger how the API parses.
func TestBadInputUnauthenticated(t *testing.T) {
	n := newNode(t, 0, func(o *nodetest.Options) { o.NoExecutors = true })
	for _, r := range append(claimRows(), poolsRows()...) {
		rec := httptest.NewRecorder()
		n.Server.ServeHTTP(rec, httptest.NewRequest(r.method, r.path, strings.NewReader(r.body)))
		if rec.Code != http.StatusUnauthorized {
			t.Errorf("%s without a token: %d, want 401", r.name, rec.Code)
		}
	}
}
