package e2e

// Replication at the daemon level (issue 7): sandboxd processes replicating
// to NATS servers run by the test process (natstest), with followers in the
// test process.

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sbxlog/sbxlog/cmd/sandboxd/node/replication"
	"github.com/sbxlog/sbxlog/eventlog"
	"github.com/sbxlog/sbxlog/eventlog/event"
	"github.com/sbxlog/sbxlog/eventlog/replication/follower"
	"github.com/sbxlog/sbxlog/eventlog/replication/natsembed/natstest"
	"github.com/sbxlog/sbxlog/eventlog/replication/stream"
	"github.com/sbxlog/sbxlog/fsm"
	"github.com/sbxlog/sbxlog/fsm/engine"
	"github.com/sbxlog/sbxlog/projections/api"
	"github.com/sbxlog/sbxlog/projections/apiclient"
)

const replRoot = "repl-root-token"

// replNode is one sandboxd of a replication test.
type replNode struct {
	id, dir, data, addr string
	d                   *daemon
	c                   *apiclient.Client
}

// startReplNode starts sandboxd node id against the NATS urls with one pool
// "r/none/small" of warm VMs (none when warm is 0) and extra nats settings.
func startReplNode(t *testing.T, id, urls string, replicas, warm int, nats map[string]any) *replNode {
	t.Helper()
	n := &replNode{id: id, dir: t.TempDir(), addr: freeAddr(t)}
	n.data = filepath.Join(n.dir, "data")
	nc := map[string]any{"url": urls, "replicas": replicas}
	for k, v := range nats {
		nc[k] = v
	}
	pools := []any{}
	if warm > 0 {
		pools = append(pools, map[string]any{"template": "r", "net": "none", "size": "small", "warm": warm})
	}
	cfg := filepath.Join(n.dir, "sandboxd.json")
	writeJSON(t, cfg, map[string]any{
		"listen": n.addr, "data_dir": n.data, "node_id": id, "api_token": replRoot, "hypervisor": "chsim",
		"pools": pools, "nats": nc,
	})
	n.d = startDaemon(t, n.dir, n.data, n.addr, "-config", cfg)
	c, err := apiclient.New(n.addr, replRoot, nil)
	if err != nil {
		t.Fatal(err)
	}
	n.c = c
	return n
}

// repl returns the node's /v1/info replication status.
func (n *replNode) repl(t *testing.T) replication.Status {
	t.Helper()
	req, err := http.NewRequest("GET", "http://"+n.addr+"/v1/info", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+replRoot)
	hc := http.Client{Timeout: 10 * time.Second}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("%s: info: %v", n.id, err)
	}
	defer resp.Body.Close()
	var in struct {
		api.Info
		Replication *replication.Status `json:"replication"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&in); err != nil || in.Replication == nil {
		t.Fatalf("%s: info without replication: %v", n.id, err)
	}
	return *in.Replication
}

// waitRepl polls the node's replication status until cond holds.
func (n *replNode) waitRepl(t *testing.T, d time.Duration, what string, cond func(replication.Status) bool) replication.Status {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		st := n.repl(t)
		if cond(st) {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: waiting %s for %s: %+v", n.id, d, what, st)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitWarm waits until the node's pool r/none/small has want warm VMs.
func (n *replNode) waitWarm(t *testing.T, ctx context.Context, want int) {
	t.Helper()
	waitInfo(t, ctx, n.c, n.id+" warm pool", func(in *api.Info) bool {
		p, ok := poolOf(in, "r/none/small")
		return ok && p.Golden && p.Warm >= want
	})
}

// startFollower runs a follower of node in the test process until the test
// ends.
func startFollower(t *testing.T, js jetstream.JetStream, node string) *follower.Follower {
	t.Helper()
	replica, err := eventlog.Open(filepath.Join(t.TempDir(), "replica-"+node), eventlog.Options{NodeID: node})
	if err != nil {
		t.Fatal(err)
	}
	f, err := follower.New(follower.Options{JS: js, Replica: replica, Logger: natstest.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("follower of %s: %v", node, err)
		}
		_ = replica.Close()
	})
	return f
}

// logDigest hashes a log's records (their encoding, in order) and replays
// it from its first event (no snapshot) to a state hash.
func logDigest(t *testing.T, l *eventlog.Log) (records, state string) {
	t.Helper()
	h := sha256.New()
	var buf []byte
	next := uint64(1)
	if err := l.Iterate(1, l.LastSeq(), func(ev *event.Event) error {
		if ev.Seq != next {
			return fmt.Errorf("seq %d where %d was due", ev.Seq, next)
		}
		next++
		buf = event.AppendEncode(buf[:0], ev)
		h.Write(buf)
		return nil
	}); err != nil {
		t.Fatalf("iterate %s: %v", l.NodeID(), err)
	}
	res, err := engine.Rebuild(l, engine.RebuildOptions{NoSnapshot: true})
	if err != nil {
		t.Fatalf("replay %s: %v", l.NodeID(), err)
	}
	return fmt.Sprintf("%x", h.Sum(nil)), fsm.HashHex(res.State)
}

// subjectCount is how many messages the stream holds on node's subject.
func subjectCount(t *testing.T, ctx context.Context, js jetstream.JetStream, node string) uint64 {
	t.Helper()
	st, err := js.Stream(ctx, stream.DefaultName)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(stream.Subject(node)))
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Subjects[stream.Subject(node)]
}

// TestReplR3Loss (a short name: unix socket paths under t.TempDir() must
// stay below 108 bytes) is acceptance 1 of issue 7 at the
// daemon level: two sandboxd nodes replicate to a 3-server JetStream
// cluster (R3) while claims and releases run on both; the stream's leader
// is killed mid-way. Every event acknowledged before the loss is still in
// the stream, replication goes on, and after the nodes stop each subject
// holds exactly its node's log and each node's follower (in this process)
// holds the same records and replays to the same state hash.
func TestReplR3Loss(t *testing.T) {
	cl := natstest.Cluster(t, 3)
	_, js := natstest.Connect(t, cl.URLs())
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	nodes := []*replNode{
		startReplNode(t, "n1", cl.URLs(), 3, 2, nil),
		startReplNode(t, "n2", cl.URLs(), 3, 2, nil),
	}
	fols := map[string]*follower.Follower{}
	for _, n := range nodes {
		fols[n.id] = startFollower(t, js, n.id)
		n.waitWarm(t, ctx, 1)
	}

	// A steady stream of claims and releases on both nodes.
	loadCtx, stopLoad := context.WithCancel(ctx)
	var load sync.WaitGroup
	claims := make([]int, len(nodes))
	for i, n := range nodes {
		load.Add(1)
		go func() {
			defer load.Done()
			for loadCtx.Err() == nil {
				cctx, ccancel := context.WithTimeout(ctx, 30*time.Second)
				c := n.c
				cr, err := c.Claim(cctx, api.ClaimRequest{Template: "r"})
				// With no warm VM left here and some on the other node,
				// the claim is redirected there: follow it, as a client
				// does. The views lag, so the other node may send it
				// back: a few hops, then try again later.
				var ae *apiclient.Error
				for hop := 0; hop < 3 && errors.As(err, &ae) && len(ae.Redirect) > 0; hop++ {
					if c, err = apiclient.New(ae.Redirect[0], replRoot, nil); err == nil {
						cr, err = c.Claim(cctx, api.ClaimRequest{Template: "r"})
					}
				}
				if errors.As(err, &ae) && len(ae.Redirect) > 0 {
					ccancel()
					time.Sleep(10 * time.Millisecond)
					continue
				}
				if err == nil {
					err = c.Release(cctx, cr.ID)
				}
				ccancel()
				if err != nil {
					t.Errorf("%s: claim/release: %v", n.id, err)
					return
				}
				claims[i]++
				time.Sleep(10 * time.Millisecond)
			}
		}()
	}
	acked := map[string]uint64{}
	for _, n := range nodes {
		acked[n.id] = n.waitRepl(t, 30*time.Second, "replication under load", func(st replication.Status) bool {
			return st.Replicator.Replicated > 100
		}).Replicator.Replicated
	}

	// Kill the stream's leader.
	victim := natstest.StreamLeader(t, cl, js, stream.DefaultName)
	for _, n := range nodes {
		acked[n.id] = n.repl(t).Replicator.Replicated
	}
	cl.Servers[victim].Shutdown()
	t.Logf("killed NATS server %s (stream leader); acknowledged before: %v", cl.Servers[victim].Name(), acked)
	for _, n := range nodes {
		n.waitRepl(t, 45*time.Second, "replication after the leader's loss", func(st replication.Status) bool {
			return st.Replicator.Replicated > acked[n.id]+150
		})
	}
	stopLoad()
	load.Wait()

	// Stop the nodes (SIGTERM lets each publish its tail), then compare.
	for i, n := range nodes {
		if claims[i] == 0 {
			t.Fatalf("%s: no claim went through", n.id)
		}
		n.d.stop(t)
		killVMMs(t, n.data)
		l, err := eventlog.Open(filepath.Join(n.data, "log"), eventlog.Options{ReadOnly: true})
		if err != nil {
			t.Fatal(err)
		}
		last := l.LastSeq()
		if got := subjectCount(t, ctx, js, n.id); got != last {
			t.Errorf("%s: stream holds %d messages on its subject, the log %d events", n.id, got, last)
		}
		if last < acked[n.id] {
			t.Errorf("%s: log ends at %d, %d were acknowledged", n.id, last, acked[n.id])
		}
		if err := fols[n.id].WaitFor(ctx, last); err != nil {
			t.Fatalf("%s: follower at %d of %d: %v (%+v)", n.id, fols[n.id].LastSeq(), last, err, fols[n.id].Status())
		}
		nodeRec, nodeState := logDigest(t, l)
		repRec, repState := logDigest(t, fols[n.id].Replica())
		_ = l.Close()
		if fols[n.id].LastSeq() != last || repRec != nodeRec || repState != nodeState {
			t.Errorf("%s: replica %d events, records %s state %s; node %d events, records %s state %s",
				n.id, fols[n.id].LastSeq(), repRec, repState, last, nodeRec, nodeState)
		}
		t.Logf("%s: %d claims, %d events (%d acknowledged before the loss), state %s", n.id, claims[i], last, acked[n.id], nodeState)
	}
}

// TestReplRedirect is acceptance 5 of issue 7: node b has no warm VM
// for a key node a has warm; a claim on b answers 200 {"redirect": [a]}, the
// claim sent there succeeds, and b then names a as the sandbox's owner.
func TestReplRedirect(t *testing.T) {
	srv := natstest.Single(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a := startReplNode(t, "a", srv.ClientURL(), 1, 1, nil)
	b := startReplNode(t, "b", srv.ClientURL(), 1, 0, nil)
	a.waitWarm(t, ctx, 1)
	b.waitRepl(t, 30*time.Second, "a's warm VM in b's cluster view", func(st replication.Status) bool {
		var warm, live bool
		for _, n := range st.Nodes {
			warm = warm || (n.Node == "a" && n.Warm["r/none/small"] >= 1)
		}
		for _, ad := range st.Addresses {
			live = live || (ad.Node == "a" && ad.Addr == a.addr)
		}
		return warm && live
	})
	before := b.repl(t).Replicator.Replicated

	_, err := b.c.Claim(ctx, api.ClaimRequest{Template: "r"})
	var ae *apiclient.Error
	if !errors.As(err, &ae) || ae.Status != http.StatusOK || len(ae.Redirect) != 1 || ae.Redirect[0] != a.addr {
		t.Fatalf("claim on b: %v, want the old daemon's 200 redirect to %s", err, a.addr)
	}
	// b lists a, the other live node, as its peer.
	if peers, err := b.c.Peers(ctx); err != nil || len(peers) != 1 || peers[0] != a.addr {
		t.Fatalf("b's peers: %v, %v; want [%s]", peers, err, a.addr)
	}
	if in, err := b.c.Info(ctx); err != nil || in.Live != 0 || in.LogSeq != before {
		t.Fatalf("b after the redirect: %+v, %v (log_seq was %d)", in, err, before)
	}

	// Follow the redirect.
	ca, err := apiclient.New(ae.Redirect[0], replRoot, nil)
	if err != nil {
		t.Fatal(err)
	}
	cr, err := ca.Claim(ctx, api.ClaimRequest{Template: "r"})
	if err != nil || cr.Tier != "warm" || cr.OwnerAddr != a.addr {
		t.Fatalf("claim on a: %+v, %v", cr, err)
	}

	// b names a as the owner once its view has a's claim.
	deadline := time.Now().Add(20 * time.Second)
	for {
		owner, err := b.c.Owner(ctx, cr.ID)
		if err == nil && owner == a.addr {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("b's owner of %s: %q, %v; want %s", cr.ID, owner, err, a.addr)
		}
		time.Sleep(20 * time.Millisecond)
	}
	sb, err := b.c.Sandbox(ctx, cr.ID)
	if err != nil || sb.OwnerAddr != a.addr {
		t.Fatalf("GET %s on b: %+v, %v", cr.ID, sb, err)
	}
	if err := b.c.Release(ctx, cr.ID); apiclient.StatusOf(err) != http.StatusNotFound || !strings.Contains(err.Error(), a.addr) {
		t.Fatalf("release on b: %v, want 404 naming %s", err, a.addr)
	}
	if err := ca.Release(ctx, cr.ID); err != nil {
		t.Fatalf("release on a: %v", err)
	}
}

// TestReplSync: with nats.sync an API write answers once
// JetStream holds its events; without NATS it answers 503 after
// sync_timeout_ms, the change committed on the node all the same; with
// NATS back the writes go through again.
func TestReplSync(t *testing.T) {
	srv := natstest.Single(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	n := startReplNode(t, "s", srv.ClientURL(), 1, 1, map[string]any{"sync": true, "sync_timeout_ms": 700})
	n.waitWarm(t, ctx, 1)

	claim := func() (*api.ClaimResponse, uint64, error) {
		in, err := n.c.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		cr, err := n.c.Claim(ctx, api.ClaimRequest{Template: "r"})
		return cr, in.LogSeq, err
	}
	cr, before, err := claim()
	if err != nil {
		t.Fatalf("claim: %v", err)
	}
	// The claim's event follows before and was acknowledged when it answered.
	if got := n.repl(t).Replicator.Replicated; got <= before {
		t.Fatalf("claim answered with replicated %d, its event is after %d", got, before)
	}
	if err := n.c.Release(ctx, cr.ID); err != nil {
		t.Fatalf("release: %v", err)
	}

	srv.Shutdown()
	start := time.Now()
	_, _, err = claim()
	took := time.Since(start)
	if apiclient.StatusOf(err) != http.StatusServiceUnavailable || !strings.Contains(err.Error(), "not replicated") {
		t.Fatalf("claim without NATS: %v, want 503 not replicated", err)
	}
	if took < 700*time.Millisecond || took > 10*time.Second {
		t.Errorf("claim without NATS answered after %v, sync_timeout_ms is 700", took)
	}
	if in, err := n.c.Info(ctx); err != nil || in.Live != 1 {
		t.Fatalf("the unconfirmed claim is not live on the node: %+v, %v", in, err)
	}

	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, _, err := claim()
		if err == nil {
			break
		}
		if apiclient.StatusOf(err) != http.StatusServiceUnavailable || time.Now().After(deadline) {
			t.Fatalf("claim after NATS returned: %v", err)
		}
	}
	n.waitRepl(t, 30*time.Second, "the whole log replicated", func(st replication.Status) bool {
		return st.Replicator.Pending == 0 && st.Replicator.State == "running"
	})
}
