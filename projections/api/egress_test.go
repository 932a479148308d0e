package api_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sbxlog/sbxlog/cmd/sandboxd/node"
	"github.com/sbxlog/sbxlog/cmd/sandboxd/node/nodetest"
	"github.com/sbxlog/sbxlog/executors/egressmeter"
	"github.com/sbxlog/sbxlog/executors/tap"
	"github.com/sbxlog/sbxlog/fsm"
	"github.com/sbxlog/sbxlog/fsm/egress"
	"github.com/sbxlog/sbxlog/projections/api"
)

// egressNode is newNode with a secret registry: gh (the node's value, from
// a made-up environment) and GW_KEY (claim-only), and a CA for intercept
// rules.
func egressNode(t *testing.T, warm int) *nodetest.Node {
	t.Helper()
	return newNode(t, warm, func(o *nodetest.Options) {
		o.Tune = func(c *node.Config) {
			c.Egress = node.EgressConfig{
				Secrets: []egress.SecretSpec{{Name: "gh", Header: "Authorization", ValueEnv: "GH_TOKEN"}, {Name: "GW_KEY", Header: "X-Api-Key"}},
				Getenv: func(k string) string {
					if k == "GH_TOKEN" {
						return "node-gh-value"
					}
					return ""
				},
				CanIntercept: true,
				UsageEvery:   time.Hour,
			}
		}
	})
}

// errMsg is an error answer's message.
func errMsg(b []byte) string {
	var e struct{ Error string }
	_ = json.Unmarshal(b, &e)
	return e.Error
}

func putPools(t *testing.T, n *nodetest.Node, egressJSON string) {
	t.Helper()
	body := `{"pools":[{"template":"default","warm":2}]}`
	if egressJSON != "" {
		body = `{"pools":[{"template":"default","warm":2,"egress":` + egressJSON + `}]}`
	}
	mustStatus(t, n, http.StatusOK, "PUT", "/v1/pools", rootTok, body)
}

func getEnv(t *testing.T, n *nodetest.Node, id, token string) map[string]api.EnvVar {
	t.Helper()
	var out struct{ Env map[string]api.EnvVar }
	if err := json.Unmarshal(mustStatus(t, n, http.StatusOK, "GET", "/v1/sandboxes/"+id+"/env", token, ""), &out); err != nil {
		t.Fatal(err)
	}
	return out.Env
}

// The env routes: the API token of root or the sandbox's tenant only;
// GET hides host-only values; PATCH null removes; the proxy's lookups see
// what the guest may and the secrets it may not.
func TestEnvRoutes(t *testing.T) {
	n := egressNode(t, 2)
	sb := claimAs(t, n, tokA, "")
	path := "/v1/sandboxes/" + sb.ID + "/env"
	if env := getEnv(t, n, sb.ID, tokA); len(env) != 0 {
		t.Fatalf("fresh env %+v", env)
	}
	mustStatus(t, n, http.StatusNoContent, "PUT", path, tokA, `{"env":{"MODE":{"value":"prod"},"GW_KEY":{"value":"gw-s3cr3t","guest":false},"GH_TOKEN":{"value":"","guest":false}}}`)
	env := getEnv(t, n, sb.ID, tokA)
	f := false
	if len(env) != 3 || env["MODE"].Value != "prod" || env["MODE"].Guest != nil ||
		env["GW_KEY"].Value != "" || env["GW_KEY"].Guest == nil || *env["GW_KEY"].Guest != f {
		t.Fatalf("GET env %+v", env)
	}
	raw := mustStatus(t, n, http.StatusOK, "GET", path, rootTok, "")
	if strings.Contains(string(raw), "gw-s3cr3t") || !strings.Contains(string(raw), `"GW_KEY":{"value":"","guest":false}`) {
		t.Fatalf("GET env as root: %s", raw)
	}
	// Who may.
	mustStatus(t, n, http.StatusNotFound, "GET", path, tokB, "")
	mustStatus(t, n, http.StatusNotFound, "PATCH", path, tokB, `{"env":{"X":{"value":"1"}}}`)
	mustStatus(t, n, http.StatusForbidden, "GET", path, sb.Token, "")
	mustStatus(t, n, http.StatusUnauthorized, "GET", path, "", "")
	mustStatus(t, n, http.StatusNotFound, "GET", "/v1/sandboxes/sb_0123456789abcdef/env", rootTok, "")

	// What the proxy and the guest get.
	sec, err := n.Egress.SecretsFor(sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	// GW_KEY from the claim; gh suppressed by the claim's empty GH_TOKEN.
	if len(sec) != 1 || sec["GW_KEY"] != "gw-s3cr3t" {
		t.Fatalf("SecretsFor = %v", sec)
	}
	guest, err := n.Egress.GuestEnv(sb.ID)
	if err != nil || len(guest) != 1 || guest["MODE"] != "prod" {
		t.Fatalf("GuestEnv = %v, %v", guest, err)
	}

	// PATCH: null removes, the rest stays.
	mustStatus(t, n, http.StatusNoContent, "PATCH", path, tokA, `{"env":{"GW_KEY":null,"GH_TOKEN":null,"REGION":{"value":"eu"}}}`)
	if env := getEnv(t, n, sb.ID, tokA); len(env) != 2 || env["MODE"].Value != "prod" || env["REGION"].Value != "eu" {
		t.Fatalf("after PATCH %+v", env)
	}
	if sec, _ := n.Egress.SecretsFor(sb.ID); len(sec) != 1 || sec["gh"] != "node-gh-value" {
		t.Fatalf("SecretsFor after PATCH = %v (the node's gh comes back, GW_KEY has none)", sec)
	}
	mustStatus(t, n, http.StatusNoContent, "PATCH", path, tokA, `{"env":{"NOT_THERE":null}}`)
	mustStatus(t, n, http.StatusNoContent, "PUT", path, tokA, `{"env":{}}`)
	if env := getEnv(t, n, sb.ID, tokA); len(env) != 0 {
		t.Fatalf("after PUT {} %+v", env)
	}
	for _, tc := range []struct{ method, body, want string }{
		{"PUT", `{"env":{"A":null}}`, "only PATCH removes"},
		{"PUT", `{"env":{"A":{"value":"x","guest":null}}}`, "guest must be true or false"},
		{"PUT", `{"env":{"A":{"value":"x","extra":1}}}`, "unknown field"},
		{"PATCH", `{"env":{"a-b":{"value":"x"}}}`, "must match"},
		{"PATCH", `{"env":{"A":{"value":"` + strings.Repeat("v", 8193) + `"}}}`, "over 8192 bytes"},
		{"PATCH", `{"env":{"A":{"value":"x","guest":false,"inject":{"hosts":["x.com"],"header":"X"}}}}`, "x.com is not intercepted"},
		{"PUT", `{"envs":{}}`, "unknown field"},
	} {
		st, b := call(t, n, tc.method, path, tokA, []byte(tc.body))
		if st != http.StatusBadRequest || !strings.Contains(errMsg(b), tc.want) {
			t.Errorf("%s %s: %d %s, want 400 %q", tc.method, tc.body, st, b, tc.want)
		}
	}
	// An ended sandbox has no env: it says it ended.
	mustStatus(t, n, http.StatusNoContent, "POST", "/v1/sandboxes/"+sb.ID+"/release", tokA, "")
	mustStatus(t, n, http.StatusGone, "GET", path, tokA, "")
	if _, err := n.Egress.SecretsFor(sb.ID); err == nil {
		t.Fatal("SecretsFor answers for a released sandbox")
	}
}

// The claim's env and egress false; the env of a hibernated sandbox
// changes without waking it.
func TestClaimEnvAndEgressFalse(t *testing.T) {
	n := egressNode(t, 3)
	putPools(t, n, `{"allow":[{"host":"*"}]}`)
	root := claimAs(t, n, rootTok, `,"env":{"GW_KEY":{"value":"claim-gw","guest":false},"MODE":{"value":"m"}}`)
	if sec, err := n.Egress.SecretsFor(root.ID); err != nil || sec["GW_KEY"] != "claim-gw" || sec["gh"] != "node-gh-value" {
		t.Fatalf("SecretsFor = %v, %v", sec, err)
	}
	if _, ok := n.Egress.Policy(root.ID); !ok {
		t.Fatal("a root claim of a pool with a policy has none")
	}
	off := claimAs(t, n, rootTok, `,"egress":false`)
	if _, ok := n.Egress.Policy(off.ID); ok {
		t.Fatal(`"egress": false has a policy`)
	}
	mustStatus(t, n, http.StatusNoContent, "POST", "/v1/sandboxes/"+root.ID+"/hibernate", rootTok, "")
	mustStatus(t, n, http.StatusNoContent, "PATCH", "/v1/sandboxes/"+root.ID+"/env", rootTok, `{"env":{"MODE":{"value":"n"}}}`)
	if env := getEnv(t, n, root.ID, rootTok); env["MODE"].Value != "n" {
		t.Fatalf("env %+v", env)
	}
	waitState(t, n, root.ID, "hibernated")
}

// Classes over the API; a tenant names one; a tenant's claim is its pool's
// policy composed with its class.
func TestEgressClassRoutes(t *testing.T) {
	n := egressNode(t, 2)
	mustStatus(t, n, http.StatusBadRequest, "PUT", "/v1/tenants/a", rootTok, `{"egress_class":"desk"}`)
	mustStatus(t, n, http.StatusNoContent, "PUT", "/v1/egress/classes/desk", rootTok, `{"egress":{"allow":[{"host":"API.github.com","methods":["get"]}]}}`)
	mustStatus(t, n, http.StatusForbidden, "PUT", "/v1/egress/classes/desk", tokA, `{"egress":{"allow":[]}}`)
	var list api.EgressClassesJSON
	if err := json.Unmarshal(mustStatus(t, n, http.StatusOK, "GET", "/v1/egress/classes", rootTok, ""), &list); err != nil {
		t.Fatal(err)
	}
	if len(list.Classes) != 1 || list.Classes[0].Name != "desk" || list.Classes[0].Egress.Allow[0].Host != "api.github.com" || list.Classes[0].Egress.Allow[0].Methods[0] != "GET" {
		t.Fatalf("classes %+v", list)
	}
	for _, tc := range []struct{ path, body, want string }{
		{"/v1/egress/classes/x", `{}`, `egress class "x" needs egress`},
		{"/v1/egress/classes/x", `{"egress":{"allow":[{"host":"*","intercept":true}]}}`, "intercept may only be set on a pool rule"},
		{"/v1/egress/classes/x", `{"egress":{"allow":[{"host":"*","secret":"nope"}]}}`, `unknown secret "nope"`},
		{"/v1/egress/classes/a%20b", `{"egress":{"allow":[]}}`, "must match"},
	} {
		st, b := call(t, n, "PUT", tc.path, rootTok, []byte(tc.body))
		if st != http.StatusBadRequest || !strings.Contains(errMsg(b), tc.want) {
			t.Errorf("PUT %s %s: %d %s, want 400 %q", tc.path, tc.body, st, b, tc.want)
		}
	}
	mustStatus(t, n, http.StatusNoContent, "PUT", "/v1/tenants/a", rootTok, `{"egress_class":"desk"}`)
	putPools(t, n, `{"allow":[{"host":"*.github.com","secret":"gh"},{"host":"*"}]}`)
	sb := claimAs(t, n, tokA, "")
	pol, ok := n.Egress.Policy(sb.ID)
	if !ok || pol.Tenant == nil {
		t.Fatalf("tenant claim policy %+v %v", pol, ok)
	}
	if d := egress.Decide(pol, "api.github.com", "GET", 443); !d.Allow || d.Secret != "gh" {
		t.Fatalf("GET api.github.com: %+v", d)
	}
	if d := egress.Decide(pol, "api.github.com", "POST", 443); d.Allow {
		t.Fatalf("POST api.github.com (the class allows GET only): %+v", d)
	}
	if d := egress.Decide(pol, "example.com", "GET", 443); d.Allow {
		t.Fatalf("example.com (not in the class): %+v", d)
	}
	st, b := call(t, n, "DELETE", "/v1/egress/classes/desk", rootTok, nil)
	if st != http.StatusConflict || !strings.Contains(errMsg(b), `named by tenant "a"`) {
		t.Fatalf("DELETE a named class: %d %s", st, b)
	}
	mustStatus(t, n, http.StatusNotFound, "DELETE", "/v1/egress/classes/nope", rootTok, "")
	mustStatus(t, n, http.StatusNoContent, "PUT", "/v1/tenants/a", rootTok, `{}`)
	mustStatus(t, n, http.StatusNoContent, "DELETE", "/v1/egress/classes/desk", rootTok, "")
	// The claim pinned desk, which is gone: no policy from now on.
	if _, ok := n.Egress.Policy(sb.ID); ok {
		t.Fatal("a claim whose class is gone keeps a policy")
	}
	var pools api.PoolsRequest
	if err := json.Unmarshal(mustStatus(t, n, http.StatusOK, "GET", "/v1/pools", rootTok, ""), &pools); err != nil {
		t.Fatal(err)
	}
	if len(pools.Pools) != 1 || pools.Pools[0].Egress == nil || pools.Pools[0].Egress.Allow[0].Secret != "gh" {
		t.Fatalf("GET /v1/pools %+v", pools)
	}
}

// Acceptance 3: a policy change over the API is what the next decision
// sees, within a second (here at once: the answer comes once the change is
// applied and durable).
func TestPolicyChangeReachesNextDecision(t *testing.T) {
	n := egressNode(t, 2)
	putPools(t, n, `{"allow":[{"host":"api.github.com"}]}`)
	sb := claimAs(t, n, rootTok, "")
	decide := func(host string) bool {
		pol, _ := n.Egress.Policy(sb.ID)
		return egress.Decide(pol, host, "GET", 443).Allow
	}
	if !decide("api.github.com") || decide("example.com") {
		t.Fatal("the first policy is not the one decided by")
	}
	for _, step := range []struct {
		policy        string
		github, other bool
	}{
		{`{"allow":[{"host":"*.example.com"},{"host":"example.com"}]}`, false, true},
		{`{"allow":[]}`, false, false},
		{`{"allow":[{"host":"*"}]}`, true, true},
	} {
		start := time.Now()
		putPools(t, n, step.policy)
		for decide("api.github.com") != step.github || decide("example.com") != step.other {
			if time.Since(start) > time.Second {
				t.Fatalf("policy %s not decided by within 1 s", step.policy)
			}
			time.Sleep(time.Millisecond)
		}
	}
	// A class's change reaches its tenant's sandboxes the same way.
	mustStatus(t, n, http.StatusNoContent, "PUT", "/v1/egress/classes/desk", rootTok, `{"egress":{"allow":[{"host":"api.github.com"}]}}`)
	mustStatus(t, n, http.StatusNoContent, "PUT", "/v1/tenants/a", rootTok, `{"egress_class":"desk"}`)
	ta := claimAs(t, n, tokA, "")
	allowedA := func(host string) bool {
		pol, _ := n.Egress.Policy(ta.ID)
		return egress.Decide(pol, host, "GET", 443).Allow
	}
	if !allowedA("api.github.com") || allowedA("example.com") {
		t.Fatal("class policy")
	}
	start := time.Now()
	mustStatus(t, n, http.StatusNoContent, "PUT", "/v1/egress/classes/desk", rootTok, `{"egress":{"allow":[{"host":"example.com"}]}}`)
	for allowedA("api.github.com") || !allowedA("example.com") {
		if time.Since(start) > time.Second {
			t.Fatal("class change not decided by within 1 s")
		}
		time.Sleep(time.Millisecond)
	}
}

// Claim credentials must name hosts the sandbox's policy intercepts, and
// not a header the pool's secret sets there; the proxy gets them opened.
func TestCredentialsEnvelope(t *testing.T) {
	n := egressNode(t, 2)
	putPools(t, n, `{"allow":[{"host":"api.github.com","secret":"gh","intercept":true},{"host":"*.openai.com","intercept":"inject"},{"host":"*"}]}`)
	sb := claimAs(t, n, rootTok, "")
	path := "/v1/sandboxes/" + sb.ID + "/env"
	for _, tc := range []struct{ body, want string }{
		{`{"env":{"K":{"value":"v","guest":false,"inject":{"hosts":["example.com"],"header":"X-Key"}}}}`, "K: example.com is not intercepted"},
		{`{"env":{"K":{"value":"v","guest":false,"inject":{"hosts":["api.github.com"],"header":"authorization"}}}}`, "K: the pool's secret already sets authorization on api.github.com"},
		{`{"env":{"K":{"value":"v","inject":{"hosts":["chat.openai.com"],"header":"X-Key"}}}}`, "inject needs guest: false"},
	} {
		st, b := call(t, n, "PATCH", path, rootTok, []byte(tc.body))
		if st != http.StatusBadRequest || !strings.Contains(errMsg(b), tc.want) {
			t.Errorf("PATCH %s: %d %s, want 400 %q", tc.body, st, b, tc.want)
		}
	}
	mustStatus(t, n, http.StatusNoContent, "PATCH", path, rootTok, `{"env":{"OPENAI":{"value":"sk-1","guest":false,"inject":{"hosts":["chat.openai.com","*.openai.com"],"header":"Authorization"}},"GH":{"value":"q","guest":false,"inject":{"hosts":["api.github.com"],"query":"key","placeholder":"PH","body":true}}}}`)
	creds, err := n.Egress.Credentials(sb.ID)
	if err != nil || len(creds) != 2 || creds[0].Name != "GH" || creds[0].Value != "q" || creds[0].Inject.Query != "key" || creds[1].Value != "sk-1" {
		t.Fatalf("Credentials = %+v, %v", creds, err)
	}
	env := getEnv(t, n, sb.ID, rootTok)
	if env["OPENAI"].Value != "" || env["OPENAI"].Inject == nil || env["OPENAI"].Inject.Header != "Authorization" {
		t.Fatalf("GET keeps the inject spec, blanks the value: %+v", env["OPENAI"])
	}
	// The same credentials at claim.
	st, b := call(t, n, "POST", "/v1/claim", rootTok, []byte(`{"template":"default","env":{"K":{"value":"v","guest":false,"inject":{"hosts":["example.com"],"header":"X"}}}}`))
	if st != http.StatusBadRequest || !strings.Contains(string(b), "not intercepted") {
		t.Fatalf("claim with an uncovered credential: %d %s", st, b)
	}
}

// The node's lookups of a VM and of its tap, and the accounting hook.
func TestEgressLookups(t *testing.T) {
	n := egressNode(t, 2)
	sb := claimAs(t, n, rootTok, "")
	if id, ok := n.Egress.SandboxOfVM(sb.VM); !ok || id != sb.ID {
		t.Fatalf("SandboxOfVM = %q %v", id, ok)
	}
	if id, vm, ok := n.Egress.SandboxOfTap(tap.Name(n.Instance, sb.VM)); !ok || id != sb.ID || vm != sb.VM {
		t.Fatalf("SandboxOfTap = %q %q %v", id, vm, ok)
	}
	if _, _, ok := n.Egress.SandboxOfTap("sbxnotatap"); ok {
		t.Fatal("an unknown tap has a sandbox")
	}
	var warm []string
	n.Engine.View(func(st *fsm.State) {
		p, _ := st.Pool(defKey)
		warm = p.WarmVMs()
	})
	if len(warm) == 0 {
		t.Fatal("no warm VM")
	}
	if _, ok := n.Egress.SandboxOfVM(warm[0]); ok {
		t.Fatal("a warm VM has a sandbox")
	}
	if h, ok := n.Egress.SecretHeader("gh"); !ok || h != "Authorization" {
		t.Fatalf("SecretHeader = %q %v", h, ok)
	}
	if n.Egress.Guard() == nil || n.Egress.Guard().CheckAddr("169.254.169.254:80") == nil {
		t.Fatal("the guard admits the metadata address")
	}
	m := n.Egress.Meter()
	m.Decision(sb.ID, egressmeter.DoorHTTP, egress.Decision{Allow: true})
	m.Transfer(sb.ID, 10, 20)
	m.Close(sb.ID)
	deadline := time.Now().Add(10 * time.Second)
	for {
		var found bool
		n.Engine.View(func(st *fsm.State) { found = st.Applied() > 0 })
		st, b := call(t, n, "GET", "/metrics", rootTok, nil)
		if st == http.StatusOK && strings.Contains(string(b), `sbx_egress_decisions_total{decision="allow",door="http",reason=""} 1`) &&
			strings.Contains(string(b), `sbx_egress_bytes_total{direction="rx"} 20`) && found && usageRecorded(t, n, sb.ID) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("metrics or usage event missing:\n%s", b)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// usageRecorded reports whether the log holds a final egress_usage of id.
func usageRecorded(t *testing.T, n *nodetest.Node, id string) bool {
	t.Helper()
	sub, err := n.Log.Subscribe(1)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for last := n.Log.LastSeq(); ; {
		ev, err := sub.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if ev.Type.String() == "egress_usage" && ev.AggID == id && strings.Contains(string(ev.Payload), `"final":true`) &&
			strings.Contains(string(ev.Payload), `"tx_bytes":10`) {
			return true
		}
		if ev.Seq >= last {
			return false
		}
	}
}

// Policies, classes, a claim's pinned egress and its sealed env come back
// from the log after a restart: from the snapshot and tail, and from a
// full replay.
func TestEgressSurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	opts := nodetest.Options{Dir: dir, RootToken: rootTok, Pools: []fsm.PoolSpec{{PoolKey: defKey, Warm: 2}},
		Tune: func(c *node.Config) {
			c.Egress = node.EgressConfig{Secrets: []egress.SecretSpec{{Name: "GW_KEY", Header: "X-Api-Key"}}}
		}}
	n, err := nodetest.Start(opts)
	if err != nil {
		t.Fatal(err)
	}
	mustStatus(t, n, http.StatusNoContent, "PUT", "/v1/egress/classes/desk", rootTok, `{"egress":{"allow":[{"host":"*.example.com"}]}}`)
	mustStatus(t, n, http.StatusNoContent, "PUT", "/v1/tenants/a", rootTok, `{"token":"`+tokA+`","egress_class":"desk"}`)
	putPools(t, n, `{"allow":[{"host":"*","secret":"GW_KEY"}],"socks5":true}`)
	sb := claimAs(t, n, tokA, `,"env":{"GW_KEY":{"value":"restart-s3cr3t","guest":false},"MODE":{"value":"m"}}`)
	before, _ := n.Egress.Policy(sb.ID)
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	for _, full := range []bool{false, true} {
		o := opts
		o.Tune = func(c *node.Config) {
			opts.Tune(c)
			c.FullReplay = full
		}
		n, err := nodetest.Start(o)
		if err != nil {
			t.Fatal(err)
		}
		after, ok := n.Egress.Policy(sb.ID)
		if !ok || !egress.Equal(after.Base, before.Base) || !egress.Equal(after.Tenant, before.Tenant) || !after.ServesSocks() {
			t.Errorf("full replay %v: policy %+v %v, want %+v", full, after, ok, before)
		}
		if sec, err := n.Egress.SecretsFor(sb.ID); err != nil || sec["GW_KEY"] != "restart-s3cr3t" {
			t.Errorf("full replay %v: SecretsFor = %v, %v", full, sec, err)
		}
		if env := getEnv(t, n, sb.ID, rootTok); env["MODE"].Value != "m" || env["GW_KEY"].Value != "" {
			t.Errorf("full replay %v: env %+v", full, env)
		}
		if err := n.Close(); err != nil {
			t.Fatal(err)
		}
	}
}
