package e2e

// The conformance suite of the old sandboxd's control plane (issue 16,
// acceptance 1): every control-plane route of the old daemon, called as
// its clients call it (the Go SDK, the Python SDK and the Kubernetes
// operator's client: their field names, shapes, optional fields, empty
// bodies and headers), against the built sandboxd with chsim. Answers are
// decoded into structs of the OLD shapes, written here from the public
// contract and never taken from sbxlog's own types, so a renamed, retyped
// or re-nested field fails here as it fails for an old client. Statuses and
// the error texts old clients compare or show are checked exactly.
//
// sbxlog's additions (extra fields, extra routes, the sandbox token on
// more routes) are not failures: old clients ignore them. Not covered: a
// claim's redirect answer (a single node never redirects; the mesh's is
// tested with replication), and the data-plane, env, volume, checkpoint,
// fork, promote and template routes, which are other issues' (the table
// in docs/api.md says which).

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/sbxlog/sbxlog/projections/openapi/openapitest"
)

// The old wire shapes.

type oldKey struct {
	Template string `json:"template"`
	Net      string `json:"net"`
	Size     string `json:"size"`
}

type oldVolume struct {
	Name  string `json:"name"`
	Mount string `json:"mount,omitempty"`
	Mode  string `json:"mode,omitempty"`
}

// oldClaimRequest is the Go SDK's claim body (json.Marshal of it, optional
// fields omitted when zero).
type oldClaimRequest struct {
	Template          string      `json:"template"`
	Net               string      `json:"net,omitempty"`
	Size              string      `json:"size,omitempty"`
	Volumes           []oldVolume `json:"volumes,omitempty"`
	VolumesAttachOnly bool        `json:"volumes_attach_only,omitzero"`
	TTLSeconds        int         `json:"ttl_seconds,omitzero"`
	NoRedirect        bool        `json:"no_redirect,omitzero"`
	RequirePromoted   bool        `json:"require_promoted,omitzero"`
	ClaimRef          string      `json:"claim_ref,omitempty"`
}

// oldClaimResponse is what the Go SDK decodes from a claim.
type oldClaimResponse struct {
	ID              string      `json:"id"`
	Token           string      `json:"token"`
	Deadline        time.Time   `json:"deadline"`
	OwnerAddr       string      `json:"owner_addr,omitempty"`
	FromCheckpoint  string      `json:"from_checkpoint,omitempty"`
	TemplateDigest  string      `json:"template_digest,omitempty"`
	Volumes         []oldVolume `json:"volumes,omitempty"`
	Redirect        []string    `json:"redirect,omitempty"`
	RequirePromoted bool        `json:"require_promoted,omitzero"`
}

// oldSandbox is a row of GET /v1/sandboxes and GET /v1/sandboxes/{id}.
type oldSandbox struct {
	ID             string            `json:"id"`
	Key            oldKey            `json:"key"`
	Tenant         string            `json:"tenant,omitempty"`
	ClaimRef       string            `json:"claim_ref,omitempty"`
	Metadata       map[string]string `json:"metadata,omitempty"`
	OnExpire       string            `json:"on_expire,omitempty"`
	CPUCount       int               `json:"cpu_count,omitempty"`
	MemTotalBytes  int64             `json:"mem_total_bytes,omitempty"`
	Volumes        []oldVolume       `json:"volumes,omitempty"`
	Hibernated     bool              `json:"hibernated"`
	Archived       bool              `json:"archived,omitempty"`
	FromCheckpoint string            `json:"from_checkpoint,omitempty"`
	Restarts       int               `json:"restarts,omitempty"`
	Failed         string            `json:"failed,omitempty"`
	ClaimedAt      time.Time         `json:"claimed_at"`
	Deadline       time.Time         `json:"deadline"`
	Token          string            `json:"token,omitempty"`
}

type oldSandboxList struct {
	Sandboxes []oldSandbox `json:"sandboxes"`
}

// oldPoolSpec is one pool of PUT /v1/pools, flat (no nested key).
type oldPoolSpec struct {
	Template                  string `json:"template"`
	Net                       string `json:"net,omitempty"`
	Size                      string `json:"size,omitempty"`
	Warm                      int    `json:"warm"`
	WarmMax                   int    `json:"warm_max,omitzero"`
	IdleHibernateSeconds      int    `json:"idle_hibernate_seconds,omitzero"`
	ArchiveAfterSeconds       int    `json:"archive_after_seconds,omitzero"`
	ArchiveDeleteAfterSeconds int    `json:"archive_delete_after_seconds,omitzero"`
}

type oldPoolInfo struct {
	Key       oldKey `json:"key"`
	Warm      int    `json:"warm"`
	Refilling int    `json:"refilling"`
	Target    int    `json:"target"`
	Golden    bool   `json:"golden"`
}

// oldNodeInfo is GET /v1/info's body, and PUT /v1/pools', drain's and
// uncordon's.
type oldNodeInfo struct {
	Pools            []oldPoolInfo     `json:"pools"`
	Templates        []json.RawMessage `json:"templates"`
	Claimed          int               `json:"claimed"`
	Hibernated       int               `json:"hibernated"`
	Archived         int               `json:"archived"`
	Failed           int               `json:"failed,omitzero"`
	Draining         bool              `json:"draining,omitzero"`
	AdvertiseAddr    string            `json:"advertise_addr,omitempty"`
	Peers            []string          `json:"peers,omitempty"`
	AtCapacity       bool              `json:"at_capacity,omitzero"`
	AtCapacityReason string            `json:"at_capacity_reason,omitempty"`
}

type oldStats struct {
	ID              string    `json:"id"`
	CPUCount        int       `json:"cpu_count"`
	MemTotalBytes   int64     `json:"mem_total_bytes"`
	MemUsedBytes    int64     `json:"mem_used_bytes"`
	MemUsedMeasured bool      `json:"mem_used_measured"`
	Hibernated      bool      `json:"hibernated"`
	MeasuredAt      time.Time `json:"measured_at"`
}

type oldTenant struct {
	Name        string `json:"name"`
	MaxClaims   int    `json:"max_claims,omitzero"`
	EgressClass string `json:"egress_class,omitempty"`
	Claims      int    `json:"claims"`
	Removed     bool   `json:"removed,omitzero"`
}

type oldTenantList struct {
	Tenants []oldTenant `json:"tenants"`
	Digest  string      `json:"digest"`
	Next    string      `json:"next,omitempty"`
}

// oldTenantSpec is the Go SDK's tenant body (zero fields omitted).
type oldTenantSpec struct {
	Name        string `json:"name,omitempty"`
	Token       string `json:"token,omitempty"`
	MaxClaims   int    `json:"max_claims,omitzero"`
	EgressClass string `json:"egress_class,omitempty"`
}

// The old daemon's error texts that clients compare or show.
const (
	errInvalidAPIToken  = "invalid api token"
	errOperatorRequired = "operator token required"
	errMissingBearer    = "missing bearer token"
	errUnknownSandbox   = "unknown sandbox"
	errUnknownTenant    = "unknown tenant"
	errUnknownTemplate  = "unknown template"
	errNotOwnedHere     = "not owned here"
	errDraining         = "node claim quota reached: node draining*"
	errBadBody          = "invalid request body" // a prefix: the decoder's reason may follow
)

const (
	confRoot     = "conf-root-token"
	confTenant   = "acme-token"
	confTemplate = "conf"
)

var sandboxIDRe = regexp.MustCompile(`^sb_[0-9a-f]{16}$`)

// oldNode is the daemon under test, called as the old clients call it.
type oldNode struct {
	base string
	addr string
	hc   *http.Client
}

// reply is one answer.
type reply struct {
	status int
	header http.Header
	body   []byte
}

// call sends one request the way the Go SDK's roundTrip does: a body only
// when there is one (then Content-Type: application/json), a bearer only
// when there is a token. A nil body is no body at all (what every SDK
// sends to release, hibernate, wake, drain).
func (n *oldNode) call(t *testing.T, method, path, token string, body []byte) reply {
	t.Helper()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequest(method, n.base+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := n.hc.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: read: %v", method, path, err)
	}
	return reply{status: resp.StatusCode, header: resp.Header, body: b}
}

// goBody is json.Marshal of v, as the Go SDK encodes bodies.
func goBody(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// want checks an answer's status and, for an error, that it is the old
// {"error": msg} JSON body with msg exactly errText ("" any message; a
// trailing "*" a prefix). It reports a mismatch and returns whether the
// answer matched.
func want(t *testing.T, what string, r reply, status int, errText string) bool {
	t.Helper()
	if r.status != status {
		t.Errorf("%s: HTTP %d %.300s, want %d", what, r.status, r.body, status)
		return false
	}
	if status < 400 {
		return true
	}
	var e struct {
		Error string `json:"error"`
	}
	if ct := r.header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") || json.Unmarshal(r.body, &e) != nil || e.Error == "" {
		t.Errorf("%s: error body %q (%s), want JSON {\"error\": ...}", what, r.body, ct)
		return false
	}
	prefix, isPrefix := strings.CutSuffix(errText, "*")
	switch {
	case errText == "":
	case isPrefix && !strings.HasPrefix(e.Error, prefix):
		t.Errorf("%s: error %q, want it to start with %q", what, e.Error, prefix)
		return false
	case !isPrefix && e.Error != errText:
		t.Errorf("%s: error %q, want %q", what, e.Error, errText)
		return false
	}
	return true
}

// decodeOld decodes an answer into an old shape as the old clients do
// (encoding/json, unknown fields ignored): a field of another type or
// nesting is an error there, and here.
func decodeOld(t *testing.T, what string, r reply, v any) bool {
	t.Helper()
	if ct := r.header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Errorf("%s: Content-Type %q, want application/json", what, ct)
	}
	if err := json.Unmarshal(r.body, v); err != nil {
		t.Errorf("%s: an old client cannot decode the answer: %v: %.300s", what, err, r.body)
		return false
	}
	return true
}

// hasKeys reports each of keys that the JSON object answer raw lacks:
// fields the old daemon always sent.
func hasKeys(t *testing.T, what string, raw []byte, keys ...string) {
	t.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Errorf("%s: not a JSON object: %.200s", what, raw)
		return
	}
	for _, k := range keys {
		if _, ok := m[k]; !ok {
			t.Errorf("%s: key %q missing: %.300s", what, k, raw)
		}
	}
}

// answer200 checks a 200 answer, decodes it into the old shape T and
// checks that it has keys, the fields the old daemon always sent.
func answer200[T any](t *testing.T, what string, r reply, keys ...string) (T, bool) {
	t.Helper()
	var v T
	if !want(t, what, r, http.StatusOK, "") || !decodeOld(t, what, r, &v) {
		return v, false
	}
	hasKeys(t, what, r.body, keys...)
	return v, true
}

// claim makes a claim the Go SDK's way and returns the old answer; ok is
// false (and the test marked failed) when it did not succeed.
func (n *oldNode) claim(t *testing.T, token string, req oldClaimRequest) (oldClaimResponse, bool) {
	t.Helper()
	r := n.call(t, "POST", "/v1/claim", token, goBody(t, req))
	var cr oldClaimResponse
	if !want(t, "claim "+req.Template, r, http.StatusOK, "") || !decodeOld(t, "claim", r, &cr) {
		return cr, false
	}
	if !sandboxIDRe.MatchString(cr.ID) || cr.Token == "" || cr.Deadline.IsZero() || len(cr.Redirect) != 0 {
		t.Errorf("claim answer %s: want an id sb_<16 hex>, a token and a deadline", r.body)
		return cr, false
	}
	return cr, true
}

// scratch claims a sandbox of the pool as root for one test, released
// (as root) when the test ends.
func (n *oldNode) scratch(t *testing.T) (oldClaimResponse, bool) {
	t.Helper()
	c, ok := n.claim(t, confRoot, oldClaimRequest{Template: confTemplate})
	if ok {
		t.Cleanup(func() { n.call(t, "POST", "/v1/sandboxes/"+c.ID+"/release", confRoot, nil) })
	}
	return c, ok
}

// warmPools polls GET /v1/info, read shape-agnostically (only each pool's
// warm count), until the pools hold at least min warm VMs in all: setup,
// not conformance.
func (n *oldNode) warmPools(t *testing.T, min int) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		r := n.call(t, "GET", "/v1/info", confRoot, nil)
		var in struct {
			Pools []struct {
				Warm int `json:"warm"`
			} `json:"pools"`
		}
		warm := 0
		if r.status == http.StatusOK && json.Unmarshal(r.body, &in) == nil {
			for _, p := range in.Pools {
				warm += p.Warm
			}
		}
		if warm >= min {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("pools not warm after 60 s: %d %s", r.status, r.body)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// row reads GET /v1/sandboxes/{id} as root into the old row shape.
func (n *oldNode) row(t *testing.T, id string) (oldSandbox, bool) {
	t.Helper()
	r := n.call(t, "GET", "/v1/sandboxes/"+id, confRoot, nil)
	var sb oldSandbox
	ok := want(t, "GET /v1/sandboxes/"+id, r, http.StatusOK, "") && decodeOld(t, "GET /v1/sandboxes/{id}", r, &sb)
	return sb, ok
}

// first returns the first element of xs that match accepts.
func first[T any](xs []T, match func(T) bool) (T, bool) {
	for _, x := range xs {
		if match(x) {
			return x, true
		}
	}
	var zero T
	return zero, false
}

// near reports whether got is within slack of want.
func near(got, want time.Time, slack time.Duration) bool {
	d := got.Sub(want)
	return d > -slack && d < slack
}

func sha256Hex(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// TestConformance runs the old clients' control-plane calls against one
// sandboxd (chsim): a pool "conf" (none, small) of 2 warm VMs, the root
// token and one tenant, acme, from the config.
func TestConformance(t *testing.T) {
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	addr := freeAddr(t)
	cfg := filepath.Join(dir, "sandboxd.json")
	writeJSON(t, cfg, map[string]any{
		"listen": addr, "data_dir": data, "node_id": "conf", "api_token": confRoot, "hypervisor": "chsim",
		"tenants": []any{map[string]any{"name": "acme", "token_sha256": sha256Hex(confTenant)}},
		"pools":   []any{map[string]any{"template": confTemplate, "net": "none", "size": "small", "warm": 2}},
		"nats":    map[string]any{"disabled": true},
	})
	startDaemon(t, dir, data, addr, "-config", cfg)
	n := &oldNode{base: "http://" + addr, addr: addr, hc: openapitest.Client(t, &http.Client{Timeout: 60 * time.Second})}
	n.warmPools(t, 1)

	t.Run("healthz", func(t *testing.T) { conformHealthz(t, n) })
	t.Run("auth", func(t *testing.T) { conformAuth(t, n) })
	t.Run("claim", func(t *testing.T) { conformClaim(t, n) })
	t.Run("release", func(t *testing.T) { conformRelease(t, n) })
	t.Run("hibernate and wake", func(t *testing.T) { conformHibernateWake(t, n) })
	t.Run("renew", func(t *testing.T) { conformRenew(t, n) })
	t.Run("owner", func(t *testing.T) { conformOwner(t, n) })
	t.Run("sandboxes", func(t *testing.T) { conformSandboxes(t, n) })
	t.Run("stats", func(t *testing.T) { conformStats(t, n) })
	t.Run("info and pools", func(t *testing.T) { conformInfoPools(t, n) })
	t.Run("peers", func(t *testing.T) { conformPeers(t, n) })
	t.Run("tenants", func(t *testing.T) { conformTenants(t, n) })
	t.Run("drain", func(t *testing.T) { conformDrain(t, n) })
	t.Run("metrics", func(t *testing.T) { conformMetrics(t, n) })
}

// GET /healthz: 200, the body exactly "ok", no token.
func conformHealthz(t *testing.T, n *oldNode) {
	r := n.call(t, "GET", "/healthz", "", nil)
	if r.status != http.StatusOK || string(r.body) != "ok" {
		t.Errorf("GET /healthz: %d %q, want 200 \"ok\"", r.status, r.body)
	}
}

// conformAuth: node routes refuse a missing or unknown token with 401
// "invalid api token"; root-only routes refuse a tenant with 403
// "operator token required"; the tenant-scoped ones take a tenant.
func conformAuth(t *testing.T, n *oldNode) {
	type route struct{ method, path, body string }
	rootOnly := []route{
		{"GET", "/v1/info", ""},
		{"PUT", "/v1/pools", `{"pools":[{"template":"conf","warm":2}]}`},
		{"POST", "/v1/drain", ""},
		{"DELETE", "/v1/drain", ""},
		{"GET", "/v1/tenants", ""},
		{"PUT", "/v1/tenants", `{"tenants":[{"name":"acme"}]}`},
		{"PUT", "/v1/tenants/x", `{"max_claims":1}`},
		{"DELETE", "/v1/tenants/x", ""},
		{"GET", "/v1/sandboxes/sb_0123456789abcdef/stats", ""},
		{"GET", "/metrics", ""},
	}
	// Differs (docs/api.md, compatibility): a tenant may read its own
	// sandboxes by id, so for one it does not own it gets the 404 of an
	// unknown id, not the old root-only 403.
	want(t, "GET /v1/sandboxes/{id} as a tenant", n.call(t, "GET", "/v1/sandboxes/sb_0123456789abcdef", confTenant, nil), http.StatusNotFound, errUnknownSandbox)
	want(t, "GET /v1/sandboxes/{id} without a token", n.call(t, "GET", "/v1/sandboxes/sb_0123456789abcdef", "", nil), http.StatusUnauthorized, errInvalidAPIToken)
	tenantOK := []route{{"POST", "/v1/claim", `{"template":"conf","ttl_seconds":60}`}, {"GET", "/v1/peers", ""}, {"GET", "/v1/sandboxes", ""}}
	bodyOf := func(s string) []byte {
		if s == "" {
			return nil
		}
		return []byte(s)
	}
	for _, rt := range rootOnly {
		want(t, rt.method+" "+rt.path+" as a tenant", n.call(t, rt.method, rt.path, confTenant, bodyOf(rt.body)), http.StatusForbidden, errOperatorRequired)
	}
	for _, rt := range append(rootOnly, tenantOK...) {
		what := rt.method + " " + rt.path
		want(t, what+" without a token", n.call(t, rt.method, rt.path, "", bodyOf(rt.body)), http.StatusUnauthorized, errInvalidAPIToken)
		want(t, what+" with an unknown token", n.call(t, rt.method, rt.path, "not-a-token", bodyOf(rt.body)), http.StatusUnauthorized, errInvalidAPIToken)
	}
	for _, rt := range tenantOK {
		r := n.call(t, rt.method, rt.path, confTenant, bodyOf(rt.body))
		want(t, rt.method+" "+rt.path+" as a tenant", r, http.StatusOK, "")
		var c oldClaimResponse
		if rt.path == "/v1/claim" && json.Unmarshal(r.body, &c) == nil && c.ID != "" {
			n.call(t, "POST", "/v1/sandboxes/"+c.ID+"/release", c.Token, nil)
		}
	}
}

// conformClaim: POST /v1/claim with the bodies the Go SDK, the Python SDK
// and the operator send.
func conformClaim(t *testing.T, n *oldNode) {
	var made []oldClaimResponse
	defer func() {
		for _, c := range made {
			n.call(t, "POST", "/v1/sandboxes/"+c.ID+"/release", c.Token, nil)
		}
	}()
	// The Go SDK: only the template; answered with the old claim shape.
	start := time.Now()
	if c, ok := n.claim(t, confRoot, oldClaimRequest{Template: confTemplate}); ok {
		made = append(made, c)
		if !near(c.Deadline, start.Add(5*time.Minute), 30*time.Second) {
			t.Errorf("claim without ttl_seconds: deadline %v, want about 5 min from now", c.Deadline)
		}
		if c.OwnerAddr != "" && c.OwnerAddr != n.addr {
			t.Errorf("claim owner_addr %q, want %q (or none)", c.OwnerAddr, n.addr)
		}
	}
	// Every optional field the Go SDK sends, a TTL over 24 h (clamped,
	// not refused).
	start = time.Now()
	if c, ok := n.claim(t, confRoot, oldClaimRequest{Template: confTemplate, Net: "none", Size: "small", TTLSeconds: 100000, NoRedirect: true, ClaimRef: "go-ref"}); ok {
		made = append(made, c)
		if !near(c.Deadline, start.Add(24*time.Hour), 30*time.Second) {
			t.Errorf("claim ttl_seconds 100000: deadline %v, want 24 h from now (clamped)", c.Deadline)
		}
	}
	// The Python SDK's json.dumps body; a tenant's token.
	r := n.call(t, "POST", "/v1/claim", confTenant, []byte(`{"template": "conf", "ttl_seconds": 120, "claim_ref": "py-ref"}`))
	var pc oldClaimResponse
	if want(t, "Python SDK claim", r, http.StatusOK, "") && decodeOld(t, "Python SDK claim", r, &pc) {
		hasKeys(t, "Python SDK claim", r.body, "id", "token")
		made = append(made, pc)
	}
	// The operator's ClaimSpec: metadata, on_expire.
	r = n.call(t, "POST", "/v1/claim", confRoot, []byte(`{"template":"conf","ttl_seconds":60,"claim_ref":"ns/name","metadata":{"team":"a"},"on_expire":"destroy"}`))
	var oc oldClaimResponse
	if want(t, "operator claim", r, http.StatusOK, "") && decodeOld(t, "operator claim", r, &oc) {
		made = append(made, oc)
	}
	// A key the old daemon's lenient claim decoder ignored (an older
	// operator's engine).
	r = n.call(t, "POST", "/v1/claim", confRoot, []byte(`{"template":"conf","engine":"ch"}`))
	var ec oldClaimResponse
	if want(t, "claim with engine", r, http.StatusOK, "") && decodeOld(t, "claim with engine", r, &ec) {
		made = append(made, ec)
	}
	// require_promoted with no promoted template of that key: 404.
	r = n.call(t, "POST", "/v1/claim", confRoot, goBody(t, oldClaimRequest{Template: confTemplate, NoRedirect: true, RequirePromoted: true}))
	want(t, "claim require_promoted", r, http.StatusNotFound, errUnknownTemplate)
	// Volumes (the Go SDK's WithVolumes): refused with a 400 that names
	// volumes, not an unknown-field error.
	for _, tc := range []struct {
		what string
		req  oldClaimRequest
	}{
		{"claim with volumes", oldClaimRequest{Template: confTemplate, Volumes: []oldVolume{{Name: "data"}}}},
		{"claim with volumes_attach_only", oldClaimRequest{Template: confTemplate, Volumes: []oldVolume{{Name: "data"}}, VolumesAttachOnly: true}},
	} {
		r = n.call(t, "POST", "/v1/claim", confRoot, goBody(t, tc.req))
		if want(t, tc.what, r, http.StatusBadRequest, "") && (!strings.Contains(string(r.body), "volume") || strings.Contains(string(r.body), "unknown field")) {
			t.Errorf("%s: %s, want an error naming volumes, not an unknown field", tc.what, r.body)
		}
	}
	// Bad bodies and keys.
	want(t, "claim with no body", n.call(t, "POST", "/v1/claim", confRoot, nil), http.StatusBadRequest, errBadBody+"*")
	want(t, "claim with malformed JSON", n.call(t, "POST", "/v1/claim", confRoot, []byte(`{"template":`)), http.StatusBadRequest, errBadBody+"*")
	want(t, "claim of an unknown size", n.call(t, "POST", "/v1/claim", confRoot, goBody(t, oldClaimRequest{Template: confTemplate, Size: "huge"})), http.StatusBadRequest, "invalid pool key*")
	want(t, "claim of an unknown net", n.call(t, "POST", "/v1/claim", confRoot, goBody(t, oldClaimRequest{Template: confTemplate, Net: "lan"})), http.StatusBadRequest, "invalid pool key*")
	want(t, "claim of an empty template", n.call(t, "POST", "/v1/claim", confRoot, []byte(`{"template":""}`)), http.StatusBadRequest, "invalid pool key*")
	// A template that does not exist: the old daemon tried a cold boot and
	// answered 500 "provisioning failed"; here it is its 404 "unknown
	// template" (naming it) at once, before anything is recorded.
	r = n.call(t, "POST", "/v1/claim", confRoot, goBody(t, oldClaimRequest{Template: "no-such-template"}))
	want(t, "claim of a template that does not exist", r, http.StatusNotFound, "unknown template*")
}

// conformRelease: POST /v1/sandboxes/{id}/release, no body, 204; a second
// release, a tenant token and an unknown id are 404 "unknown sandbox"
// (which the SDKs' Close maps to success); no bearer is 401.
func conformRelease(t *testing.T, n *oldNode) {
	a, ok1 := n.claim(t, confRoot, oldClaimRequest{Template: confTemplate})
	b, ok2 := n.claim(t, confTenant, oldClaimRequest{Template: confTemplate})
	if !ok1 || !ok2 {
		return
	}
	want(t, "release without a bearer", n.call(t, "POST", "/v1/sandboxes/"+a.ID+"/release", "", nil), http.StatusUnauthorized, errMissingBearer)
	want(t, "release of root's sandbox with a tenant token", n.call(t, "POST", "/v1/sandboxes/"+a.ID+"/release", confTenant, nil), http.StatusNotFound, errUnknownSandbox)
	want(t, "release with another sandbox's token", n.call(t, "POST", "/v1/sandboxes/"+a.ID+"/release", b.Token, nil), http.StatusNotFound, errUnknownSandbox)
	want(t, "release of an unknown id", n.call(t, "POST", "/v1/sandboxes/sb_0123456789abcdef/release", confRoot, nil), http.StatusNotFound, errUnknownSandbox)
	want(t, "release with the sandbox token", n.call(t, "POST", "/v1/sandboxes/"+a.ID+"/release", a.Token, nil), http.StatusNoContent, "")
	// Differs: a second release is an idempotent 204 (the old daemon had
	// forgotten the claim: 404); the SDKs' Close takes both as success.
	want(t, "second release", n.call(t, "POST", "/v1/sandboxes/"+a.ID+"/release", a.Token, nil), http.StatusNoContent, "")
	want(t, "release by id with the root token", n.call(t, "POST", "/v1/sandboxes/"+b.ID+"/release", confRoot, nil), http.StatusNoContent, "")
	// Differs: the ended claim is still shown, by its final state (sbxlog's
	// "state" field; an old row has no such field to read it from).
	if got, ok := answer200[struct {
		State string `json:"state"`
	}](t, "GET a released sandbox", n.call(t, "GET", "/v1/sandboxes/"+a.ID, confRoot, nil), "state"); ok && got.State != "released" {
		t.Errorf("GET a released sandbox: state %q, want released", got.State)
	}
}

// conformHibernateWake: hibernate and wake answer 204 once done: right
// after a hibernate's answer the sandbox is hibernated, and a wake sent at
// once is not refused; after the wake's answer it runs.
func conformHibernateWake(t *testing.T, n *oldNode) {
	c, ok := n.scratch(t)
	if !ok {
		return
	}
	path := "/v1/sandboxes/" + c.ID
	want(t, "hibernate without a bearer", n.call(t, "POST", path+"/hibernate", "", nil), http.StatusUnauthorized, errMissingBearer)
	want(t, "hibernate with a tenant token", n.call(t, "POST", path+"/hibernate", confTenant, nil), http.StatusNotFound, errUnknownSandbox)
	want(t, "hibernate of an unknown id", n.call(t, "POST", "/v1/sandboxes/sb_0123456789abcdef/hibernate", confRoot, nil), http.StatusNotFound, errUnknownSandbox)
	want(t, "wake without a bearer", n.call(t, "POST", path+"/wake", "", nil), http.StatusUnauthorized, errMissingBearer)
	want(t, "wake with a tenant token", n.call(t, "POST", path+"/wake", confTenant, nil), http.StatusNotFound, errUnknownSandbox)

	// The Go SDK's Hibernate: the sandbox token, no body, exactly 204.
	if want(t, "hibernate (Go SDK)", n.call(t, "POST", path+"/hibernate", c.Token, nil), http.StatusNoContent, "") {
		if sb, ok := n.row(t, c.ID); ok && !sb.Hibernated {
			t.Errorf("right after hibernate's 204 the row says hibernated false: the call answered before the snapshot")
		}
	}
	want(t, "hibernate again (idempotent)", n.call(t, "POST", path+"/hibernate", c.Token, nil), http.StatusNoContent, "")
	// The operator's Wake: the root token, no body, 204, at once.
	if want(t, "wake right after hibernate (operator)", n.call(t, "POST", path+"/wake", confRoot, nil), http.StatusNoContent, "") {
		if sb, ok := n.row(t, c.ID); ok && sb.Hibernated {
			t.Errorf("right after wake's 204 the row says hibernated true: the call answered before the restore")
		}
	}
	want(t, "wake of a running sandbox (idempotent)", n.call(t, "POST", path+"/wake", c.Token, nil), http.StatusNoContent, "")
	// A hibernate then a release, back to back.
	if want(t, "hibernate before a release", n.call(t, "POST", path+"/hibernate", c.Token, nil), http.StatusNoContent, "") {
		want(t, "release right after hibernate", n.call(t, "POST", path+"/release", c.Token, nil), http.StatusNoContent, "")
	}
}

// conformRenew: the operator's Renew body (both fields optional, possibly
// {}), no body at all meaning ttl 0 (the 5 min default), a TTL over 24 h
// clamped; answered {"deadline"}.
func conformRenew(t *testing.T, n *oldNode) {
	c, ok := n.scratch(t)
	if !ok {
		return
	}
	path := "/v1/sandboxes/" + c.ID + "/renew"
	for _, tc := range []struct {
		what  string
		token string
		body  []byte
		ttl   time.Duration
	}{
		{"renew ttl 3600 (operator)", confRoot, []byte(`{"ttl_seconds":3600}`), time.Hour},
		{"renew {} (operator, all fields omitted)", confRoot, []byte(`{}`), 5 * time.Minute},
		{"renew with no body", c.Token, nil, 5 * time.Minute},
		{"renew over 24 h (clamped)", c.Token, []byte(`{"ttl_seconds":200000}`), 24 * time.Hour},
		{"renew on_expire destroy", confRoot, []byte(`{"ttl_seconds":600,"on_expire":"destroy"}`), 10 * time.Minute},
	} {
		start := time.Now()
		r := n.call(t, "POST", path, tc.token, tc.body)
		var out struct {
			Deadline time.Time `json:"deadline"`
		}
		if want(t, tc.what, r, http.StatusOK, "") && decodeOld(t, tc.what, r, &out) && !near(out.Deadline, start.Add(tc.ttl), 30*time.Second) {
			t.Errorf("%s: deadline %v, want about %v from now", tc.what, out.Deadline, tc.ttl)
		}
	}
	want(t, "renew with a malformed body", n.call(t, "POST", path, c.Token, []byte(`{"ttl_seconds":"x"}`)), http.StatusBadRequest, errBadBody+"*")
	want(t, "renew without a bearer", n.call(t, "POST", path, "", []byte(`{"ttl_seconds":60}`)), http.StatusUnauthorized, errMissingBearer)
	want(t, "renew with a tenant token", n.call(t, "POST", path, confTenant, []byte(`{"ttl_seconds":60}`)), http.StatusNotFound, errUnknownSandbox)
	want(t, "renew of an unknown id", n.call(t, "POST", "/v1/sandboxes/sb_0123456789abcdef/renew", confRoot, []byte(`{}`)), http.StatusNotFound, errUnknownSandbox)
}

// conformOwner: GET /v1/sandboxes/{id}/owner takes only the sandbox's own
// token (the SDKs' Lookup); anything else is 404 "not owned here".
func conformOwner(t *testing.T, n *oldNode) {
	c, ok := n.scratch(t)
	if !ok {
		return
	}
	path := "/v1/sandboxes/" + c.ID + "/owner"
	out, ok := answer200[struct {
		OwnerAddr string `json:"owner_addr"`
	}](t, "owner with the sandbox token", n.call(t, "GET", path, c.Token, nil), "owner_addr")
	if ok && out.OwnerAddr != "" && out.OwnerAddr != n.addr {
		t.Errorf("owner_addr %q, want %q", out.OwnerAddr, n.addr)
	}
	// Differs: root (and the sandbox's own tenant) may ask too, an sbxlog
	// extension; a tenant that does not own it is told nothing.
	if out, ok := answer200[struct {
		OwnerAddr string `json:"owner_addr"`
	}](t, "owner with the root token", n.call(t, "GET", path, confRoot, nil), "owner_addr"); ok && out.OwnerAddr != n.addr {
		t.Errorf("owner with the root token: owner_addr %q, want %q", out.OwnerAddr, n.addr)
	}
	want(t, "owner with a tenant token", n.call(t, "GET", path, confTenant, nil), http.StatusNotFound, errNotOwnedHere)
	want(t, "owner of an unknown id", n.call(t, "GET", "/v1/sandboxes/sb_0123456789abcdef/owner", c.Token, nil), http.StatusNotFound, errNotOwnedHere)
	want(t, "owner without a bearer", n.call(t, "GET", path, "", nil), http.StatusUnauthorized, errMissingBearer)
}

// conformSandboxes: GET /v1/sandboxes (root, tenant-scoped, filters) and
// GET /v1/sandboxes/{id} (root, with the sandbox token), in the old row
// shape.
func conformSandboxes(t *testing.T, n *oldNode) {
	start := time.Now()
	rc, ok1 := n.claim(t, confRoot, oldClaimRequest{Template: confTemplate, ClaimRef: "rows-root", TTLSeconds: 600})
	r := n.call(t, "POST", "/v1/claim", confTenant, []byte(`{"template":"conf","claim_ref":"rows-acme","metadata":{"team":"a"}}`))
	var tc oldClaimResponse
	ok2 := want(t, "tenant claim", r, http.StatusOK, "") && decodeOld(t, "tenant claim", r, &tc)
	if !ok1 || !ok2 {
		return
	}
	defer n.call(t, "POST", "/v1/sandboxes/"+rc.ID+"/release", confRoot, nil)
	defer n.call(t, "POST", "/v1/sandboxes/"+tc.ID+"/release", confRoot, nil)

	list := func(what, token, query string) []oldSandbox {
		t.Helper()
		out, ok := answer200[oldSandboxList](t, what, n.call(t, "GET", "/v1/sandboxes"+query, token, nil), "sandboxes")
		if !ok {
			return nil
		}
		if out.Sandboxes == nil {
			t.Errorf("%s: sandboxes is null, want a list", what)
		}
		return out.Sandboxes
	}
	ids := func(rows []oldSandbox) []string {
		var out []string
		for _, sb := range rows {
			out = append(out, sb.ID)
		}
		return out
	}
	rows := list("list as root", confRoot, "")
	var rootRow, tenantRow *oldSandbox
	for i := range rows {
		switch rows[i].ID {
		case rc.ID:
			rootRow = &rows[i]
		case tc.ID:
			tenantRow = &rows[i]
		}
		if rows[i].Token != "" {
			t.Errorf("list row %s carries a token", rows[i].ID)
		}
		if i > 0 && rows[i-1].ID >= rows[i].ID {
			t.Errorf("list not sorted by id: %v", ids(rows))
		}
	}
	wantKey := oldKey{Template: confTemplate, Net: "none", Size: "small"}
	switch {
	case rootRow == nil || tenantRow == nil:
		t.Errorf("list as root: %v, want both %s and %s", ids(rows), rc.ID, tc.ID)
	default:
		if rootRow.Key != wantKey || rootRow.ClaimRef != "rows-root" || rootRow.Tenant != "" || rootRow.Hibernated ||
			!near(rootRow.ClaimedAt, start, time.Minute) || !near(rootRow.Deadline, rc.Deadline, time.Second) ||
			rootRow.CPUCount != 1 || rootRow.MemTotalBytes != 512<<20 {
			t.Errorf("root's row %+v, want key %+v, claim_ref, claimed_at now, the claim's deadline, 1 CPU and 512 MiB", *rootRow, wantKey)
		}
		if tenantRow.Tenant != "acme" || tenantRow.ClaimRef != "rows-acme" || tenantRow.Metadata["team"] != "a" {
			t.Errorf("acme's row %+v, want tenant acme, its claim_ref and metadata", *tenantRow)
		}
	}
	if got := ids(list("list as the tenant", confTenant, "")); len(got) != 1 || got[0] != tc.ID {
		t.Errorf("list as acme: %v, want only [%s]", got, tc.ID)
	}
	if got := ids(list("list ?claim_ref=", confRoot, "?claim_ref=rows-root")); len(got) != 1 || got[0] != rc.ID {
		t.Errorf("list ?claim_ref=rows-root: %v, want [%s]", got, rc.ID)
	}
	if got := ids(list("list ?metadata=", confRoot, "?metadata=team%3Da")); len(got) != 1 || got[0] != tc.ID {
		t.Errorf("list ?metadata=team=a: %v, want [%s]", got, tc.ID)
	}
	if got := ids(list("list ?tenant= as root", confRoot, "?tenant=acme")); len(got) != 1 || got[0] != tc.ID {
		t.Errorf("list ?tenant=acme: %v, want [%s]", got, tc.ID)
	}
	want(t, "list with a metadata filter without =", n.call(t, "GET", "/v1/sandboxes?metadata=team", confRoot, nil), http.StatusBadRequest, "")

	// One row by id, as root: the row plus the sandbox's token (the
	// operator's Sandbox(id)).
	if sb, ok := n.row(t, tc.ID); ok {
		if sb.ID != tc.ID || sb.Key != wantKey || sb.Tenant != "acme" || sb.Token != tc.Token {
			t.Errorf("GET /v1/sandboxes/{id} as root: %+v, want the row with the sandbox token", sb)
		}
	}
	want(t, "GET /v1/sandboxes/{id} of an unknown id", n.call(t, "GET", "/v1/sandboxes/sb_0123456789abcdef", confRoot, nil), http.StatusNotFound, errUnknownSandbox)
}

// conformStats: GET /v1/sandboxes/{id}/stats, root: the size's CPUs and
// memory, the VMM's resident set, every key always present; a hibernated
// sandbox is unmeasured.
func conformStats(t *testing.T, n *oldNode) {
	c, ok := n.scratch(t)
	if !ok {
		return
	}
	path := "/v1/sandboxes/" + c.ID + "/stats"
	stats := func(what string) (oldStats, bool) {
		t.Helper()
		return answer200[oldStats](t, what, n.call(t, "GET", path, confRoot, nil),
			"id", "cpu_count", "mem_total_bytes", "mem_used_bytes", "mem_used_measured", "hibernated", "measured_at")
	}
	if s, ok := stats("stats of a running sandbox"); ok {
		if s.ID != c.ID || s.CPUCount != 1 || s.MemTotalBytes != 512<<20 || !s.MemUsedMeasured || s.MemUsedBytes <= 0 || s.Hibernated ||
			!near(s.MeasuredAt, time.Now(), time.Minute) || s.MeasuredAt.Location() != time.UTC {
			t.Errorf("stats of a running sandbox: %+v, want 1 CPU, 512 MiB, a measured RSS, measured_at now in UTC", s)
		}
	}
	want(t, "stats of an unknown id", n.call(t, "GET", "/v1/sandboxes/sb_0123456789abcdef/stats", confRoot, nil), http.StatusNotFound, errUnknownSandbox)
	// Hibernated (whenever the hibernate's snapshot is done): unmeasured.
	if r := n.call(t, "POST", "/v1/sandboxes/"+c.ID+"/hibernate", confRoot, nil); r.status != http.StatusNoContent {
		t.Errorf("hibernate: %d %s", r.status, r.body)
		return
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		s, ok := stats("stats while hibernating")
		if !ok {
			return
		}
		if s.Hibernated {
			if s.MemUsedMeasured || s.MemUsedBytes != 0 {
				t.Errorf("stats of a hibernated sandbox: %+v, want mem_used_measured false, mem_used_bytes 0", s)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("stats never said hibernated: %+v", s)
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// conformInfoPools: GET /v1/info and PUT /v1/pools as the Go SDK and the
// operator send them, answered with the old NodeInfo.
func conformInfoPools(t *testing.T, n *oldNode) {
	info := func(what string, r reply) (oldNodeInfo, bool) {
		t.Helper()
		in, ok := answer200[oldNodeInfo](t, what, r, "pools", "claimed", "hibernated", "archived")
		if !ok {
			return in, false
		}
		if in.Pools == nil {
			t.Errorf("%s: pools is null, want a list", what)
		}
		return in, true
	}
	poolOf := func(in oldNodeInfo, k oldKey) (oldPoolInfo, bool) {
		return first(in.Pools, func(p oldPoolInfo) bool { return p.Key == k })
	}
	key := oldKey{Template: confTemplate, Net: "none", Size: "small"}
	if in, ok := info("GET /v1/info", n.call(t, "GET", "/v1/info", confRoot, nil)); ok {
		if p, found := poolOf(in, key); !found || !p.Golden || p.Target != 2 {
			t.Errorf("GET /v1/info pools %+v, want %+v with golden true and target 2", in.Pools, key)
		}
	}
	// The Go SDK's SetPools: warm always sent, the rest when set.
	body := goBody(t, map[string]any{"pools": []oldPoolSpec{{Template: confTemplate, Warm: 2, WarmMax: 4}, {Template: "conf-b", Size: "medium", Warm: 0, IdleHibernateSeconds: 600}}})
	if in, ok := info("PUT /v1/pools (Go SDK)", n.call(t, "PUT", "/v1/pools", confRoot, body)); ok {
		if p, found := poolOf(in, oldKey{Template: "conf-b", Net: "none", Size: "medium"}); !found || p.Target != 0 {
			t.Errorf("PUT /v1/pools answer pools %+v, want conf-b/none/medium with target 0", in.Pools)
		}
	}
	// The operator's SetPools: template, net, size, warm.
	body = []byte(`{"pools":[{"template":"conf","net":"none","size":"small","warm":2}]}`)
	if in, ok := info("PUT /v1/pools (operator)", n.call(t, "PUT", "/v1/pools", confRoot, body)); ok {
		if _, found := poolOf(in, oldKey{Template: "conf-b", Net: "none", Size: "medium"}); found {
			t.Errorf("PUT /v1/pools without conf-b still lists it: %+v", in.Pools)
		}
		if p, found := poolOf(in, key); !found || p.Target != 2 {
			t.Errorf("PUT /v1/pools (operator) pools %+v, want %+v target 2", in.Pools, key)
		}
	}
	want(t, "PUT /v1/pools with an unknown key", n.call(t, "PUT", "/v1/pools", confRoot, []byte(`{"pools":[{"template":"conf","warm":2,"colour":"red"}]}`)), http.StatusBadRequest, errBadBody+"*")
	want(t, "PUT /v1/pools with a nested key", n.call(t, "PUT", "/v1/pools", confRoot, []byte(`{"pools":[{"key":{"template":"conf"},"warm":2}]}`)), http.StatusBadRequest, errBadBody+"*")
	want(t, "PUT /v1/pools with a config-owned key", n.call(t, "PUT", "/v1/pools", confRoot, []byte(`{"pools":[{"template":"conf","warm":2,"warmup":true}]}`)), http.StatusBadRequest, "")
	want(t, "PUT /v1/pools with warm < 0", n.call(t, "PUT", "/v1/pools", confRoot, []byte(`{"pools":[{"template":"conf","warm":-1}]}`)), http.StatusBadRequest, "")
	want(t, "PUT /v1/pools with warm_max < warm", n.call(t, "PUT", "/v1/pools", confRoot, []byte(`{"pools":[{"template":"conf","warm":3,"warm_max":2}]}`)), http.StatusBadRequest, "")
	n.warmPools(t, 1)
}

// conformPeers: GET /v1/peers, root or tenant: a single node has none.
func conformPeers(t *testing.T, n *oldNode) {
	for _, tok := range []string{confRoot, confTenant} {
		out, ok := answer200[struct {
			Peers []string `json:"peers"`
		}](t, "GET /v1/peers", n.call(t, "GET", "/v1/peers", tok, nil), "peers")
		if ok && len(out.Peers) != 0 {
			t.Errorf("GET /v1/peers on a single node: %v, want none", out.Peers)
		}
	}
}

// conformTenants: the Go SDK's tenant calls.
func conformTenants(t *testing.T, n *oldNode) {
	tenants := func(what string, r reply) (oldTenantList, bool) {
		t.Helper()
		out, ok := answer200[oldTenantList](t, what, r, "tenants", "digest")
		if !ok {
			return out, false
		}
		for _, tok := range []string{confTenant, "beta-token", "west-token", sha256Hex(confTenant)} {
			if bytes.Contains(r.body, []byte(tok)) {
				t.Errorf("%s: a tenant token (or its hash) is served back: %s", what, r.body)
			}
		}
		return out, true
	}
	find := func(l oldTenantList, name string) (oldTenant, bool) {
		return first(l.Tenants, func(tn oldTenant) bool { return tn.Name == name })
	}
	// acme (from the config) holds one live claim.
	c, ok := n.claim(t, confTenant, oldClaimRequest{Template: confTemplate})
	if ok {
		defer n.call(t, "POST", "/v1/sandboxes/"+c.ID+"/release", confRoot, nil)
	}
	if l, ok := tenants("GET /v1/tenants", n.call(t, "GET", "/v1/tenants", confRoot, nil)); ok {
		if a, found := find(l, "acme"); !found || a.Claims != 1 {
			t.Errorf("GET /v1/tenants: %+v, want acme with 1 claim", l.Tenants)
		}
	}
	// PutTenant: a new tenant with a token and a cap, 204, and it claims.
	want(t, "PUT /v1/tenants/beta", n.call(t, "PUT", "/v1/tenants/beta", confRoot, goBody(t, oldTenantSpec{Token: "beta-token", MaxClaims: 3})), http.StatusNoContent, "")
	if bc, ok := n.claim(t, "beta-token", oldClaimRequest{Template: confTemplate}); ok {
		n.call(t, "POST", "/v1/sandboxes/"+bc.ID+"/release", bc.Token, nil)
	}
	// A name the SDK escapes (url.PathEscape).
	want(t, "PUT /v1/tenants/u:42%2Fwest", n.call(t, "PUT", "/v1/tenants/u:42%2Fwest", confRoot, goBody(t, oldTenantSpec{Token: "west-token"})), http.StatusNoContent, "")
	if l, ok := tenants("GET /v1/tenants?limit=50", n.call(t, "GET", "/v1/tenants?limit=50", confRoot, nil)); ok {
		if b, found := find(l, "beta"); !found || b.MaxClaims != 3 {
			t.Errorf("GET /v1/tenants after PUT beta: %+v, want beta with max_claims 3", l.Tenants)
		}
		if _, found := find(l, "u:42/west"); !found {
			t.Errorf("GET /v1/tenants: %+v, want u:42/west (the path unescaped)", l.Tenants)
		}
	}
	// Paging: after= and limit=.
	if l, ok := tenants("GET /v1/tenants?after=&limit=", n.call(t, "GET", "/v1/tenants?after=acme&limit=1", confRoot, nil)); ok {
		if len(l.Tenants) != 1 || l.Tenants[0].Name != "beta" || l.Next == "" {
			t.Errorf("GET /v1/tenants?after=acme&limit=1: %+v next %q, want [beta] and a next cursor", l.Tenants, l.Next)
		}
	}
	want(t, "GET /v1/tenants?limit=0", n.call(t, "GET", "/v1/tenants?limit=0", confRoot, nil), http.StatusBadRequest, "limit must be 1..10000")
	want(t, "PUT /v1/tenants/{name} with an unknown key", n.call(t, "PUT", "/v1/tenants/beta", confRoot, []byte(`{"token":"b","egress":{}}`)), http.StatusBadRequest, errBadBody+"*")
	want(t, "PUT /v1/tenants/{name} of a new tenant without a token", n.call(t, "PUT", "/v1/tenants/gamma", confRoot, []byte(`{}`)), http.StatusBadRequest, "")
	// SetTenants: the whole set; acme keeps its token (none sent), beta
	// gets a new one, u:42/west is removed.
	body := goBody(t, map[string]any{"tenants": []oldTenantSpec{{Name: "acme"}, {Name: "beta", Token: "beta-token-2"}}})
	if l, ok := tenants("PUT /v1/tenants", n.call(t, "PUT", "/v1/tenants", confRoot, body)); ok {
		if _, found := find(l, "u:42/west"); found {
			t.Errorf("PUT /v1/tenants without u:42/west still lists it: %+v", l.Tenants)
		}
	}
	want(t, "beta's old token after the rotation", n.call(t, "GET", "/v1/sandboxes", "beta-token", nil), http.StatusUnauthorized, errInvalidAPIToken)
	want(t, "acme's token kept", n.call(t, "GET", "/v1/sandboxes", confTenant, nil), http.StatusOK, "")
	// DeleteTenant: 204, then 404 "unknown tenant" (DeleteTenantCluster
	// compares the text).
	want(t, "DELETE /v1/tenants/beta", n.call(t, "DELETE", "/v1/tenants/beta", confRoot, nil), http.StatusNoContent, "")
	want(t, "DELETE /v1/tenants/beta again", n.call(t, "DELETE", "/v1/tenants/beta", confRoot, nil), http.StatusNotFound, errUnknownTenant)
	want(t, "a deleted tenant's token", n.call(t, "GET", "/v1/sandboxes", "beta-token-2", nil), http.StatusUnauthorized, errInvalidAPIToken)
}

// conformDrain: POST /v1/drain and DELETE /v1/drain, no body, answered
// with the info body; a draining node refuses claims with 429.
func conformDrain(t *testing.T, n *oldNode) {
	r := n.call(t, "POST", "/v1/drain", confRoot, nil)
	var in oldNodeInfo
	if want(t, "POST /v1/drain", r, http.StatusOK, "") && decodeOld(t, "POST /v1/drain", r, &in) && !in.Draining {
		t.Errorf("POST /v1/drain: %s, want draining true", r.body)
	}
	r = n.call(t, "POST", "/v1/claim", confRoot, goBody(t, oldClaimRequest{Template: confTemplate}))
	if !want(t, "claim while draining", r, http.StatusTooManyRequests, errDraining) && r.status == http.StatusOK {
		var c oldClaimResponse
		if json.Unmarshal(r.body, &c) == nil {
			n.call(t, "POST", "/v1/sandboxes/"+c.ID+"/release", c.Token, nil)
		}
	}
	r = n.call(t, "GET", "/v1/info", confRoot, nil)
	if want(t, "GET /v1/info while draining", r, http.StatusOK, "") && decodeOld(t, "GET /v1/info while draining", r, &in) && !in.Draining {
		t.Errorf("GET /v1/info while draining: %s, want draining true", r.body)
	}
	r = n.call(t, "DELETE", "/v1/drain", confRoot, nil)
	if want(t, "DELETE /v1/drain", r, http.StatusOK, "") {
		var m map[string]json.RawMessage
		if json.Unmarshal(r.body, &m) == nil {
			if d, ok := m["draining"]; ok && string(d) != "false" {
				t.Errorf("DELETE /v1/drain: %s, want no draining", r.body)
			}
		}
	}
	if c, ok := n.claim(t, confRoot, oldClaimRequest{Template: confTemplate}); ok {
		n.call(t, "POST", "/v1/sandboxes/"+c.ID+"/release", c.Token, nil)
	}
}

// conformMetrics: GET /metrics, root only, with the old sandboxd_*
// families (names, label names, types) a scraper parses.
func conformMetrics(t *testing.T, n *oldNode) {
	want(t, "GET /metrics without a token", n.call(t, "GET", "/metrics", "", nil), http.StatusUnauthorized, errInvalidAPIToken)
	want(t, "GET /metrics as a tenant", n.call(t, "GET", "/metrics", confTenant, nil), http.StatusForbidden, errOperatorRequired)
	// acme holds a live claim, so its gauge is served.
	c, ok := n.claim(t, confTenant, oldClaimRequest{Template: confTemplate})
	if ok {
		defer n.call(t, "POST", "/v1/sandboxes/"+c.ID+"/release", confRoot, nil)
	}
	r := n.call(t, "GET", "/metrics", confRoot, nil)
	if !want(t, "GET /metrics", r, http.StatusOK, "") {
		return
	}
	if ct := r.header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
		t.Errorf("GET /metrics: Content-Type %q, want text/plain", ct)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(r.body))
	if err != nil {
		t.Fatalf("a Prometheus server cannot parse /metrics: %v", err)
	}
	gauge, counter := dto.MetricType_GAUGE, dto.MetricType_COUNTER
	for _, f := range []struct {
		name   string
		typ    dto.MetricType
		labels []string
	}{
		{"sandboxd_claimed", gauge, nil}, {"sandboxd_hibernated", gauge, nil}, {"sandboxd_archived", gauge, nil},
		{"sandboxd_failed", gauge, nil}, {"sandboxd_draining", gauge, nil}, {"sandboxd_tenant_claims", gauge, []string{"tenant"}},
		{"sandboxd_pool_warm", gauge, []string{"net", "size", "template"}}, {"sandboxd_pool_target", gauge, []string{"net", "size", "template"}},
		{"sandboxd_claims_total", counter, []string{"tier"}}, {"sandboxd_claim_seconds_total", counter, nil},
		{"sandboxd_wake_seconds_total", counter, nil}, {"sandboxd_wakes_total", counter, nil},
		{"sandboxd_hibernates_total", counter, nil}, {"sandboxd_releases_total", counter, nil}, {"sandboxd_reaps_total", counter, nil},
	} {
		fam, ok := fams[f.name]
		if !ok {
			t.Errorf("/metrics has no %s", f.name)
			continue
		}
		if fam.GetType() != f.typ {
			t.Errorf("%s is a %s, want a %s", f.name, fam.GetType(), f.typ)
		}
		for _, m := range fam.GetMetric() {
			var names []string
			for _, l := range m.GetLabel() {
				names = append(names, l.GetName())
			}
			if fmt.Sprint(names) != fmt.Sprint(f.labels) {
				t.Errorf("%s has labels %v, want %v", f.name, names, f.labels)
			}
		}
	}
	if fam := fams["sandboxd_claims_total"]; fam != nil {
		tiers := map[string]float64{}
		for _, m := range fam.GetMetric() {
			tiers[m.GetLabel()[0].GetValue()] = m.GetCounter().GetValue()
		}
		if _, ok := tiers["cold"]; !ok || len(tiers) != 3 || tiers["warm"]+tiers["clone"] < 1 {
			t.Errorf("sandboxd_claims_total %v, want warm, clone and cold, and the claims this suite made", tiers)
		}
	}
	if fam := fams["sandboxd_tenant_claims"]; fam != nil {
		found := false
		for _, m := range fam.GetMetric() {
			found = found || (m.GetLabel()[0].GetValue() == "acme" && m.GetGauge().GetValue() >= 1)
		}
		if !found {
			t.Errorf("sandboxd_tenant_claims has no acme sample while acme holds a claim")
		}
	}
}
