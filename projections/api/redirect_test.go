package api_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sbxlog/sbxlog/cmd/sandboxd/node/nodetest"
	"github.com/sbxlog/sbxlog/fsm"
	"github.com/sbxlog/sbxlog/projections/api"
)

// otherNode is a cluster view that knows one sandbox owned by another node
// and warm capacity elsewhere for one pool key.
type otherNode struct {
	id, addr string
	warmKey  fsm.PoolKey
}

var _ api.Redirector = otherNode{}

func (o otherNode) WarmElsewhere(k fsm.PoolKey) []string {
	if k == o.warmKey {
		return []string{o.addr}
	}
	return nil
}

func (o otherNode) OwnerOf(id string) (string, bool) { return o.addr, id == o.id }

// A sandbox another node owns: reads name the owner, writes are a 404 that
// names it too; never a 5xx.
func TestSandboxOwnedElsewhere(t *testing.T) {
	other := otherNode{id: "sb_00000000000000ee", addr: "10.0.0.2:7777", warmKey: defKey}
	n := newNode(t, 0, func(o *nodetest.Options) { o.Redirector = other; o.NoExecutors = true })
	path := "/v1/sandboxes/" + other.id
	for _, r := range []struct {
		method, suffix, body string
		status               int
	}{
		{"GET", "", "", 200}, {"GET", "/owner", "", 200},
		{"POST", "/release", "", 404}, {"POST", "/hibernate", "", 404}, {"POST", "/wake", "", 404},
		{"POST", "/renew", `{"ttl_seconds":60}`, 404},
	} {
		var body []byte
		if r.body != "" {
			body = []byte(r.body)
		}
		st, b := call(t, n, r.method, path+r.suffix, rootTok, body)
		if st != r.status || !strings.Contains(string(b), other.addr) {
			t.Errorf("%s %s%s: %d %s, want %d naming %s", r.method, path, r.suffix, st, b, r.status, other.addr)
		}
		if st >= 400 {
			var e struct{ Error string }
			if json.Unmarshal(b, &e) != nil || e.Error == "" {
				t.Errorf("%s %s%s: error body %s", r.method, path, r.suffix, b)
			}
		}
		// Tenants are not told about other nodes' sandboxes.
		if st, _ := call(t, n, r.method, path+r.suffix, tokA, body); st != http.StatusNotFound {
			t.Errorf("tenant %s %s%s: %d, want 404", r.method, path, r.suffix, st)
		}
	}
}

// With no warm VM here and warm capacity on another node, a claim is
// redirected there instead of cloning: the old daemon's 200
// {"redirect": [...]} with no other field.
func TestClaimRedirectsToWarmNode(t *testing.T) {
	other := otherNode{addr: "10.0.0.3:7777", warmKey: defKey}
	n := newNode(t, 0, func(o *nodetest.Options) { o.Redirector = other; o.NoExecutors = true })
	seq := n.Log.LastSeq()
	st, b := call(t, n, "POST", "/v1/claim", rootTok, []byte(`{"template":"default"}`))
	var red map[string][]string
	if st != http.StatusOK || json.Unmarshal(b, &red) != nil || len(red) != 1 || len(red["redirect"]) != 1 || red["redirect"][0] != other.addr {
		t.Fatalf("claim: %d %s, want 200 {\"redirect\":[%q]}", st, b, other.addr)
	}
	if got := n.Log.LastSeq(); got != seq {
		t.Fatalf("a redirected claim appended to the log: seq %d -> %d", seq, got)
	}
}

// A claim that says no_redirect (a client following a redirect) is served
// here, by a clone, even with warm capacity listed elsewhere: two nodes with
// lagging views cannot bounce it between them.
func TestClaimNoRedirectIsServedHere(t *testing.T) {
	other := otherNode{addr: "10.0.0.3:7777", warmKey: defKey}
	n := newNode(t, 0, func(o *nodetest.Options) { o.Redirector = other })
	st, b := call(t, n, "POST", "/v1/claim", rootTok, []byte(`{"template":"default","no_redirect":true}`))
	var cr api.ClaimResponse
	if st != http.StatusOK || json.Unmarshal(b, &cr) != nil || cr.ID == "" || cr.Tier == "warm" {
		t.Fatalf("claim with no_redirect: %d %s, want 200 from a clone", st, b)
	}
}

// awayNode is a cluster view that knows the owner of one sandbox but not
// as live, and may say its own feed is behind.
type awayNode struct {
	otherNode
	owner    string
	lastSeen time.Time
	behind   bool
}

var _ api.OwnerLocator = awayNode{}

func (a awayNode) OwnerOf(string) (string, bool) { return "", false }

func (a awayNode) LocateOwner(id string) api.OwnerLocation {
	loc := api.OwnerLocation{ViewBehind: a.behind, ViewSince: a.lastSeen}
	if id == a.id {
		loc.Node, loc.Addr, loc.LastSeen = a.owner, a.addr, a.lastSeen
	}
	return loc
}

// A sandbox whose owner is known but not live answers 503 naming the owner
// and its last-seen time, never "unknown sandbox"; an id no node holds is
// still a 404, unless the view says it is behind.
func TestSandboxOwnerUnreachable(t *testing.T) {
	seen := time.Date(2026, 12, 2, 1, 2, 3, 0, time.UTC)
	away := awayNode{otherNode: otherNode{id: "sb_00000000000000ee", addr: "10.0.0.2:7777"}, owner: "n2", lastSeen: seen}
	n := newNode(t, 0, func(o *nodetest.Options) { o.Redirector = away; o.NoExecutors = true })
	path := "/v1/sandboxes/" + away.id
	for _, r := range []struct{ method, suffix string }{
		{"GET", ""}, {"GET", "/owner"}, {"POST", "/release"}, {"POST", "/hibernate"}, {"GET", "/env"},
	} {
		st, b := call(t, n, r.method, path+r.suffix, rootTok, nil)
		var e map[string]string
		if st != http.StatusServiceUnavailable || json.Unmarshal(b, &e) != nil || e["owner_addr"] != away.addr ||
			e["owner"] != "n2" || e["last_seen"] != seen.Format(time.RFC3339Nano) || !strings.Contains(e["error"], "n2") {
			t.Errorf("%s %s%s: %d %s, want 503 naming n2 at %s, last seen %s", r.method, path, r.suffix, st, b, away.addr, seen)
		}
		if st, _ := call(t, n, r.method, path+r.suffix, tokA, nil); st != http.StatusNotFound {
			t.Errorf("tenant %s %s%s: %d, want 404", r.method, path, r.suffix, st)
		}
	}
	if st, b := call(t, n, "GET", "/v1/sandboxes/sb_00000000000000aa", rootTok, nil); st != http.StatusNotFound {
		t.Errorf("an id no node holds: %d %s, want 404", st, b)
	}

	behind := away
	behind.behind = true
	m := newNode(t, 0, func(o *nodetest.Options) { o.Redirector = behind; o.NoExecutors = true })
	if st, b := call(t, m, "GET", "/v1/sandboxes/sb_00000000000000aa", rootTok, nil); st != http.StatusServiceUnavailable || !strings.Contains(string(b), "cluster view") {
		t.Errorf("an unknown id while the view is behind: %d %s, want 503", st, b)
	}
}

// Claims racing for the node's last warm VM: the ones that find it gone
// when they commit are redirected to the peer with warm capacity, not
// cloned here.
func TestConcurrentClaimsRedirectedAtCommit(t *testing.T) {
	other := otherNode{addr: "10.0.0.3:7777", warmKey: defKey}
	n := newNode(t, 1, func(o *nodetest.Options) { o.Redirector = other })
	const claims = 16
	var wg sync.WaitGroup
	results := make([][]byte, claims)
	codes := make([]int, claims)
	start := make(chan struct{})
	for i := range claims {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			codes[i], results[i] = call(t, n, "POST", "/v1/claim", rootTok, []byte(`{"template":"default"}`))
		}()
	}
	close(start)
	wg.Wait()
	warm, redirected := 0, 0
	for i, b := range results {
		var cr api.ClaimResponse
		switch {
		case codes[i] != http.StatusOK || json.Unmarshal(b, &cr) != nil:
			t.Errorf("claim %d: %d %s", i, codes[i], b)
		case len(cr.Redirect) > 0:
			redirected++
		case cr.Tier == "warm":
			warm++
		default:
			t.Errorf("claim %d served here by %s while a peer has warm capacity: %s", i, cr.Tier, b)
		}
	}
	if warm < 1 || warm+redirected != claims {
		t.Errorf("%d warm, %d redirected of %d", warm, redirected, claims)
	}
}
