package api_test

import (
	"encoding/json"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/sbxlog/sbxlog/cmd/sandboxd/node/nodetest"
	"github.com/sbxlog/sbxlog/fsm"
	"github.com/sbxlog/sbxlog/projections/api"
	"github.com/sbxlog/sbxlog/projections/origin"
)

// laggingView is a cluster view that has not folded any sandbox of its
// peers yet (their events are still on the way) but knows the peers: it
// names them by tag (Origins). behind: its feed says it is behind.
type laggingView struct {
	peers  map[string]string // node id -> address
	behind bool
}

var (
	_ api.OwnerLocator  = laggingView{}
	_ api.OriginLocator = laggingView{}
)

func (laggingView) WarmElsewhere(fsm.PoolKey) []string { return nil }
func (laggingView) OwnerOf(string) (string, bool)      { return "", false }

func (v laggingView) LocateOwner(string) api.OwnerLocation {
	return api.OwnerLocation{ViewBehind: v.behind}
}

func (v laggingView) Origins(tag string) []api.OwnerLocation {
	var out []api.OwnerLocation
	for node, addr := range v.peers {
		if origin.NodeTag(node) == tag {
			out = append(out, api.OwnerLocation{Node: node, Addr: addr})
		}
	}
	return out
}

// Ids name the node that minted them, and a node whose view has not
// caught up with a sandbox asks that node rather than say 404: a live
// sandbox of a peer answers with its owner_addr (changes: the 404 that names
// the owner), one its origin does not hold is a 404 (while the view is
// current), and an origin that cannot be asked is a 503 naming it.
func TestUnknownIDAsksItsOrigin(t *testing.T) {
	creator := newNode(t, 1, func(o *nodetest.Options) { o.NodeID = "origin" })
	st, b := call(t, creator, "POST", "/v1/claim", rootTok, []byte(`{"template":"default"}`))
	var cr api.ClaimResponse
	if st != http.StatusOK || json.Unmarshal(b, &cr) != nil || cr.ID == "" {
		t.Fatalf("claim on origin: %d %s", st, b)
	}
	if got := origin.IDTag(cr.ID); got != origin.NodeTag("origin") {
		t.Fatalf("id %s minted by node origin has tag %q, want %q", cr.ID, got, origin.NodeTag("origin"))
	}
	originAddr := strings.TrimPrefix(creator.URL, "http://")
	// An id of origin's tag that origin never minted.
	gone := "sb_" + origin.NodeTag("origin") + "000000000000"

	// A port nothing listens on: an origin that cannot be asked.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadAddr := ln.Addr().String()
	ln.Close()
	dead := "sb_" + origin.NodeTag("dead") + "000000000001"
	stranger := "sb_" + origin.NodeTag("never-seen") + "000000000002"

	view := laggingView{peers: map[string]string{"origin": originAddr, "dead": deadAddr}}
	n := newNode(t, 0, func(o *nodetest.Options) { o.NodeID = "here"; o.Redirector = view; o.NoExecutors = true })
	behind := view
	behind.behind = true
	m := newNode(t, 0, func(o *nodetest.Options) { o.NodeID = "here2"; o.Redirector = behind; o.NoExecutors = true })

	for _, c := range []struct {
		name         string
		node         *nodetest.Node
		method, path string
		status       int
		want         string // in the body
	}{
		{"live on origin: read", n, "GET", "/v1/sandboxes/" + cr.ID, 200, originAddr},
		{"live on origin: owner", n, "GET", "/v1/sandboxes/" + cr.ID + "/owner", 200, originAddr},
		{"live on origin: change", n, "POST", "/v1/sandboxes/" + cr.ID + "/release", 404, originAddr},
		{"origin does not hold it", n, "GET", "/v1/sandboxes/" + gone, 404, "unknown sandbox"},
		{"origin does not hold it, view behind", m, "GET", "/v1/sandboxes/" + gone, 503, "cluster view"},
		{"origin unreachable", n, "GET", "/v1/sandboxes/" + dead, 503, deadAddr},
		{"origin unreachable: owner", n, "GET", "/v1/sandboxes/" + dead + "/owner", 503, deadAddr},
		{"tag of no known node", n, "GET", "/v1/sandboxes/" + stranger, 404, "unknown sandbox"},
		{"live on origin, view behind", m, "GET", "/v1/sandboxes/" + cr.ID + "/owner", 200, originAddr},
	} {
		st, b := call(t, c.node, c.method, c.path, rootTok, nil)
		if st != c.status || !strings.Contains(string(b), c.want) {
			t.Errorf("%s: %s %s: %d %s, want %d with %q", c.name, c.method, c.path, st, b, c.status, c.want)
		}
	}
	if creator.LiveClaims() != 1 {
		t.Errorf("live claims on origin after the other node's answers: %d, want 1", creator.LiveClaims())
	}

	// The question an origin is asked is answered from its own state and
	// view, and not passed on: no loops between nodes sharing a tag.
	req, _ := http.NewRequest("GET", n.URL+"/v1/sandboxes/"+cr.ID+"/owner", nil)
	req.Header.Set("Authorization", "Bearer "+rootTok)
	req.Header.Set(origin.ProbeHeader, "1")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("an origin probe asked of a node that does not hold the sandbox: %d, want 404", resp.StatusCode)
	}
}
