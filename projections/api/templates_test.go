package api_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/sbxlog/sbxlog/fsm"
	"github.com/sbxlog/sbxlog/projections/api"
)

// Promote, claim the template, label, delete: the old contract's fields,
// codes and auth (hypervisor faked).
func TestPromoteTemplates(t *testing.T) {
	n := newNode(t, 2, nil)
	cr := claimAs(t, n, tokA, "")
	body := func(token, name string) []byte {
		b, _ := json.Marshal(api.PromoteRequest{Token: token, Template: name})
		return b
	}
	promote := func(id, hdr string, b []byte) (int, string) {
		st, out := call(t, n, "POST", "/v1/sandboxes/"+id+"/promote", hdr, b)
		return st, string(out)
	}
	for _, c := range []struct {
		name, hdr string
		body      []byte
		want      int
	}{
		{"no node token", "", body(cr.Token, "app:v1"), http.StatusUnauthorized},
		{"another tenant without the sandbox token", tokB, body("", "app:v1"), http.StatusNotFound},
		{"a wrong sandbox token", tokA, body("nope", "app:v1"), http.StatusNotFound},
		{"a bad name", tokA, body(cr.Token, "bad name!"), http.StatusBadRequest},
		{"a configured pool's key", tokA, body(cr.Token, "default"), http.StatusConflict},
		{"an unknown field", tokA, []byte(`{"template":"x","bogus":1}`), http.StatusBadRequest},
	} {
		if st, out := promote(cr.ID, c.hdr, c.body); st != c.want {
			t.Errorf("%s: %d %s, want %d", c.name, st, out, c.want)
		}
	}
	st, out := promote(cr.ID, tokA, body(cr.Token, "app:v1"))
	if st != http.StatusOK {
		t.Fatalf("promote: %d %s", st, out)
	}
	var pr api.PromoteResponse
	if err := json.Unmarshal([]byte(out), &pr); err != nil || pr.Key != (api.TemplateKey{Template: "app:v1", Net: "none", Size: "small"}) || !strings.HasPrefix(pr.ContentDigest, "sha256:") {
		t.Fatalf("promote answer %s (%v)", out, err)
	}
	// Another tenant cannot replace it; root can act by id without a body token.
	if st, out := promote(cr.ID, tokB, body(cr.Token, "app:v1")); st != http.StatusConflict {
		t.Fatalf("another tenant's re-promote: %d %s", st, out)
	}
	// Claims of the key clone from the template.
	st, b := call(t, n, "POST", "/v1/claim", tokB, []byte(`{"template":"app:v1"}`))
	if st != http.StatusOK {
		t.Fatalf("claim of the template: %d %s", st, b)
	}
	var c2 api.ClaimResponse
	_ = json.Unmarshal(b, &c2)
	n.Engine.View(func(s *fsm.State) {
		if c, _ := s.Claim(c2.ID); c.Tier != fsm.TierClone {
			t.Errorf("claim of the template served %s", c.Tier)
		}
	})
	// Listed in /v1/info for root and for its tenant, not for another.
	infoTemplates := func(tok string) []api.TemplateInfo {
		var in api.Info
		st, b := call(t, n, "GET", "/v1/info", tok, nil)
		if st != http.StatusOK || json.Unmarshal(b, &in) != nil {
			t.Fatalf("info: %d %s", st, b)
		}
		return in.Templates
	}
	if ts := infoTemplates(rootTok); len(ts) != 1 || ts[0].Tenant != "a" || ts[0].ContentDigest != pr.ContentDigest || ts[0].MemTotalBytes != 512<<20 {
		t.Fatalf("templates %+v", ts)
	}
	// Labels: strict body, tenant scoped, digest precondition.
	q := "/v1/templates/labels?template=app:v1"
	for _, c := range []struct {
		tok, path, body string
		want            int
	}{
		{tokB, q, `{"labels":{"v":"1"}}`, http.StatusNotFound},
		{tokA, q, `{"labels":{"v":"1"},"x":1}`, http.StatusBadRequest},
		{tokA, q + "&digest=sha256:old", `{"labels":{"v":"1"}}`, http.StatusPreconditionFailed},
		{tokA, "/v1/templates/labels?template=default", `{"labels":{"v":"1"}}`, http.StatusConflict},
		{tokA, "/v1/templates/labels", `{"labels":{}}`, http.StatusBadRequest},
		{tokA, q + "&digest=" + pr.ContentDigest, `{"labels":{"v":"1"}}`, http.StatusNoContent},
	} {
		if st, b := call(t, n, "PUT", c.path, c.tok, []byte(c.body)); st != c.want {
			t.Errorf("PUT %s as %s: %d %s, want %d", c.path, c.tok, st, b, c.want)
		}
	}
	if ts := infoTemplates(rootTok); len(ts) != 1 || ts[0].Labels["v"] != "1" {
		t.Fatalf("labels not listed: %+v", ts)
	}
	// Delete: another tenant's is 404, a configured pool's 409, then 204 and 404.
	del := "/v1/templates?template=app:v1&net=none&size=small&no_redirect=1"
	for _, c := range []struct {
		tok, path string
		want      int
	}{
		{tokB, del, http.StatusNotFound},
		{rootTok, "/v1/templates?template=default", http.StatusConflict},
		{tokA, del, http.StatusNoContent},
		{tokA, del, http.StatusNotFound},
	} {
		if st, b := call(t, n, "DELETE", c.path, c.tok, nil); st != c.want {
			t.Errorf("DELETE %s as %s: %d %s, want %d", c.path, c.tok, st, b, c.want)
		}
	}
	if ts := infoTemplates(rootTok); len(ts) != 0 {
		t.Fatalf("deleted template listed: %+v", ts)
	}
	// The store view is root's.
	if st, _ := call(t, n, "GET", "/v1/store", tokA, nil); st != http.StatusForbidden {
		t.Fatalf("GET /v1/store as a tenant: %d", st)
	}
	var sr api.StoreResponse
	if st, b := call(t, n, "GET", "/v1/store", rootTok, nil); st != http.StatusOK || json.Unmarshal(b, &sr) != nil || len(sr.Snapshots) == 0 {
		t.Fatalf("GET /v1/store: %d %s", st, b)
	}
}

// A promote the hypervisor fails answers the old daemon's 500 with the
// reason, and the sandbox runs on.
func TestPromoteFails(t *testing.T) {
	n := newNode(t, 1, nil)
	cr := claimAs(t, n, tokA, "")
	n.Driver.FailPromotes.Store(true)
	b, _ := json.Marshal(api.PromoteRequest{Template: "app:v1"})
	st, out := call(t, n, "POST", "/v1/sandboxes/"+cr.ID+"/promote", rootTok, b)
	if st != http.StatusInternalServerError || !strings.Contains(string(out), "promote failed") {
		t.Fatalf("failed promote: %d %s", st, out)
	}
	waitState(t, n, cr.ID, "running")
}
