package api_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"testing"

	"github.com/sbxlog/sbxlog/projections/api"
)

// GET /v1/templates lists every template a claim may name here, each with
// its kind, scoped as GET /v1/info's templates are (a tenant sees its own
// promoted ones); a claim of any other is 404 naming what the caller may
// claim (issue 25 item 3: templates were only names, the 404 said nothing
// of what exists).
func TestTemplatesListed(t *testing.T) {
	n := newNode(t, 2, nil)
	n.Driver.SetTemplates("default", "busybox")
	promote := func(token, sandboxToken, id, name string) {
		t.Helper()
		b, _ := json.Marshal(api.PromoteRequest{Token: sandboxToken, Template: name})
		if st, out := call(t, n, "POST", "/v1/sandboxes/"+id+"/promote", token, b); st != http.StatusOK {
			t.Fatalf("promote %s: %d %s", name, st, out)
		}
	}
	a := claimAs(t, n, tokA, "")
	promote(tokA, a.Token, a.ID, "app:v1")
	r := claimAs(t, n, rootTok, "")
	promote(rootTok, "", r.ID, "root-tpl")
	settle(t, n)

	if st, b := call(t, n, "GET", "/v1/templates", "", nil); st != http.StatusUnauthorized {
		t.Fatalf("no token: %d %s", st, b)
	}
	row := func(e api.TemplateEntry) string {
		return fmt.Sprintf("%s %s %s/%s %s", e.Template, e.Kind, e.Net, e.Size, e.Tenant)
	}
	var (
		busybox    = "busybox image / "
		configured = "default configured none/small "
		image      = "default image / "
		appV1      = "app:v1 promoted none/small a"
		rootTpl    = "root-tpl promoted none/small "
	)
	for _, tc := range []struct {
		who, token string
		rows       []string
		names      string
	}{
		{"root", rootTok, []string{appV1, busybox, configured, image, rootTpl}, "app:v1, busybox, default, root-tpl"},
		{"tenant a", tokA, []string{appV1, busybox, configured, image}, "app:v1, busybox, default"},
		{"tenant b", tokB, []string{busybox, configured, image}, "busybox, default"},
	} {
		t.Run(tc.who, func(t *testing.T) {
			st, b := call(t, n, "GET", "/v1/templates", tc.token, nil)
			var res api.TemplatesResponse
			if st != http.StatusOK || json.Unmarshal(b, &res) != nil {
				t.Fatalf("GET /v1/templates: %d %s", st, b)
			}
			var got []string
			for _, e := range res.Templates {
				got = append(got, row(e))
				if e.Kind == api.TemplatePromoted && (e.ContentDigest == "" || e.Net == "") {
					t.Errorf("a promoted row without its key or digest: %+v", e)
				}
			}
			if !slices.Equal(got, tc.rows) {
				t.Fatalf("templates\n%q\nwant\n%q", got, tc.rows)
			}
			seq := n.Log.LastSeq()
			st, b = call(t, n, "POST", "/v1/claim", tc.token, []byte(`{"template":"nope"}`))
			wantError(t, "claim of an unknown template", st, b, http.StatusNotFound,
				"unknown template nope; templates here: "+tc.names+" (sbxctl templates, GET /v1/templates)")
			if got := n.Log.LastSeq(); got != seq {
				t.Fatalf("the refused claim appended events: log %d -> %d", seq, got)
			}
		})
	}

	// A long list is cut; GET /v1/templates has it whole.
	var many []string
	for i := range 20 {
		many = append(many, fmt.Sprintf("t%02d", i))
	}
	n.Driver.SetTemplates(many...)
	st, b := call(t, n, "PUT", "/v1/pools", rootTok, []byte(`{"pools":[{"template":"nope","warm":1}]}`))
	// The 16 first names: app:v1, default (the pool), root-tpl, t00 to t12.
	wantError(t, "pool of an unknown template", st, b, http.StatusNotFound,
		"unknown template nope; templates here: app:v1, default, root-tpl, t00, t01, t02, t03, t04, t05, t06, t07, t08, t09, t10, t11, t12 and 7 more (sbxctl templates, GET /v1/templates)")
}
