package apiclient_test

import (
	"context"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/sbxlog/sbxlog/cmd/sandboxd/node/nodetest"
	"github.com/sbxlog/sbxlog/fsm"
	"github.com/sbxlog/sbxlog/projections/apiclient"
	"github.com/sbxlog/sbxlog/projections/auth"
)

const rootToken = "root-token"

var defaultKey = fsm.PoolKey{Template: "default", Net: "none", Size: "small"}

// startNode runs an in-process node (hypervisor faked) with a "default"
// pool of warm VMs, tenants acme and other, and returns a root client.
func startNode(t *testing.T, warm int) (*nodetest.Node, *apiclient.Client) {
	t.Helper()
	n, err := nodetest.Start(nodetest.Options{
		Dir:       t.TempDir(),
		RootToken: rootToken,
		Tenants: []auth.TenantConfig{
			{Name: "acme", TokenSHA256: auth.HashToken("acme-token")},
			{Name: "other", TokenSHA256: auth.HashToken("other-token")},
		},
		Pools: []fsm.PoolSpec{{PoolKey: defaultKey, Warm: warm}},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Close() })
	settle(t, n)
	c, err := apiclient.New(n.URL, rootToken, nil)
	if err != nil {
		t.Fatal(err)
	}
	return n, c
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// settle waits until the node has nothing left to do and all is durable.
func settle(t *testing.T, n *nodetest.Node) {
	t.Helper()
	if err := n.Settle(ctxT(t)); err != nil {
		t.Fatal(err)
	}
}

// waitClaim polls the state until the claim has status want.
func waitClaim(t *testing.T, n *nodetest.Node, id string, want fsm.ClaimStatus) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for claimStatus(n, id) != want.String() {
		if time.Now().After(deadline) {
			t.Fatalf("claim %s is %q, want %s", id, claimStatus(n, id), want)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func claimStatus(n *nodetest.Node, id string) string {
	var s string
	n.Engine.View(func(st *fsm.State) {
		if c, ok := st.Claim(id); ok {
			s = c.Status.String()
		}
	})
	return s
}

// cutter is an HTTP client whose connections the test can cut, as a
// network failure would.
type cutter struct {
	mu    sync.Mutex
	conns []net.Conn
}

func (c *cutter) client() *http.Client {
	return &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err == nil {
			c.mu.Lock()
			c.conns = append(c.conns, conn)
			c.mu.Unlock()
		}
		return conn, err
	}}}
}

func (c *cutter) cut() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, conn := range c.conns {
		_ = conn.Close()
	}
	c.conns = nil
}
