package api_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"testing"

	"github.com/sbxlog/sbxlog/cmd/sandboxd/node/nodetest"
	"github.com/sbxlog/sbxlog/fsm"
	"github.com/sbxlog/sbxlog/projections/api"
)

func checkpointOf(t *testing.T, n *nodetest.Node, sb api.ClaimResponse, token, body string) (int, api.CheckpointRecord, []byte) {
	t.Helper()
	st, b := call(t, n, "POST", "/v1/sandboxes/"+sb.ID+"/checkpoint", token, []byte(body))
	var cr api.CheckpointResponse
	if st == http.StatusOK {
		if err := json.Unmarshal(b, &cr); err != nil {
			t.Fatalf("checkpoint reply %s: %v", b, err)
		}
	}
	return st, cr.Checkpoint, b
}

func listCheckpoints(t *testing.T, n *nodetest.Node, token string) []string {
	t.Helper()
	st, b := call(t, n, "GET", "/v1/checkpoints", token, nil)
	if st != http.StatusOK {
		t.Fatalf("list: %d %s", st, b)
	}
	var l api.CheckpointList
	if err := json.Unmarshal(b, &l); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, c := range l.Checkpoints {
		ids = append(ids, c.ID)
	}
	return ids
}

// The old contract's checkpoint tree: checkpoint a sandbox (tenant token +
// sandbox token), list it (the tenant's own only), claim from it (any
// caller, the checkpoint's key, from_checkpoint), delete it (owner or root;
// another tenant's is 404), and the codes of bad calls.
func TestCheckpointRoutes(t *testing.T) {
	n := newNode(t, 2, func(o *nodetest.Options) { o.Config.CheckpointTTL = 0 })
	sb := claimAs(t, n, tokA, "")

	st, ck, b := checkpointOf(t, n, sb, tokA, fmt.Sprintf(`{"token":%q,"name":"v1"}`, sb.Token))
	if st != http.StatusOK || !fsm.ValidCheckpointID(ck.ID) || ck.SandboxID != sb.ID || ck.Name != "v1" || ck.Tenant != "a" || ck.Key != defKey || ck.CreatedAt == "" {
		t.Fatalf("checkpoint: %d %s", st, b)
	}
	// Bad calls.
	for _, c := range []struct {
		token, body string
		want        int
	}{
		{tokA, `{"token":"wrong"}`, http.StatusNotFound},
		{tokB, fmt.Sprintf(`{"token":%q}`, sb.Token), http.StatusNotFound},
		{"nope", `{}`, http.StatusUnauthorized},
		{tokA, fmt.Sprintf(`{"token":%q,"name":"a b"}`, sb.Token), http.StatusBadRequest},
		{tokA, `{"token":1}`, http.StatusBadRequest},
		{tokA, fmt.Sprintf(`{"token":%q,"bogus":1}`, sb.Token), http.StatusBadRequest},
	} {
		if st, b := call(t, n, "POST", "/v1/sandboxes/"+sb.ID+"/checkpoint", c.token, []byte(c.body)); st != c.want {
			t.Errorf("checkpoint %s with %q: %d %s, want %d", c.body, c.token, st, b, c.want)
		}
	}
	// Root acts by id.
	st, ck2, b := checkpointOf(t, n, sb, rootTok, `{}`)
	if st != http.StatusOK || ck2.Tenant != "" {
		t.Fatalf("root checkpoint: %d %s", st, b)
	}
	if got := listCheckpoints(t, n, tokA); !slices.Equal(got, []string{ck.ID}) {
		t.Fatalf("tenant a lists %v", got)
	}
	if got := listCheckpoints(t, n, tokB); len(got) != 0 {
		t.Fatalf("tenant b lists %v", got)
	}
	if got := listCheckpoints(t, n, rootTok); !slices.Equal(got, []string{ck2.ID, ck.ID}) {
		t.Fatalf("root lists %v, want newest first", got)
	}
	// Claim from it, as tenant b: the capability is the id.
	st, b = call(t, n, "POST", "/v1/checkpoints/"+ck.ID+"/claim", tokB, []byte(`{"ttl_seconds":60}`))
	var branch api.ClaimResponse
	if st != http.StatusOK || json.Unmarshal(b, &branch) != nil || branch.FromCheckpoint != ck.ID || branch.Template != defKey.Template || branch.Tier != "clone" {
		t.Fatalf("claim from checkpoint: %d %s", st, b)
	}
	if st, b := call(t, n, "GET", "/v1/sandboxes/"+branch.ID, tokB, nil); st != http.StatusOK {
		t.Fatalf("branch not tenant b's: %d %s", st, b)
	}
	for _, bad := range []string{"ck_0000000000000000", "nothex", "ck_" + ck.ID} {
		if st, b := call(t, n, "POST", "/v1/checkpoints/"+bad+"/claim", tokA, []byte(`{}`)); st != http.StatusNotFound {
			t.Errorf("claim from %s: %d %s", bad, st, b)
		}
	}
	if st, b := call(t, n, "POST", "/v1/checkpoints/"+ck.ID+"/claim", tokA, []byte(`{"ttl_seconds":-1}`)); st != http.StatusBadRequest {
		t.Errorf("negative ttl: %d %s", st, b)
	}
	// Delete: another tenant's is unknown; the owner's goes; again 404.
	if st, _ := call(t, n, "DELETE", "/v1/checkpoints/"+ck.ID, tokB, nil); st != http.StatusNotFound {
		t.Fatalf("tenant b deleted a's checkpoint: %d", st)
	}
	if st, b := call(t, n, "DELETE", "/v1/checkpoints/"+ck.ID, tokA, nil); st != http.StatusNoContent {
		t.Fatalf("delete: %d %s", st, b)
	}
	if st, _ := call(t, n, "DELETE", "/v1/checkpoints/"+ck.ID, tokA, nil); st != http.StatusNotFound {
		t.Fatalf("second delete: %d", st)
	}
	if st, _ := call(t, n, "POST", "/v1/checkpoints/"+ck.ID+"/claim", tokA, []byte(`{}`)); st != http.StatusNotFound {
		t.Fatalf("claim from a deleted checkpoint: %d", st)
	}
	if st, _ := call(t, n, "DELETE", "/v1/checkpoints/"+ck2.ID, rootTok, nil); st != http.StatusNoContent {
		t.Fatalf("root delete: %d", st)
	}
	settle(t, n)
	if calls := n.Driver.Calls(); calls[fsm.KindCheckpoint] != 2 || calls[fsm.KindCheckpointDelete] != 2 {
		t.Fatalf("driver calls %v", calls)
	}
	// A hibernated sandbox is checkpointed without waking.
	if st, b := call(t, n, "POST", "/v1/sandboxes/"+sb.ID+"/hibernate", sb.Token, nil); st != http.StatusNoContent {
		t.Fatalf("hibernate: %d %s", st, b)
	}
	wakes := n.Driver.Calls()[fsm.KindWake]
	// (The sandbox's own tenant may act by id, as with preview.)
	if st, _, b := checkpointOf(t, n, sb, tokA, `{}`); st != http.StatusOK {
		t.Fatalf("checkpoint of a hibernated sandbox: %d %s", st, b)
	}
	waitState(t, n, sb.ID, "hibernated")
	if n.Driver.Calls()[fsm.KindWake] != wakes {
		t.Fatal("the checkpoint woke the sandbox")
	}
	// A failed capture answers 500 and leaves nothing listed.
	n.Driver.FailCheckpoints.Store(true)
	sb2 := claimAs(t, n, tokA, "")
	if st, _, b := checkpointOf(t, n, sb2, tokA, fmt.Sprintf(`{"token":%q}`, sb2.Token)); st != http.StatusInternalServerError {
		t.Fatalf("failing checkpoint: %d %s", st, b)
	}
	if got := listCheckpoints(t, n, tokA); len(got) != 1 {
		t.Fatalf("listed after a failure: %v", got)
	}
}

// Fork: count children, each its own claim of the parent's tenant; bad
// counts and callers are refused; a failing clone fails every child.
func TestForkRoutes(t *testing.T) {
	n := newNode(t, 1, func(o *nodetest.Options) { o.Config.MaxForkCount = 4 })
	sb := claimAs(t, n, tokA, "")
	body := func(count int) []byte {
		return []byte(fmt.Sprintf(`{"token":%q,"count":%d,"ttl_seconds":120,"claim_ref_prefix":"team/"}`, sb.Token, count))
	}
	st, b := call(t, n, "POST", "/v1/sandboxes/"+sb.ID+"/fork", tokA, body(3))
	var fr api.ForkResponse
	if st != http.StatusOK || json.Unmarshal(b, &fr) != nil || len(fr.Children) != 3 {
		t.Fatalf("fork: %d %s", st, b)
	}
	ids := map[string]bool{}
	for _, c := range fr.Children {
		if c.Token == "" || c.ID == sb.ID || ids[c.ID] || c.Template != defKey.Template {
			t.Fatalf("child %+v", c)
		}
		ids[c.ID] = true
		// Each child is tenant a's, with its own token and claim_ref.
		st, b := call(t, n, "GET", "/v1/sandboxes/"+c.ID, tokA, nil)
		var row api.Sandbox
		if st != http.StatusOK || json.Unmarshal(b, &row) != nil || row.ClaimRef != "team/"+c.ID {
			t.Fatalf("child row: %d %s", st, b)
		}
	}
	for _, c := range []struct {
		token string
		body  []byte
		want  int
	}{
		{tokA, body(0), http.StatusBadRequest},
		{tokA, body(5), http.StatusBadRequest},
		{tokA, []byte(`{"count":1,"token":"x"}`), http.StatusNotFound},
		{tokB, body(1), http.StatusNotFound},
		{"nope", body(1), http.StatusUnauthorized},
		{tokA, []byte(`{"count":"1"}`), http.StatusBadRequest},
	} {
		if st, b := call(t, n, "POST", "/v1/sandboxes/"+sb.ID+"/fork", c.token, c.body); st != c.want {
			t.Errorf("fork %s as %q: %d %s, want %d", c.body, c.token, st, b, c.want)
		}
	}
	if st, b := call(t, n, "POST", "/v1/sandboxes/sb_0000000000000000/fork", rootTok, []byte(`{"count":1}`)); st != http.StatusNotFound {
		t.Errorf("fork of an unknown sandbox: %d %s", st, b)
	}
	// All or none: with clones failing, no child survives.
	settle(t, n)
	n.Driver.FailClones.Store(true)
	st, b = call(t, n, "POST", "/v1/sandboxes/"+sb.ID+"/fork", rootTok, []byte(`{"count":2}`))
	if st != http.StatusInternalServerError {
		t.Fatalf("failing fork: %d %s", st, b)
	}
	st, b = call(t, n, "GET", "/v1/sandboxes", tokA, nil)
	var list struct{ Sandboxes []api.Sandbox }
	if st != http.StatusOK || json.Unmarshal(b, &list) != nil {
		t.Fatalf("list: %d %s", st, b)
	}
	if len(list.Sandboxes) != 4 {
		t.Fatalf("%d live sandboxes after a failed fork, want the parent and 3 children", len(list.Sandboxes))
	}
	n.Driver.FailClones.Store(false)
	// The parent's tenant cap counts the children.
	if st, b := call(t, n, "POST", "/v1/sandboxes/"+sb.ID+"/fork", rootTok, []byte(`{"count":1}`)); st != http.StatusOK {
		t.Fatalf("fork after failures: %d %s", st, b)
	}
	settle(t, n)
	if calls := n.Driver.Calls(); calls[fsm.KindCheckpointDelete] != calls[fsm.KindCheckpoint] {
		t.Fatalf("fork captures not all removed: %v", calls)
	}
}
