package api_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

// A claim whose clone fails answers the old daemon's 500 "provisioning
// failed", with the reason and the sandbox's id: the claim was committed
// (and failed), so the client can look it up.
func TestClaimWhoseCloneFailsNamesTheSandbox(t *testing.T) {
	n := newNode(t, 0, nil)
	n.Driver.FailClones.Store(true)
	st, b := doRoot(t, n.URL, "POST", "/v1/claim", `{"template":"default"}`)
	var e struct{ Error, ID, Reason string }
	if st != http.StatusInternalServerError || json.Unmarshal(b, &e) != nil || e.Error != "provisioning failed" || !strings.Contains(e.Reason, "failed") || e.ID == "" {
		t.Fatalf("claim with failing clones: %d %s, want 500 provisioning failed naming the reason and the id", st, b)
	}
	st, b = doRoot(t, n.URL, "GET", "/v1/sandboxes/"+e.ID, "")
	var sb struct{ State, Reason string }
	if st != http.StatusOK || json.Unmarshal(b, &sb) != nil || sb.State != "failed" || sb.Reason == "" {
		t.Fatalf("GET the failed claim: %d %s, want it failed with a reason", st, b)
	}
}
