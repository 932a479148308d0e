package api_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/sbxlog/sbxlog/cmd/sandboxd/node/nodetest"
	"github.com/sbxlog/sbxlog/projections/api"
)

// On a node with an archive store (api.Config.Archive; the hypervisor
// faked), a claim with on_expire "archive" is archived at the end of its
// lease and shown so (GET, the list and its state filter, info), a renew
// is 409, a wake brings it back running; pools take archive settings.
func TestArchiveAPI(t *testing.T) {
	n := newNode(t, 1, func(o *nodetest.Options) { o.Config.Archive = true })
	cr := claimAs(t, n, rootTok, `,"ttl_seconds":1,"on_expire":"archive"`)
	waitState(t, n, cr.ID, "archived")
	st, b := call(t, n, "GET", "/v1/sandboxes/"+cr.ID, rootTok, nil)
	var sb api.Sandbox
	if err := json.Unmarshal(b, &sb); err != nil || st != 200 || !sb.Archived || sb.Hibernated || sb.OnExpire != "archive" {
		t.Fatalf("GET: %d %s", st, b)
	}
	for q, want := range map[string]bool{"?state=archived": true, "?state=hibernated": false, "": true} {
		_, b := call(t, n, "GET", "/v1/sandboxes"+q, rootTok, nil)
		if strings.Contains(string(b), cr.ID) != want {
			t.Errorf("list %s: %s (want it listed: %v)", q, b, want)
		}
	}
	_, b = call(t, n, "GET", "/v1/info", rootTok, nil)
	var in api.Info
	if err := json.Unmarshal(b, &in); err != nil || in.Archived != 1 || in.Hibernated != 0 {
		t.Fatalf("info: %s", b)
	}
	if st, b := call(t, n, "POST", "/v1/sandboxes/"+cr.ID+"/renew", rootTok, []byte(`{"ttl_seconds":60}`)); st != http.StatusConflict {
		t.Fatalf("renew of an archived sandbox: %d %s", st, b)
	}
	if st, b := call(t, n, "POST", "/v1/sandboxes/"+cr.ID+"/wake", rootTok, nil); st != http.StatusNoContent {
		t.Fatalf("wake: %d %s", st, b)
	}
	if a, u := n.Driver.ArchiveCalls(); a != 1 || u != 1 {
		t.Fatalf("archives %d unarchives %d", a, u)
	}
	if st, b := call(t, n, "PUT", "/v1/pools", rootTok, []byte(`{"pools":[{"template":"default","warm":1,"idle_hibernate_seconds":60,"archive_after_seconds":600,"archive_delete_after_seconds":3600}]}`)); st != 200 {
		t.Fatalf("PUT pools with archive settings: %d %s", st, b)
	}
	for _, body := range []string{
		`{"pools":[{"template":"default","warm":1,"idle_hibernate_seconds":600,"archive_after_seconds":600}]}`,
		`{"pools":[{"template":"default","warm":1,"archive_after_seconds":-1}]}`,
	} {
		if st, b := call(t, n, "PUT", "/v1/pools", rootTok, []byte(body)); st != http.StatusBadRequest {
			t.Errorf("PUT pools %s: %d %s", body, st, b)
		}
	}
}
