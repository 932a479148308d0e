package api_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sbxlog/sbxlog/cmd/sandboxd/node/nodetest"
	"github.com/sbxlog/sbxlog/fsm"
	"github.com/sbxlog/sbxlog/projections/api"
)

// statusOf is sandbox id's status in n's state.
func statusOf(n *nodetest.Node, id string) fsm.ClaimStatus {
	var st fsm.ClaimStatus
	n.Engine.View(func(s *fsm.State) {
		if c, ok := s.Claim(id); ok {
			st = c.Status
		}
	})
	return st
}

// verbPaths are the old daemon's sandbox verbs, with the body each takes.
var verbPaths = []struct{ method, suffix, body string }{
	{"POST", "/release", ""}, {"POST", "/hibernate", ""}, {"POST", "/wake", ""},
	{"POST", "/renew", `{"ttl_seconds":60}`}, {"GET", "/owner", ""},
}

func bodyOf(s string) []byte {
	if s == "" {
		return nil
	}
	return []byte(s)
}

// exactly fails the test unless the answer is status with exactly body.
func exactly(t *testing.T, what string, st int, resp []byte, wantSt int, want string) {
	t.Helper()
	if st != wantSt || strings.TrimSpace(string(resp)) != want {
		t.Errorf("%s: %d %s, want %d %s", what, st, resp, wantSt, want)
	}
}

// TestSandboxVerbCallers: the sandbox verbs answer callers as the old
// daemon did. No bearer token is 401 "missing bearer token", on a node with
// a root token and on one without; a token that is no credential for the
// sandbox (garbage, another sandbox's) is the 404 of an unknown id, with
// the old texts; root acts by id, the sandbox's tenant on its own (sbxlog's
// extension), the sandbox token on its sandbox.
func TestSandboxVerbCallers(t *testing.T) {
	for _, rootToken := range []string{rootTok, ""} {
		n := newNode(t, 4, func(o *nodetest.Options) { o.RootToken = rootToken })
		sb := claimAs(t, n, tokA, "")
		other := claimAs(t, n, tokB, "")
		for _, v := range verbPaths {
			path := "/v1/sandboxes/" + sb.ID + v.suffix
			notHere := `{"error":"unknown sandbox"}`
			if v.suffix == "/owner" {
				notHere = `{"error":"not owned here"}`
			}
			st, resp := call(t, n, v.method, path, "", bodyOf(v.body))
			exactly(t, v.method+" "+v.suffix+" without a token (root token "+rootToken+")", st, resp, http.StatusUnauthorized, `{"error":"missing bearer token"}`)
			for name, tok := range map[string]string{"garbage": "not-a-token", "another sandbox's token": other.Token, "a forged sandbox token": "sbt_" + strings.Repeat("0", 64)} {
				st, resp := call(t, n, v.method, path, tok, bodyOf(v.body))
				exactly(t, v.method+" "+v.suffix+" with "+name, st, resp, http.StatusNotFound, notHere)
			}
		}
		// Every kind of caller that may act does; release last.
		callers := []string{sb.Token, tokA}
		if rootToken != "" {
			callers = append(callers, rootToken)
		}
		for _, tok := range callers {
			for _, v := range verbPaths[1:] {
				if st, resp := call(t, n, v.method, "/v1/sandboxes/"+sb.ID+v.suffix, tok, bodyOf(v.body)); st >= 300 {
					t.Errorf("%s %s as %.8s: %d %s", v.method, v.suffix, tok, st, resp)
				}
				switch v.suffix {
				case "/hibernate":
					await(t, "hibernated", func() bool { return statusOf(n, sb.ID) == fsm.ClaimHibernated })
				case "/wake":
					await(t, "running", func() bool { return statusOf(n, sb.ID) == fsm.ClaimRunning })
				}
			}
		}
		if st, resp := call(t, n, "POST", "/v1/sandboxes/"+sb.ID+"/release", sb.Token, nil); st != http.StatusNoContent {
			t.Fatalf("release: %d %s", st, resp)
		}
	}
}

// TestSandboxVerbsOnEndedClaim: hibernate, wake and renew of an ended
// sandbox say it ended (410, ended.go) to whoever may see it; owner is the
// old daemon's "not owned here"; release stays an idempotent 204 (success
// to the old SDKs' Close).
func TestSandboxVerbsOnEndedClaim(t *testing.T) {
	n := newNode(t, 2, nil)
	sb := claimAs(t, n, tokA, "")
	if st, resp := call(t, n, "POST", "/v1/sandboxes/"+sb.ID+"/release", sb.Token, nil); st != http.StatusNoContent {
		t.Fatalf("release: %d %s", st, resp)
	}
	seq := n.Log.LastSeq()
	for _, tok := range []string{sb.Token, tokA, rootTok} {
		for _, v := range verbPaths {
			st, resp := call(t, n, v.method, "/v1/sandboxes/"+sb.ID+v.suffix, tok, bodyOf(v.body))
			switch v.suffix {
			case "/release":
				exactly(t, "release again", st, resp, http.StatusNoContent, "")
			case "/owner":
				exactly(t, "owner of an ended sandbox", st, resp, http.StatusNotFound, `{"error":"not owned here"}`)
			default:
				exactly(t, v.suffix+" of an ended sandbox", st, resp, http.StatusGone, goneBody(t, n, sb.ID))
			}
		}
	}
	settle(t, n)
	if got := n.Log.LastSeq(); got != seq {
		// The VM's destroy may still have been in flight; nothing else.
		if sub, err := n.Log.Subscribe(seq + 1); err == nil {
			for s := seq + 1; s <= got; s++ {
				ev, _ := sub.Next(t.Context())
				if ev.AggID == sb.ID {
					t.Errorf("a verb on the ended sandbox appended %s", ev.Type)
				}
			}
			sub.Close()
		}
	}
}

// TestRenewLeaseRules: renew takes the old daemon's bodies and lease rules:
// no body or {} is the default lease, 0 or negative too, over 24 h is 24 h
// (clamped, not refused), on_expire destroy is accepted; the answer is the
// deadline the renew set.
func TestRenewLeaseRules(t *testing.T) {
	n := newNode(t, 2, nil)
	sb := claimAs(t, n, tokA, "")
	for _, tc := range []struct {
		name string
		body []byte
		want time.Duration
	}{
		{"no body", nil, api.DefaultTTL},
		{"empty object", []byte(`{}`), api.DefaultTTL},
		{"ttl 0", []byte(`{"ttl_seconds":0}`), api.DefaultTTL},
		{"negative ttl", []byte(`{"ttl_seconds":-30}`), api.DefaultTTL},
		{"one hour, on_expire destroy", []byte(`{"ttl_seconds":3600,"on_expire":"destroy"}`), time.Hour},
		{"just over 24 h", []byte(`{"ttl_seconds":86401}`), api.MaxTTL},
		{"far over 24 h", []byte(`{"ttl_seconds":9000000000}`), api.MaxTTL},
		{"a minute, shorter than before", []byte(`{"ttl_seconds":60}`), time.Minute},
	} {
		before := time.Now()
		st, resp := call(t, n, "POST", "/v1/sandboxes/"+sb.ID+"/renew", sb.Token, tc.body)
		var out struct {
			Deadline time.Time `json:"deadline"`
		}
		if st != http.StatusOK || json.Unmarshal(resp, &out) != nil {
			t.Errorf("%s: %d %s", tc.name, st, resp)
			continue
		}
		if got := out.Deadline.Sub(before); got < tc.want-2*time.Second || got > tc.want+2*time.Second {
			t.Errorf("%s: deadline %s from now, want %s", tc.name, got.Round(time.Second), tc.want)
		}
		var state int64
		n.Engine.View(func(s *fsm.State) { c, _ := s.Claim(sb.ID); state = c.Deadline })
		if state != out.Deadline.UnixNano() {
			t.Errorf("%s: answered %s, the state holds %s", tc.name, out.Deadline, time.Unix(0, state).UTC())
		}
	}
}
