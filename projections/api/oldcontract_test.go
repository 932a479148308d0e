package api_test

// Answers decoded as the old daemon's clients decode them: the structs below
// are written from the old contract (its Go SDK, Python SDK and operator
// client), not taken from package api, so a renamed, retyped or re-nested
// field fails here even when sbxlog's own client still agrees with itself.

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sbxlog/sbxlog/cmd/sandboxd/node/nodetest"
	"github.com/sbxlog/sbxlog/fsm"
	"github.com/sbxlog/sbxlog/projections/api"
)

// oldKey is the old PoolKey: an object, never "t/n/s".
type oldKey struct {
	Template string `json:"template"`
	Net      string `json:"net"`
	Size     string `json:"size"`
}

// oldPoolInfo is one entry of the old GET /v1/info's pools.
type oldPoolInfo struct {
	Key       oldKey `json:"key"`
	Warm      int    `json:"warm"`
	Refilling int    `json:"refilling"`
	Target    int    `json:"target"`
	Golden    bool   `json:"golden"`
}

// oldInfo is the old GET /v1/info (and PUT /v1/pools) body.
type oldInfo struct {
	Pools            []oldPoolInfo     `json:"pools"`
	Templates        []json.RawMessage `json:"templates"`
	Claimed          int               `json:"claimed"`
	Hibernated       int               `json:"hibernated"`
	Archived         int               `json:"archived"`
	Failed           int               `json:"failed"`
	Draining         bool              `json:"draining"`
	AdvertiseAddr    string            `json:"advertise_addr"`
	Peers            []string          `json:"peers"`
	AtCapacity       bool              `json:"at_capacity"`
	AtCapacityReason string            `json:"at_capacity_reason"`
}

// oldClaimResponse is what the old SDKs decode a claim's 200 into (a
// served claim and a redirect alike).
type oldClaimResponse struct {
	ID              string    `json:"id"`
	Token           string    `json:"token"`
	Deadline        time.Time `json:"deadline"`
	OwnerAddr       string    `json:"owner_addr"`
	TemplateDigest  string    `json:"template_digest"`
	FromCheckpoint  string    `json:"from_checkpoint"`
	NetRoute        string    `json:"net_route"`
	Redirect        []string  `json:"redirect"`
	RequirePromoted bool      `json:"require_promoted"`
}

// oldSandbox is the old sandbox row (GET /v1/sandboxes, GET /v1/sandboxes/{id}).
type oldSandbox struct {
	ID             string            `json:"id"`
	Key            oldKey            `json:"key"`
	Tenant         string            `json:"tenant"`
	ClaimRef       string            `json:"claim_ref"`
	Metadata       map[string]string `json:"metadata"`
	OnExpire       string            `json:"on_expire"`
	CPUCount       int               `json:"cpu_count"`
	MemTotalBytes  int64             `json:"mem_total_bytes"`
	Hibernated     bool              `json:"hibernated"`
	Archived       bool              `json:"archived"`
	FromCheckpoint string            `json:"from_checkpoint"`
	Failed         string            `json:"failed"`
	ClaimedAt      time.Time         `json:"claimed_at"`
	Deadline       time.Time         `json:"deadline"`
	Token          string            `json:"token"`
}

// oldError is every old error body.
type oldError struct {
	Error string `json:"error"`
}

// decodeOld decodes body into v (the old clients' lenient decoding) and
// checks that keys, present at the top level of body, are all there.
func decodeOld(t *testing.T, what string, body []byte, v any, keys ...string) {
	t.Helper()
	if err := json.Unmarshal(body, v); err != nil {
		t.Fatalf("%s: the old client cannot decode %s: %v", what, body, err)
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil {
		t.Fatalf("%s: %s is not an object: %v", what, body, err)
	}
	for _, k := range keys {
		if _, ok := m[k]; !ok {
			t.Errorf("%s: key %q missing from %s", what, k, body)
		}
	}
}

// wantError checks an error answer: status and the old daemon's exact text.
func wantError(t *testing.T, what string, st int, body []byte, status int, msg string) {
	t.Helper()
	var e oldError
	if st != status || json.Unmarshal(body, &e) != nil || e.Error != msg {
		t.Fatalf("%s: %d %s, want %d {\"error\": %q}", what, st, body, status, msg)
	}
}

var (
	oldIDRE  = regexp.MustCompile(`^sb_[0-9a-f]{16}$`)
	smallKey = oldKey{Template: "default", Net: "none", Size: "small"}
)

// TestOldInfo: GET /v1/info as the old SDKs read it (key object, golden
// boolean, the counts, templates), sbxlog's extras beside it, and its auth:
// root only.
func TestOldInfo(t *testing.T) {
	n := newNode(t, 2, nil)
	settle(t, n)
	st, b := call(t, n, "GET", "/v1/info", rootTok, nil)
	if st != http.StatusOK {
		t.Fatalf("info: %d %s", st, b)
	}
	var in oldInfo
	decodeOld(t, "info", b, &in, "pools", "templates", "claimed", "hibernated", "archived", "advertise_addr")
	if len(in.Pools) != 1 || in.Pools[0] != (oldPoolInfo{Key: smallKey, Warm: 2, Target: 2, Golden: true}) {
		t.Fatalf("pools %+v", in.Pools)
	}
	if in.Templates == nil || len(in.Templates) != 0 || in.Claimed != 0 || in.Hibernated != 0 || in.Archived != 0 || in.Failed != 0 || in.Draining {
		t.Fatalf("info %+v", in)
	}
	if in.AdvertiseAddr != strings.TrimPrefix(n.URL, "http://") || in.Peers != nil || in.AtCapacity {
		t.Fatalf("advertise_addr %q, peers %v, at_capacity %v", in.AdvertiseAddr, in.Peers, in.AtCapacity)
	}
	// sbxlog's extras are still there for its own clients.
	var ext api.Info
	if err := json.Unmarshal(b, &ext); err != nil || ext.Node != "n1" || ext.Pools[0].GoldenState != "ready" || ext.Pools[0].WarmMax != 2 || ext.LogSeq == 0 {
		t.Fatalf("extras: %+v, %v", ext, err)
	}

	claimAs(t, n, tokA, "")
	st, b = call(t, n, "GET", "/v1/info", rootTok, nil)
	decodeOld(t, "info after a claim", b, &in)
	if st != http.StatusOK || in.Claimed != 1 {
		t.Fatalf("after a claim: %d %+v", st, in)
	}

	st, b = call(t, n, "GET", "/v1/info", tokA, nil)
	wantError(t, "tenant info", st, b, http.StatusForbidden, "operator token required")
	st, b = call(t, n, "GET", "/v1/info", "", nil)
	wantError(t, "anonymous info", st, b, http.StatusUnauthorized, "invalid api token")
	st, b = call(t, n, "GET", "/v1/info", "not-a-token", nil)
	wantError(t, "bad token info", st, b, http.StatusUnauthorized, "invalid api token")
}

// TestOldPutPools: the bodies the old Go SDK and operator send, the info
// body back, and the archive fields accepted at 0 only.
func TestOldPutPools(t *testing.T) {
	n := newNode(t, 0, func(o *nodetest.Options) { o.NoExecutors = true })
	for _, c := range []struct {
		name, body string
		want       []oldPoolInfo
	}{
		{"go sdk", `{"pools":[{"template":"default","warm":2,"warm_max":4,"idle_hibernate_seconds":0,"archive_after_seconds":0,"archive_delete_after_seconds":0}]}`,
			[]oldPoolInfo{{Key: smallKey, Target: 2}}},
		{"operator", `{"pools":[{"template":"py","net":"none","size":"medium","warm":1}]}`,
			[]oldPoolInfo{{Key: oldKey{Template: "py", Net: "none", Size: "medium"}, Target: 1}}},
	} {
		st, b := call(t, n, "PUT", "/v1/pools", rootTok, []byte(c.body))
		var in oldInfo
		decodeOld(t, c.name, b, &in, "pools", "claimed", "hibernated", "archived")
		// default, left out of the second PUT, holds no VM: it goes at once.
		if st != http.StatusOK || !slices.Equal(in.Pools, c.want) {
			t.Fatalf("%s: %d %s, want pools %+v", c.name, st, b, c.want)
		}
	}
	st, b := call(t, n, "PUT", "/v1/pools", rootTok, []byte(`{"pools":[{"template":"default","warm":1,"archive_after_seconds":60}]}`))
	if st != http.StatusBadRequest || !strings.Contains(string(b), "archive_after_seconds is not supported") {
		t.Fatalf("archive_after_seconds 60: %d %s", st, b)
	}
	st, b = call(t, n, "PUT", "/v1/pools", tokA, []byte(`{"pools":[]}`))
	wantError(t, "tenant put pools", st, b, http.StatusForbidden, "operator token required")
}

// TestOldClaimBodies: the claim bodies each old client sends (every
// optional field it may set) are served, and the answer decodes as the old
// SDKs decode it; the TTL is clamped, never refused.
func TestOldClaimBodies(t *testing.T) {
	n := newNode(t, 8, nil)
	for _, c := range []struct {
		name, body string
		ttl        time.Duration
	}{
		{"go sdk", `{"template":"default","net":"none","size":"small","ttl_seconds":120,"claim_ref":"ns/a","no_redirect":true,"require_promoted":false,"volumes":[],"volumes_attach_only":false}`, 120 * time.Second},
		{"python sdk", `{"template":"default","ttl_seconds":0,"claim_ref":"","volumes":null}`, 5 * time.Minute},
		{"operator", `{"template":"default","net":"none","size":"small","ttl_seconds":600,"claim_ref":"ns/b","metadata":{"team":"a"},"on_expire":"destroy","egress":false}`, 10 * time.Minute},
		{"engine hint", `{"template":"default","engine":"cloud-hypervisor","egress":true}`, 5 * time.Minute},
		{"empty env", `{"template":"default","env":{}}`, 5 * time.Minute},
		{"negative ttl", `{"template":"default","ttl_seconds":-30}`, 5 * time.Minute},
		{"ttl over 24 h", `{"template":"default","ttl_seconds":90000}`, 24 * time.Hour},
		{"egress net", `{"template":"default","net":"egress"}`, 5 * time.Minute},
	} {
		t.Run(c.name, func(t *testing.T) {
			before := time.Now()
			st, b := call(t, n, "POST", "/v1/claim", rootTok, []byte(c.body))
			if st != http.StatusOK {
				t.Fatalf("%d %s", st, b)
			}
			var cr oldClaimResponse
			decodeOld(t, c.name, b, &cr, "id", "token", "deadline", "owner_addr", "net_route")
			route := "none"
			if strings.Contains(c.body, `"net":"egress"`) {
				route = "direct" // its own NIC on the node's bridge
			}
			if !oldIDRE.MatchString(cr.ID) || cr.Token == "" || cr.OwnerAddr != strings.TrimPrefix(n.URL, "http://") || cr.NetRoute != route || cr.Redirect != nil {
				t.Fatalf("answer %+v", cr)
			}
			if lo, hi := before.Add(c.ttl-time.Second), time.Now().Add(c.ttl+time.Second); cr.Deadline.Before(lo) || cr.Deadline.After(hi) {
				t.Fatalf("deadline %s, want now + %s", cr.Deadline, c.ttl)
			}
		})
	}
}

// TestOldUnknownTemplate: a template that does not exist on this node is
// the old daemon's 404 "unknown template" (naming it) at once, with no
// event appended and no claim or pool left behind (issue 22 defect 4:
// it used to be cold-booted and answered 500 "provisioning failed");
// require_promoted is 404.
func TestOldUnknownTemplate(t *testing.T) {
	n := newNode(t, 1, nil)
	n.Driver.SetTemplates("default")
	settle(t, n)
	seq := n.Log.LastSeq()
	// The old text, the name and (sbxlog's) the templates there are.
	const unknownNope = "unknown template nope; templates here: default (sbxctl templates, GET /v1/templates)"
	st, b := call(t, n, "POST", "/v1/claim", rootTok, []byte(`{"template":"nope"}`))
	wantError(t, "claim of an unknown template", st, b, http.StatusNotFound, unknownNope)
	st, b = call(t, n, "POST", "/v1/claim", tokA, []byte(`{"template":"nope","size":"large"}`))
	wantError(t, "tenant's claim of an unknown template", st, b, http.StatusNotFound, unknownNope)
	if got := n.Log.LastSeq(); got != seq {
		t.Fatalf("log went from %d to %d: a refused claim appended events", seq, got)
	}
	st, b = call(t, n, "GET", "/v1/info", rootTok, nil)
	var in oldInfo
	decodeOld(t, "info", b, &in)
	if st != http.StatusOK || len(in.Pools) != 1 || in.Pools[0].Key != smallKey {
		t.Fatalf("pools after the refused claim: %s", b)
	}

	st, b = call(t, n, "POST", "/v1/claim", rootTok, []byte(`{"template":"default","require_promoted":true}`))
	wantError(t, "require_promoted", st, b, http.StatusNotFound, "unknown template")

	// A template that exists but has no pool is served cold.
	n.Driver.SetTemplates("default", "adhoc")
	st, b = call(t, n, "POST", "/v1/claim", rootTok, []byte(`{"template":"adhoc","size":"medium"}`))
	var cr api.ClaimResponse
	if st != http.StatusOK || json.Unmarshal(b, &cr) != nil || cr.Tier != "cold" || cr.Size != "medium" {
		t.Fatalf("claim of a template without a pool: %d %s, want a cold claim", st, b)
	}
	if st, b := call(t, n, "POST", "/v1/sandboxes/"+cr.ID+"/release", cr.Token, nil); st != http.StatusNoContent {
		t.Fatalf("release: %d %s", st, b)
	}
}

// warmKeyOnly is a cluster view with warm capacity elsewhere for one key
// and a peer list.
type warmKeyOnly struct {
	otherNode
	peers []string
}

var _ api.PeerLister = warmKeyOnly{}

func (w warmKeyOnly) Peers() []string { return w.peers }

// TestOldRedirect: the redirect is a 200 with only "redirect", on a warm
// miss and instead of a quota 429 when warm peers exist; never with
// no_redirect or require_promoted.
func TestOldRedirect(t *testing.T) {
	other := warmKeyOnly{otherNode: otherNode{addr: "10.0.0.3:7777", warmKey: defKey}, peers: []string{"10.0.0.3:7777"}}
	miss := newNode(t, 0, func(o *nodetest.Options) { o.Redirector = other; o.NoExecutors = true })
	st, b := call(t, miss, "POST", "/v1/claim", tokA, []byte(`{"template":"default","ttl_seconds":60}`))
	var cr oldClaimResponse
	decodeOld(t, "warm miss", b, &cr, "redirect")
	if st != http.StatusOK || cr.ID != "" || cr.Token != "" || !slices.Equal(cr.Redirect, other.peers) || strings.Contains(string(b), `"id"`) {
		t.Fatalf("warm miss: %d %s, want 200 with only the redirect", st, b)
	}
	st, b = call(t, miss, "POST", "/v1/claim", tokA, []byte(`{"template":"default","require_promoted":true}`))
	wantError(t, "require_promoted", st, b, http.StatusNotFound, "unknown template")

	// Rule 3: the node is at max_claims with warm VMs of its own; warm
	// peers take the claim instead of a 429.
	full := newNode(t, 2, func(o *nodetest.Options) { o.Redirector = other; o.MaxClaims = 1 })
	claimAs(t, full, rootTok, "")
	st, b = call(t, full, "POST", "/v1/claim", rootTok, []byte(`{"template":"default"}`))
	decodeOld(t, "quota", b, &cr, "redirect")
	if st != http.StatusOK || !slices.Equal(cr.Redirect, other.peers) {
		t.Fatalf("claim over max_claims with warm peers: %d %s, want 200 redirect", st, b)
	}
	st, b = call(t, full, "POST", "/v1/claim", rootTok, []byte(`{"template":"default","no_redirect":true}`))
	if st != http.StatusTooManyRequests {
		t.Fatalf("claim over max_claims with no_redirect: %d %s, want 429", st, b)
	}
	// A key no peer has warm: the 429 stands.
	st, b = call(t, full, "POST", "/v1/claim", rootTok, []byte(`{"template":"default","size":"large"}`))
	if st != http.StatusTooManyRequests {
		t.Fatalf("claim over max_claims, no warm peer: %d %s, want 429", st, b)
	}
}

// TestOldSandboxRows: the old row in the list and by id (key object,
// sizes, flags, times), the sandbox token for root by id only, and the old
// query filters.
func TestOldSandboxRows(t *testing.T) {
	n := newNode(t, 4, nil)
	a := claimAs(t, n, tokA, `,"claim_ref":"ns/a","metadata":{"team":"x","tier":"1"}`)
	claimAs(t, n, tokB, `,"claim_ref":"ns/b","metadata":{"team":"x"}`)
	list := func(tok, query string) []oldSandbox {
		t.Helper()
		st, b := call(t, n, "GET", "/v1/sandboxes"+query, tok, nil)
		var out struct {
			Sandboxes []json.RawMessage `json:"sandboxes"`
		}
		if st != http.StatusOK || json.Unmarshal(b, &out) != nil || out.Sandboxes == nil {
			t.Fatalf("list %s: %d %s", query, st, b)
		}
		rows := make([]oldSandbox, len(out.Sandboxes))
		for i, raw := range out.Sandboxes {
			decodeOld(t, "row", raw, &rows[i], "id", "key", "hibernated", "deadline")
			if rows[i].Token != "" {
				t.Fatalf("list %s carries a sandbox token: %s", query, raw)
			}
		}
		return rows
	}
	rows := list(tokA, "")
	if len(rows) != 1 {
		t.Fatalf("tenant a sees %d rows", len(rows))
	}
	r := rows[0]
	if r.ID != a.ID || r.Key != smallKey || r.Tenant != "a" || r.ClaimRef != "ns/a" || r.Metadata["team"] != "x" ||
		r.CPUCount != 1 || r.MemTotalBytes != 512<<20 || r.Hibernated || r.Archived || r.Failed != "" {
		t.Fatalf("row %+v", r)
	}
	if r.ClaimedAt.IsZero() || time.Since(r.ClaimedAt) > time.Minute || !r.Deadline.After(r.ClaimedAt) {
		t.Fatalf("row times: claimed_at %s, deadline %s", r.ClaimedAt, r.Deadline)
	}
	for _, c := range []struct {
		tok, query string
		want       int
	}{
		{rootTok, "", 2},
		{rootTok, "?claim_ref=ns%2Fa", 1},
		{rootTok, "?metadata=team%3Dx", 2},
		{rootTok, "?metadata=team%3Dx&metadata=tier%3D1", 1},
		{rootTok, "?metadata=team%3Dx&metadata=tier%3D2", 0},
		{rootTok, "?tenant=b", 1},
		{rootTok, "?tenant=nobody", 0},
		{tokA, "?tenant=b", 1}, // ignored: a tenant sees its own
	} {
		if got := list(c.tok, c.query); len(got) != c.want {
			t.Errorf("list %s as %s: %d rows, want %d", c.query, c.tok, len(got), c.want)
		}
	}

	// By id: root gets the sandbox token, which works as the sandbox's.
	st, b := call(t, n, "GET", "/v1/sandboxes/"+a.ID, rootTok, nil)
	var one oldSandbox
	decodeOld(t, "by id", b, &one, "id", "key", "hibernated", "deadline", "token")
	if st != http.StatusOK || one.ID != a.ID || one.Token != a.Token {
		t.Fatalf("root GET by id: %d %s", st, b)
	}
	if st, b := call(t, n, "GET", "/v1/sandboxes/"+a.ID, tokA, nil); st != http.StatusOK || strings.Contains(string(b), `"token"`) {
		t.Fatalf("tenant GET by id: %d %s, want the row without a token", st, b)
	}

	// Hibernated shows in the row.
	if st, b := call(t, n, "POST", "/v1/sandboxes/"+a.ID+"/hibernate", a.Token, nil); st != http.StatusNoContent {
		t.Fatalf("hibernate: %d %s", st, b)
	}
	waitState(t, n, a.ID, "hibernated")
	_, b = call(t, n, "GET", "/v1/sandboxes/"+a.ID, rootTok, nil)
	decodeOld(t, "hibernated", b, &one)
	if !one.Hibernated {
		t.Fatalf("hibernated claim's row: %s", b)
	}
	_, b = call(t, n, "GET", "/v1/info", rootTok, nil)
	var in oldInfo
	decodeOld(t, "info", b, &in)
	if in.Hibernated != 1 {
		t.Fatalf("info with a hibernated claim: %s", b)
	}
}

// TestOldPeers: GET /v1/peers for root and tenants, [] on a single node,
// the cluster view's list otherwise (and in /v1/info).
func TestOldPeers(t *testing.T) {
	single := newNode(t, 0, func(o *nodetest.Options) { o.NoExecutors = true })
	for _, tok := range []string{rootTok, tokA} {
		st, b := call(t, single, "GET", "/v1/peers", tok, nil)
		var out struct {
			Peers []string `json:"peers"`
		}
		decodeOld(t, "peers", b, &out, "peers")
		if st != http.StatusOK || out.Peers == nil || len(out.Peers) != 0 {
			t.Fatalf("single node's peers: %d %s, want []", st, b)
		}
	}
	st, b := call(t, single, "GET", "/v1/peers", "", nil)
	wantError(t, "anonymous peers", st, b, http.StatusUnauthorized, "invalid api token")

	peers := []string{"10.0.0.2:7777", "10.0.0.3:7777"}
	mesh := newNode(t, 0, func(o *nodetest.Options) {
		o.Redirector = warmKeyOnly{otherNode: otherNode{warmKey: fsm.PoolKey{}}, peers: peers}
		o.NoExecutors = true
	})
	st, b = call(t, mesh, "GET", "/v1/peers", tokA, nil)
	var out struct {
		Peers []string `json:"peers"`
	}
	if st != http.StatusOK || json.Unmarshal(b, &out) != nil || !slices.Equal(out.Peers, peers) {
		t.Fatalf("peers: %d %s, want %v", st, b, peers)
	}
	_, b = call(t, mesh, "GET", "/v1/info", rootTok, nil)
	var in oldInfo
	decodeOld(t, "info", b, &in)
	if !slices.Equal(in.Peers, peers) {
		t.Fatalf("info peers %v, want %v", in.Peers, peers)
	}
}

// TestOldHealthz: the text "ok" once ready, a 503 with a short text before.
func TestOldHealthz(t *testing.T) {
	n := newNode(t, 0, func(o *nodetest.Options) { o.NoExecutors = true })
	st, hdr, body := do(t, n, "GET", "/healthz", "", nil)
	if st != http.StatusOK || string(body) != "ok" || !strings.HasPrefix(hdr.Get("Content-Type"), "text/plain") {
		t.Fatalf("healthz: %d %q (%s), want 200 \"ok\"", st, body, hdr.Get("Content-Type"))
	}
	// A server whose first reconcile has not finished.
	starting := api.New(api.Config{Node: "n1"}, n.Engine, n.Log, n.Auth, api.Options{})
	rec := httptest.NewRecorder()
	starting.ServeHTTP(rec, httptest.NewRequest("GET", "/healthz", nil))
	if b := rec.Body.String(); rec.Code != http.StatusServiceUnavailable || b == "" || strings.HasPrefix(b, "{") {
		t.Fatalf("healthz before ready: %d %q, want 503 with a text", rec.Code, b)
	}
}
