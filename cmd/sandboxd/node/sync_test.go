package node_test

// Synchronous replication end to end in one process: a node replicating to
// a real JetStream server on loopback, whose answers built on executor
// events (a clone claim served, a hibernate's outcome) must wait for the
// JetStream ack like the answers to the request's own events.

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sbxlog/sbxlog/cmd/sandboxd/node"
	"github.com/sbxlog/sbxlog/cmd/sandboxd/node/nodetest"
	"github.com/sbxlog/sbxlog/cmd/sandboxd/node/replication"
	"github.com/sbxlog/sbxlog/eventlog/replication/natsembed"
	"github.com/sbxlog/sbxlog/eventlog/replication/natsembed/natstest"
	"github.com/sbxlog/sbxlog/executors"
	"github.com/sbxlog/sbxlog/executors/layout"
	"github.com/sbxlog/sbxlog/fsm"
)

const (
	syncRoot    = "sync-root-token"
	syncTimeout = 700 * time.Millisecond
)

var syncKey = fsm.PoolKey{Template: "default", Net: "none", Size: "small"}

// gatedFake is the in-process fake whose clones wait while a gate is set,
// so a test can act between a claim's commit and its claim_served.
type gatedFake struct {
	*nodetest.FakeDriver
	gate atomic.Pointer[chan struct{}]
}

func (g *gatedFake) Open(r layout.Roots, instance string) (node.Driver, error) {
	if _, err := g.FakeDriver.Open(r, instance); err != nil {
		return nil, err
	}
	return g, nil
}

func (g *gatedFake) Clone(ctx context.Context, in fsm.CloneVM) (executors.Result, error) {
	if ch := g.gate.Load(); ch != nil {
		select {
		case <-*ch:
		case <-ctx.Done():
			return executors.Result{}, ctx.Err()
		}
	}
	return g.FakeDriver.Clone(ctx, in)
}

// syncNode is a node in synchronous mode against srv, with one warm VM.
type syncNode struct {
	*node.Node
	fake *gatedFake
}

func startSyncNode(t *testing.T, srv *natsembed.Server) *syncNode {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fake := &gatedFake{FakeDriver: &nodetest.FakeDriver{}}
	cfg := node.Config{
		DataDir: t.TempDir(), NodeID: "s1", Listener: ln, Instance: "i-sync", RootToken: syncRoot,
		Pools: []fsm.PoolSpec{{PoolKey: syncKey, Warm: 1}}, RestartPolicy: fsm.DefaultRestartPolicy, Concurrency: 8,
		Replication: &node.Replication{
			Options: replication.Options{URL: srv.ClientURL(), Replicas: 1, NoAudit: true, NoUsage: true, Logger: natstest.Logger()},
			Sync:    true, SyncTimeout: syncTimeout, ShutdownFlush: 100 * time.Millisecond,
		},
	}
	n, err := node.Start(context.Background(), cfg, fake)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := n.Stop(); err != nil {
			t.Errorf("stop node: %v", err)
		}
	})
	sn := &syncNode{Node: n, fake: fake}
	sn.settle(t)
	return sn
}

// settle waits until the pool is warm, no intent is pending and JetStream
// acknowledged the whole log.
func (n *syncNode) settle(t *testing.T) {
	t.Helper()
	natstest.Eventually(t, 30*time.Second, "node settled and replicated", func() bool {
		var busy bool
		var applied uint64
		warm := 0
		n.Engine.View(func(st *fsm.State) {
			busy = len(fsm.Intents(st)) > 0 || len(fsm.RefillsNeeded(st)) > 0
			applied = st.Applied()
			if p, ok := st.Pool(syncKey); ok {
				warm = len(p.WarmVMs())
			}
		})
		return !busy && warm >= 1 && n.Repl.Replicator.Replicated() >= applied
	})
}

// waitStatus waits until claim id has status want in the state and
// JetStream acknowledged the state's events.
func (n *syncNode) waitStatus(t *testing.T, id string, want fsm.ClaimStatus) {
	t.Helper()
	natstest.Eventually(t, 10*time.Second, "claim "+id+" "+want.String()+" and replicated", func() bool {
		var c fsm.ClaimRec
		var applied uint64
		n.Engine.View(func(st *fsm.State) { c, _ = st.Claim(id); applied = st.Applied() })
		return c.Status == want && n.Repl.Replicator.Replicated() >= applied
	})
}

func (n *syncNode) status(id string) fsm.ClaimStatus {
	var c fsm.ClaimRec
	n.Engine.View(func(st *fsm.State) { c, _ = st.Claim(id) })
	return c.Status
}

// call sends one root request and returns its status and body.
func (n *syncNode) call(t *testing.T, method, path, body string) (int, []byte) {
	t.Helper()
	code, out, err := n.do(method, path, body)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	return code, out
}

func (n *syncNode) do(method, path, body string) (int, []byte, error) {
	var b []byte
	if body != "" {
		b = []byte(body)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return nodetest.Call(ctx, method, n.URL(), path, syncRoot, b)
}

// claim claims a sandbox of syncKey and returns its id.
func (n *syncNode) claim(t *testing.T) string {
	t.Helper()
	code, body := n.call(t, "POST", "/v1/claim", `{"template":"default"}`)
	if code != http.StatusOK {
		t.Fatalf("claim: %d %s", code, body)
	}
	var cr struct{ ID string }
	if err := json.Unmarshal(body, &cr); err != nil || cr.ID == "" {
		t.Fatalf("claim: %s: %v", body, err)
	}
	return cr.ID
}

// wantNotReplicated checks an answer is the sync engine's 503 for a missing
// ack: the JSON error saying the events are committed here but not
// replicated within the sync timeout.
func wantNotReplicated(t *testing.T, what string, code int, body []byte) {
	t.Helper()
	var e struct{ Error string }
	want := "committed on this node but not replicated: no acknowledgement within " + syncTimeout.String()
	if code != http.StatusServiceUnavailable || json.Unmarshal(body, &e) != nil || !strings.HasPrefix(e.Error, "unavailable: event ") || !strings.Contains(e.Error, want) {
		t.Fatalf("%s without JetStream: %d %s, want 503 {\"error\": \"unavailable: event N is %s\"}", what, code, body, want)
	}
}

// answer is one request's answer, sent in the background.
type answer struct {
	code int
	body []byte
	err  error
	at   time.Time
}

func (n *syncNode) callAsync(method, path, body string) <-chan answer {
	ch := make(chan answer, 1)
	go func() {
		code, out, err := n.do(method, path, body)
		ch <- answer{code, out, err, time.Now()}
	}()
	return ch
}

// await returns the background request's answer.
func await(t *testing.T, what string, ch <-chan answer) answer {
	t.Helper()
	a := <-ch
	if a.err != nil {
		t.Fatalf("%s: %v", what, a.err)
	}
	return a
}

// A hibernate's 204 reports its hibernated event: with JetStream healthy it
// answers once that is acknowledged; when JetStream stops acknowledging
// after the hibernate was requested (and that acknowledged), the answer is
// the sync engine's 503 within the sync timeout, not a 204, the sandbox
// hibernated on the node all the same.
func TestSyncHibernateWaitsForJetStream(t *testing.T) {
	srv := natstest.Single(t)
	n := startSyncNode(t, srv)

	id := n.claim(t)
	n.settle(t)
	if code, body := n.call(t, "POST", "/v1/sandboxes/"+id+"/hibernate", ""); code != http.StatusNoContent {
		t.Fatalf("hibernate with JetStream: %d %s", code, body)
	}
	var applied uint64
	n.Engine.View(func(st *fsm.State) { applied = st.Applied() })
	if n.status(id) != fsm.ClaimHibernated || n.Repl.Replicator.Replicated() < applied {
		t.Fatalf("hibernate answered 204 with the claim %s, replicated %d < %d", n.status(id), n.Repl.Replicator.Replicated(), applied)
	}
	if code, body := n.call(t, "POST", "/v1/sandboxes/"+id+"/wake", ""); code != http.StatusNoContent {
		t.Fatalf("wake with JetStream: %d %s", code, body)
	}
	n.settle(t)

	const hibernateTakes = 500 * time.Millisecond
	n.fake.SetDelay(fsm.KindHibernate, hibernateTakes)
	res := n.callAsync("POST", "/v1/sandboxes/"+id+"/hibernate", "")
	n.waitStatus(t, id, fsm.ClaimHibernating)
	down := time.Now()
	srv.Shutdown()
	a := await(t, "hibernate", res)
	wantNotReplicated(t, "hibernate", a.code, a.body)
	if took := a.at.Sub(down); took < syncTimeout || took > hibernateTakes+syncTimeout+3*time.Second {
		t.Errorf("hibernate answered %v after JetStream went away, hibernating takes %v, sync timeout %v", took, hibernateTakes, syncTimeout)
	}
	if got := n.status(id); got != fsm.ClaimHibernated {
		t.Errorf("the unconfirmed hibernate left the claim %s, want hibernated", got)
	}
}

// A clone claim's 200 reports its claim_served: when JetStream stops
// acknowledging after the claim was committed (and that acknowledged) but
// before it is served, the answer is the sync engine's 503, not a 200.
func TestSyncCloneClaimWaitsForJetStream(t *testing.T) {
	srv := natstest.Single(t)
	n := startSyncNode(t, srv)

	// With JetStream healthy, the warm claim and then a clone claim (the
	// pool's one warm VM is taken, its refill held) answer 200.
	gate := make(chan struct{})
	n.fake.gate.Store(&gate)
	n.claim(t)
	res := n.callAsync("POST", "/v1/claim", `{"template":"default"}`)
	natstest.Eventually(t, 10*time.Second, "a pending clone claim", func() bool { return pendingClaims(n) == 1 })
	close(gate)
	if a := await(t, "clone claim", res); a.code != http.StatusOK {
		t.Fatalf("clone claim with JetStream: %d %s", a.code, a.body)
	}
	n.settle(t)

	// Take the warm VM again, then claim with JetStream gone before the
	// clone serves.
	gate = make(chan struct{})
	n.fake.gate.Store(&gate)
	n.claim(t)
	res = n.callAsync("POST", "/v1/claim", `{"template":"default"}`)
	var id string
	natstest.Eventually(t, 10*time.Second, "a pending clone claim, replicated", func() bool {
		var applied uint64
		n.Engine.View(func(st *fsm.State) {
			applied = st.Applied()
			for _, cid := range st.ClaimIDs() {
				if c, _ := st.Claim(cid); c.Status == fsm.ClaimPending {
					id = cid
				}
			}
		})
		return id != "" && n.Repl.Replicator.Replicated() >= applied
	})
	down := time.Now()
	srv.Shutdown()
	close(gate)
	a := await(t, "clone claim", res)
	wantNotReplicated(t, "clone claim", a.code, a.body)
	if took := a.at.Sub(down); took < syncTimeout || took > syncTimeout+3*time.Second {
		t.Errorf("clone claim answered %v after JetStream went away, sync timeout %v", took, syncTimeout)
	}
	if got := n.status(id); got != fsm.ClaimRunning {
		t.Errorf("the unconfirmed clone claim is %s, want running", got)
	}
}

func pendingClaims(n *syncNode) int {
	pending := 0
	n.Engine.View(func(st *fsm.State) {
		for _, id := range st.ClaimIDs() {
			if c, _ := st.Claim(id); c.Status == fsm.ClaimPending {
				pending++
			}
		}
	})
	return pending
}
