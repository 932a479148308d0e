package api_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sbxlog/sbxlog/cmd/sandboxd/node/nodetest"
	"github.com/sbxlog/sbxlog/projections/api"
)

// execCall posts body to the exec route with token.
func execCall(t *testing.T, n *nodetest.Node, id, token, body string) (int, api.ExecResponse, string) {
	t.Helper()
	st, b := call(t, n, "POST", "/v1/sandboxes/"+id+"/exec", token, []byte(body))
	var res api.ExecResponse
	if st == http.StatusOK {
		if err := json.Unmarshal(b, &res); err != nil {
			t.Fatalf("exec answer %s: %v", b, err)
		}
	}
	return st, res, string(b)
}

func TestExec(t *testing.T) {
	n := newNode(t, 3, nil)
	c := claimAs(t, n, tokA, "")
	other := claimAs(t, n, tokA, "")
	for _, tc := range []struct {
		name, token, body string
		want              int
		res               api.ExecResponse
		msg               string
	}{
		{"stdout", c.Token, `{"argv":["echo","42"]}`, 200, api.ExecResponse{Stdout: "42\n"}, ""},
		{"stderr", c.Token, `{"argv":["stderr","err"],"cwd":"/","env":{"CI":"1"},"timeout_seconds":60}`, 200, api.ExecResponse{Stderr: "err\n"}, ""},
		{"exit code", c.Token, `{"argv":["exit","3"]}`, 200, api.ExecResponse{ExitCode: 3}, ""},
		{"an overflowing timeout", c.Token, `{"argv":["true"],"timeout_seconds":10000000000}`, 200, api.ExecResponse{}, ""},
		{"a command the guest cannot start", c.Token, `{"argv":["no-such-command"]}`, 400, api.ExecResponse{}, "spawn no-such-command"},
		{"an unknown field", c.Token, `{"argv":["whoami"],"user":"nobody"}`, 400, api.ExecResponse{}, "invalid request body"},
		{"empty argv", c.Token, `{"argv":[]}`, 400, api.ExecResponse{}, "argv must not be empty"},
		{"negative timeout", c.Token, `{"argv":["true"],"timeout_seconds":-1}`, 400, api.ExecResponse{}, "timeout_seconds must not be negative"},
		{"no token", "", `{"argv":["true"]}`, 401, api.ExecResponse{}, "missing bearer token"},
		{"another sandbox's token", other.Token, `{"argv":["true"]}`, 404, api.ExecResponse{}, "unknown sandbox"},
		{"its tenant's token", tokA, `{"argv":["true"]}`, 404, api.ExecResponse{}, "unknown sandbox"},
		{"root's token", rootTok, `{"argv":["true"]}`, 404, api.ExecResponse{}, "unknown sandbox"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, res, b := execCall(t, n, c.ID, tc.token, tc.body)
			if st != tc.want || res != tc.res || !strings.Contains(b, tc.msg) {
				t.Fatalf("%d %s, want %d %+v %q", st, b, tc.want, tc.res, tc.msg)
			}
		})
	}
	waitRelays(t, n, c.ID, 0)
	if got := relayEvents(t, n, c.ID); len(got) != 10 || got[0] != "relay_opened exec" || got[1] != "relay_closed guest" {
		t.Fatalf("relay events %v, want one exec relay per command that reached the guest", got)
	}
}

// A command past its timeout is 504 and killed; one whose output passes
// the cap is 413 and killed; both over a second connection.
func TestExecAbandonedIsKilled(t *testing.T) {
	n := newNode(t, 1, nil)
	c := claimAs(t, n, rootTok, "")
	for _, tc := range []struct {
		name, body string
		want       int
	}{
		{"timeout", `{"argv":["sleep","30"],"timeout_seconds":1}`, http.StatusGatewayTimeout},
		{"output cap", `{"argv":["yes"]}`, http.StatusRequestEntityTooLarge},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dials := n.Driver.Dials()
			began := time.Now()
			if st, _, b := execCall(t, n, c.ID, c.Token, tc.body); st != tc.want {
				t.Fatalf("%d %s, want %d", st, b, tc.want)
			}
			if d := time.Since(began); d > 10*time.Second {
				t.Fatalf("answered after %s", d)
			}
			deadline := time.Now().Add(10 * time.Second)
			for n.Driver.Dials()-dials < 2 {
				if time.Now().After(deadline) {
					t.Fatalf("%d dials: the command was not killed over a fresh connection", n.Driver.Dials()-dials)
				}
				time.Sleep(5 * time.Millisecond)
			}
		})
	}
}

// An exec wakes a hibernated sandbox; a guest that cannot be reached is 502.
func TestExecWakesAndReportsAnUnreachableGuest(t *testing.T) {
	n := newNode(t, 1, nil)
	c := claimAs(t, n, rootTok, "")
	hibernateNow(t, n, c.ID, c.Token)
	if st, res, b := execCall(t, n, c.ID, c.Token, `{"argv":["echo","awake"]}`); st != 200 || res.Stdout != "awake\n" {
		t.Fatalf("exec on a hibernated sandbox: %d %s", st, b)
	}
	n.Driver.FailDials.Store(true)
	if st, _, b := execCall(t, n, c.ID, c.Token, `{"argv":["true"]}`); st != http.StatusBadGateway || !strings.Contains(b, "guest agent unreachable") {
		t.Fatalf("guest down: %d %s", st, b)
	}
}
