package api_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/sbxlog/sbxlog/cmd/sandboxd/node/nodetest"
	"github.com/sbxlog/sbxlog/fsm"
)

// goneBody is the exact answer about ended claim id (410): what happened
// and when, read from the node's state.
func goneBody(t *testing.T, n *nodetest.Node, id string) string {
	t.Helper()
	var c fsm.ClaimRec
	var ok bool
	n.Engine.View(func(st *fsm.State) { c, ok = st.Claim(id) })
	if !ok || c.Status.Live() {
		t.Fatalf("claim %s: %+v (found %v), want it ended", id, c, ok)
	}
	at := time.Unix(0, c.Ended).UTC().Format(time.RFC3339Nano)
	var msg string
	switch c.Status {
	case fsm.ClaimExpired:
		msg = fmt.Sprintf("sandbox %s expired at %s (its deadline passed; renew extends a live one)", id, at)
	case fsm.ClaimFailed:
		msg = fmt.Sprintf("sandbox %s failed at %s: %s", id, at, c.Reason)
	default:
		msg = fmt.Sprintf("sandbox %s was %s at %s", id, c.Status, at)
	}
	b, _ := json.Marshal(map[string]string{"error": msg})
	return string(b)
}

// An expired sandbox tells its own token, its tenant and root that it
// expired and when (410), on the verbs and the data plane alike, while a
// stranger still gets the 404 of an unknown id, and its release stays the
// idempotent 204 the old SDKs' Close takes for success (issue 25 item 4:
// exec said 404 unknown sandbox while get said expired).
func TestExpiredSandboxSaysSo(t *testing.T) {
	n := newNode(t, 2, nil)
	sb := claimAs(t, n, tokA, `,"ttl_seconds":1`)
	other := claimAs(t, n, tokB, "")
	await(t, "expired", func() bool { return statusOf(n, sb.ID) == fsm.ClaimExpired })
	want := goneBody(t, n, sb.ID)
	for _, tok := range []string{sb.Token, tokA, rootTok} {
		for _, p := range []string{"/hibernate", "/wake", "/renew", "/exec"} {
			body := "{}"
			if p == "/exec" {
				body = `{"argv":["true"]}`
			}
			st, resp := call(t, n, "POST", "/v1/sandboxes/"+sb.ID+p, tok, []byte(body))
			if p == "/exec" && tok != sb.Token {
				exactly(t, p+" by another than the sandbox", st, resp, http.StatusNotFound, `{"error":"unknown sandbox"}`)
				continue
			}
			exactly(t, p+" of an expired sandbox", st, resp, http.StatusGone, want)
		}
	}
	st, resp := call(t, n, "POST", "/v1/sandboxes/"+sb.ID+"/hibernate", other.Token, nil)
	exactly(t, "another sandbox's token", st, resp, http.StatusNotFound, `{"error":"unknown sandbox"}`)
	st, resp = call(t, n, "POST", "/v1/sandboxes/"+sb.ID+"/release", sb.Token, nil)
	exactly(t, "release of an expired sandbox", st, resp, http.StatusNoContent, "")
}
