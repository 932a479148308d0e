package apiclient_test

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sbxlog/sbxlog/fsm"
	"github.com/sbxlog/sbxlog/projections/api"
	"github.com/sbxlog/sbxlog/projections/apiclient"
)

// TestLifecycle drives every sandbox route through the client and checks
// each answer against the node's state.
func TestLifecycle(t *testing.T) {
	n, c := startNode(t, 2)
	ctx := ctxT(t)
	if err := c.Healthz(ctx); err != nil {
		t.Fatalf("healthz: %v", err)
	}
	acme := c.WithToken("acme-token")
	cl, err := acme.Claim(ctx, api.ClaimRequest{Template: "default", TTLSeconds: 60, ClaimRef: "job-1", Metadata: map[string]string{"team": "a"}})
	if err != nil {
		t.Fatalf("claim: %v", err)
	}
	if cl.Tier != "warm" || !strings.HasPrefix(cl.ID, "sb_") || cl.Token == "" || cl.Net != "none" || cl.Size != "small" {
		t.Fatalf("claim answer %+v", cl)
	}
	if got := claimStatus(n, cl.ID); got != "running" {
		t.Fatalf("state of %s: %q", cl.ID, got)
	}
	dl, err := time.Parse(time.RFC3339Nano, cl.Deadline)
	if err != nil {
		t.Fatalf("deadline %q: %v", cl.Deadline, err)
	}

	sb, err := c.Sandbox(ctx, cl.ID)
	if err != nil || sb.ID != cl.ID || sb.State != "running" || sb.Tenant != "acme" || sb.ClaimRef != "job-1" || sb.Metadata["team"] != "a" {
		t.Fatalf("get: %+v, %v", sb, err)
	}
	for _, tc := range []struct {
		name string
		cl   *apiclient.Client
		opts apiclient.ListOptions
		want int
	}{
		{"root all", c, apiclient.ListOptions{}, 1},
		{"by ref", c, apiclient.ListOptions{ClaimRef: "job-1"}, 1},
		{"by other ref", c, apiclient.ListOptions{ClaimRef: "job-2"}, 0},
		{"by metadata", c, apiclient.ListOptions{Metadata: map[string]string{"team": "a"}}, 1},
		{"by other metadata", c, apiclient.ListOptions{Metadata: map[string]string{"team": "b"}}, 0},
		{"by two metadata pairs", c, apiclient.ListOptions{Metadata: map[string]string{"team": "a", "absent": ""}}, 0},
		{"by tenant", c, apiclient.ListOptions{Tenant: "acme"}, 1},
		{"by other tenant", c, apiclient.ListOptions{Tenant: "other"}, 0},
		{"tenant= ignored for a tenant", acme, apiclient.ListOptions{Tenant: "other"}, 1},
		{"by state", c, apiclient.ListOptions{State: "running"}, 1},
		{"by other state", c, apiclient.ListOptions{State: "hibernated"}, 0},
		{"own tenant", acme, apiclient.ListOptions{}, 1},
		{"other tenant", c.WithToken("other-token"), apiclient.ListOptions{}, 0},
	} {
		got, err := tc.cl.Sandboxes(ctx, tc.opts)
		if err != nil || len(got) != tc.want || (tc.want == 1 && got[0].ID != cl.ID) {
			t.Errorf("%s: %d sandboxes %+v, %v; want %d", tc.name, len(got), got, err, tc.want)
		}
	}

	// The sandbox token works on its own sandbox's routes.
	sbc := c.WithToken(cl.Token)
	owner, err := sbc.Owner(ctx, cl.ID)
	if err != nil || owner != strings.TrimPrefix(n.URL, "http://") {
		t.Fatalf("owner: %q, %v", owner, err)
	}
	nd, err := sbc.Renew(ctx, cl.ID, 3600)
	if err != nil || !nd.After(dl) {
		t.Fatalf("renew: %v (old %v), %v", nd, dl, err)
	}

	if err := sbc.Hibernate(ctx, cl.ID); err != nil {
		t.Fatalf("hibernate: %v", err)
	}
	waitClaim(t, n, cl.ID, fsm.ClaimHibernated)
	if in, err := c.Info(ctx); err != nil || in.Hibernated != 1 || in.Claimed != 0 {
		t.Fatalf("info while hibernated: %+v, %v", in, err)
	}
	if err := acme.Wake(ctx, cl.ID); err != nil {
		t.Fatalf("wake: %v", err)
	}
	waitClaim(t, n, cl.ID, fsm.ClaimRunning)
	if err := c.Release(ctx, cl.ID); err != nil {
		t.Fatalf("release: %v", err)
	}
	if err := c.Release(ctx, cl.ID); err != nil {
		t.Fatalf("second release is idempotent: %v", err)
	}
	if got := claimStatus(n, cl.ID); got != "released" {
		t.Fatalf("after release: %q", got)
	}
	if got, err := c.Sandboxes(ctx, apiclient.ListOptions{}); err != nil || len(got) != 0 {
		t.Fatalf("live after release: %+v, %v", got, err)
	}
	if got, err := c.Sandboxes(ctx, apiclient.ListOptions{State: "released"}); err != nil || len(got) != 1 {
		t.Fatalf("released list: %+v, %v", got, err)
	}
}

func TestPoolsAndInfo(t *testing.T) {
	n, c := startNode(t, 1)
	ctx := ctxT(t)
	pools, err := c.Pools(ctx)
	if err != nil || len(pools.Pools) != 1 || pools.Pools[0].Template != "default" || pools.Pools[0].Warm != 1 {
		t.Fatalf("pools: %+v, %v", pools, err)
	}
	in, err := c.SetPools(ctx, api.PoolsRequest{Pools: []api.PoolSpec{{Template: "py", Warm: 3}}})
	if err != nil {
		t.Fatalf("set pools: %v", err)
	}
	var sawPy bool
	for _, p := range in.Pools {
		if p.Key.String() == "py/none/small" {
			sawPy = p.Target == 3
		}
	}
	if !sawPy {
		t.Fatalf("PUT answer lacks py with target 3: %+v", in.Pools)
	}
	settle(t, n)
	in, err = c.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range in.Pools {
		if p.Key.String() == "py/none/small" && (p.Warm != 3 || !p.Golden || p.GoldenState != "ready") {
			t.Fatalf("py after fill: %+v", p)
		}
	}
	if in.Node != "n1" || in.LogSeq == 0 {
		t.Fatalf("info %+v", in)
	}
	pools, err = c.Pools(ctx)
	if err != nil || len(pools.Pools) != 1 || pools.Pools[0].Template != "py" {
		t.Fatalf("default must drain: %+v, %v", pools, err)
	}
	// An empty set drains everything; nil must not be sent as null.
	if _, err := c.SetPools(ctx, api.PoolsRequest{}); err != nil {
		t.Fatalf("empty pool set: %v", err)
	}
	m, err := c.Metrics(ctx)
	if err != nil || !strings.Contains(m, "sbx_claims_live") {
		t.Fatalf("metrics: %v, %.200q", err, m)
	}
}

// TestErrors checks the typed errors carry status and the server's message.
func TestErrors(t *testing.T) {
	n, c := startNode(t, 1)
	n.Driver.SetTemplates("default")
	ctx := ctxT(t)
	cases := []struct {
		name   string
		call   func() error
		status int
		msg    string
	}{
		{"no token", func() error { _, err := c.WithToken("").Info(ctx); return err }, 401, "invalid api token"},
		{"wrong token", func() error { _, err := c.WithToken("nope").Info(ctx); return err }, 401, "invalid api token"},
		{"tenant puts pools", func() error {
			_, err := c.WithToken("acme-token").SetPools(ctx, api.PoolsRequest{Pools: []api.PoolSpec{}})
			return err
		}, 403, "operator token required"},
		{"tenant reads info", func() error { _, err := c.WithToken("acme-token").Info(ctx); return err }, 403, "operator token required"},
		{"unknown sandbox", func() error { _, err := c.Sandbox(ctx, "sb_0000000000000000"); return err }, 404, "unknown sandbox"},
		{"bad template", func() error { _, err := c.Claim(ctx, api.ClaimRequest{Template: "-bad"}); return err }, 400, "template"},
		{"unknown template", func() error { _, err := c.Claim(ctx, api.ClaimRequest{Template: "nope"}); return err }, 404, "unknown template nope"},
		{"require_promoted", func() error {
			_, err := c.Claim(ctx, api.ClaimRequest{Template: "default", RequirePromoted: true})
			return err
		}, 404, "unknown template"},
		{"renew of an unknown sandbox", func() error { _, err := c.Renew(ctx, "sb_0000000000000000", 60); return err }, 404, "unknown sandbox"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			var e *apiclient.Error
			if !errors.As(err, &e) {
				t.Fatalf("error %v (%T), want *apiclient.Error", err, err)
			}
			if e.Status != tc.status || apiclient.StatusOf(err) != tc.status || !strings.Contains(e.Message, tc.msg) {
				t.Fatalf("got %d %q, want %d containing %q", e.Status, e.Message, tc.status, tc.msg)
			}
			if !strings.Contains(e.Error(), e.Path) || !strings.Contains(e.Error(), tc.msg) {
				t.Fatalf("Error() = %q lacks the path or message", e.Error())
			}
		})
	}
}

// TestForeignErrorBodies: a proxy's text page or the redirect body still
// give a usable *Error.
func TestForeignErrorBodies(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/claim":
			w.Header().Set("Content-Type", "application/json")
			if b, _ := io.ReadAll(r.Body); strings.Contains(string(b), `"claim_ref":"200"`) {
				_, _ = w.Write([]byte(`{"redirect":["10.0.0.4:7777"]}`))
				return
			}
			w.WriteHeader(http.StatusTemporaryRedirect)
			_, _ = w.Write([]byte(`{"redirect":["10.0.0.2:7777","10.0.0.3:7777"]}`))
		case "/v1/info":
			w.WriteHeader(http.StatusBadGateway)
			_, _ = w.Write([]byte("<html>bad gateway</html>\n"))
		default:
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	t.Cleanup(srv.Close)
	c, err := apiclient.New(strings.TrimPrefix(srv.URL, "http://"), "t", nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t)
	// An older sbxlog answered a redirect with 307.
	_, err = c.Claim(ctx, api.ClaimRequest{Template: "x"})
	var e *apiclient.Error
	if !errors.As(err, &e) || e.Status != 307 || len(e.Redirect) != 2 || e.Redirect[1] != "10.0.0.3:7777" {
		t.Fatalf("redirect: %#v", err)
	}
	// The old daemon's (and this one's) redirect is a 200.
	_, err = c.Claim(ctx, api.ClaimRequest{Template: "x", NoRedirect: false, ClaimRef: "200"})
	if got := apiclient.RedirectOf(err); !errors.As(err, &e) || e.Status != http.StatusOK || len(got) != 1 || got[0] != "10.0.0.4:7777" {
		t.Fatalf("200 redirect: %#v", err)
	}
	_, err = c.Info(ctx)
	if !errors.As(err, &e) || e.Status != 502 || e.Message != "<html>bad gateway</html>" {
		t.Fatalf("text body: %#v", err)
	}
	err = c.Healthz(ctx)
	if !errors.As(err, &e) || e.Status != 503 || e.Message != "Service Unavailable" {
		t.Fatalf("empty body: %#v", err)
	}
}

func TestNewAddr(t *testing.T) {
	for _, tc := range []struct {
		addr, want string
		ok         bool
	}{
		{"", apiclient.DefaultAddr, true},
		{"127.0.0.1:7777", "http://127.0.0.1:7777", true},
		{"https://sbx.example:8443/", "https://sbx.example:8443", true},
		{"ftp://x", "", false},
		{"http://", "", false},
		{"http://[::1", "", false},
	} {
		c, err := apiclient.New(tc.addr, "", nil)
		if (err == nil) != tc.ok {
			t.Errorf("New(%q): err %v, want ok=%v", tc.addr, err, tc.ok)
			continue
		}
		if tc.ok && c.Addr() != tc.want {
			t.Errorf("New(%q).Addr() = %q, want %q", tc.addr, c.Addr(), tc.want)
		}
	}
}

// A claim the server committed but could not serve comes back as the old
// daemon's 500 "provisioning failed", an *Error carrying the sandbox's id,
// which the message names too.
func TestFailedClaimErrorNamesTheSandbox(t *testing.T) {
	n, c := startNode(t, 0)
	n.Driver.FailClones.Store(true)
	ctx := ctxT(t)
	_, err := c.Claim(ctx, api.ClaimRequest{Template: "default"})
	var e *apiclient.Error
	if !errors.As(err, &e) || e.Status != http.StatusInternalServerError || e.Message != "provisioning failed" || e.ID == "" || !strings.Contains(e.Error(), e.ID) {
		t.Fatalf("claim with failing clones: %#v", err)
	}
	sb, err := c.Sandbox(ctx, e.ID)
	if err != nil || sb.State != "failed" {
		t.Fatalf("the named sandbox: %+v, %v", sb, err)
	}
}

// TestTransitions: Hibernate and Wake return once the sandbox got there;
// the NoWait forms once the request is durable, with the state then, and
// a failed snapshot is a 500 *Error that says why.
func TestTransitions(t *testing.T) {
	n, c := startNode(t, 1)
	ctx := ctxT(t)
	cl, err := c.Claim(ctx, api.ClaimRequest{Template: "default"})
	if err != nil {
		t.Fatal(err)
	}
	n.Driver.SetDelay(fsm.KindHibernate, 200*time.Millisecond)
	n.Driver.SetDelay(fsm.KindWake, 200*time.Millisecond)
	if err := c.Hibernate(ctx, cl.ID); err != nil || claimStatus(n, cl.ID) != "hibernated" {
		t.Fatalf("hibernate: %v, then %s", err, claimStatus(n, cl.ID))
	}
	if err := c.Wake(ctx, cl.ID); err != nil || claimStatus(n, cl.ID) != "running" {
		t.Fatalf("wake: %v, then %s", err, claimStatus(n, cl.ID))
	}
	if st, err := c.HibernateNoWait(ctx, cl.ID); err != nil || st != "hibernating" {
		t.Fatalf("hibernate, no wait: %q, %v", st, err)
	}
	waitClaim(t, n, cl.ID, fsm.ClaimHibernated)
	if st, err := c.WakeNoWait(ctx, cl.ID); err != nil || st != "waking" {
		t.Fatalf("wake, no wait: %q, %v", st, err)
	}
	waitClaim(t, n, cl.ID, fsm.ClaimRunning)
	n.Driver.FailHibernates.Store(true)
	err = c.Hibernate(ctx, cl.ID)
	if e := (*apiclient.Error)(nil); !errors.As(err, &e) || e.Status != 500 || !strings.HasPrefix(e.Message, "hibernate failed: ") || e.ID != cl.ID {
		t.Fatalf("failed hibernate: %v, want a 500 *Error saying why", err)
	}
}
