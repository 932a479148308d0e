package replication_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/sbxlog/sbxlog/eventlog"
	"github.com/sbxlog/sbxlog/eventlog/event"
	"github.com/sbxlog/sbxlog/eventlog/replication/feed"
	"github.com/sbxlog/sbxlog/eventlog/replication/follower"
	"github.com/sbxlog/sbxlog/eventlog/replication/natsembed/natstest"
	"github.com/sbxlog/sbxlog/eventlog/replication/replicator"
	"github.com/sbxlog/sbxlog/eventlog/replication/repltest"
	"github.com/sbxlog/sbxlog/eventlog/replication/stream"
	"github.com/sbxlog/sbxlog/fsm"
	"github.com/sbxlog/sbxlog/fsm/engine"
	"github.com/sbxlog/sbxlog/fsm/fsmsim"
	"github.com/sbxlog/sbxlog/fsm/fsmtest"
	"github.com/sbxlog/sbxlog/projections/cluster"
)

// Acceptance 1 at the replicator level: two nodes replicate to an R3
// cluster on loopback under a steady stream of appends; the stream leader is
// shut down mid-way and later rejoins. Every event acknowledged before the
// loss is still there, each subject ends with its node's log exactly once in
// order, and each node's follower ends with an identical log (same hash).
func TestR3ClusterLosesAServer(t *testing.T) {
	c := natstest.Cluster(t, 3)
	_, js := natstest.Connect(t, c.URLs())
	scfg := stream.Config{Replicas: 3}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	if _, err := stream.Ensure(ctx, js, scfg); err != nil {
		t.Fatal(err)
	}

	nodes := []string{"n1", "n2"}
	logs := map[string]*eventlog.Log{}
	reps := map[string]*replicator.Replicator{}
	fols := map[string]*follower.Follower{}
	var wg sync.WaitGroup
	runCtx, stopAll := context.WithCancel(context.Background())
	defer func() { stopAll(); wg.Wait() }()
	for _, n := range nodes {
		logs[n] = repltest.OpenLog(t, n)
		r, err := replicator.New(replicator.Options{Log: logs[n], URL: c.URLs(), Stream: scfg, Window: 64,
			PublishTimeout: 2 * time.Second, MaxBackoff: 500 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		reps[n] = r
		f, err := follower.New(follower.Options{JS: js, Replica: repltest.OpenLog(t, n)})
		if err != nil {
			t.Fatal(err)
		}
		fols[n] = f
		wg.Add(2)
		go func() {
			defer wg.Done()
			if err := r.Run(runCtx); err != nil {
				t.Errorf("replicator %s: %v", n, err)
			}
		}()
		go func() {
			defer wg.Done()
			if err := f.Run(runCtx); err != nil {
				t.Errorf("follower %s: %v", n, err)
			}
		}()
	}

	loadCtx, stopLoad := context.WithCancel(ctx)
	var load sync.WaitGroup
	for _, n := range nodes {
		load.Add(1)
		go func() {
			defer load.Done()
			for i := 0; loadCtx.Err() == nil; i++ {
				if _, err := logs[n].Append(context.Background(), []event.Event{repltest.Filler(i)}); err != nil {
					t.Errorf("append %s: %v", n, err)
					return
				}
				time.Sleep(500 * time.Microsecond)
			}
		}()
	}
	natstest.Eventually(t, 30*time.Second, "replication under load", func() bool {
		return reps["n1"].Replicated() > 200 && reps["n2"].Replicated() > 200
	})

	victim := natstest.StreamLeader(t, c, js, stream.DefaultName)
	ackedAtLoss := map[string]uint64{}
	for _, n := range nodes {
		ackedAtLoss[n] = reps[n].Replicated()
	}
	c.Servers[victim].Shutdown()
	natstest.Eventually(t, 30*time.Second, "replication after the leader's loss", func() bool {
		return reps["n1"].Replicated() > ackedAtLoss["n1"]+200 && reps["n2"].Replicated() > ackedAtLoss["n2"]+200
	})
	if err := c.Servers[victim].Restart(); err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 30*time.Second, "replication after the rejoin", func() bool {
		return reps["n1"].Replicated() > ackedAtLoss["n1"]+400 && reps["n2"].Replicated() > ackedAtLoss["n2"]+400
	})
	stopLoad()
	load.Wait()

	for _, n := range nodes {
		l := logs[n]
		if err := reps[n].WaitReplicated(ctx, l.LastSeq()); err != nil {
			t.Fatalf("%s: wait replicated %d: %v (%+v)", n, l.LastSeq(), err, reps[n].Status())
		}
		local := repltest.LocalEvents(t, l)
		got := repltest.ReadSubject(t, js, stream.DefaultName, n)
		if uint64(len(got)) < ackedAtLoss[n] {
			t.Fatalf("%s: %d messages, %d were acknowledged before the loss", n, len(got), ackedAtLoss[n])
		}
		repltest.RequireSubjectIs(t, js, stream.DefaultName, n, local)
		if err := fols[n].WaitFor(ctx, l.LastSeq()); err != nil {
			t.Fatalf("%s: follower at %d: %v", n, fols[n].LastSeq(), err)
		}
		replica := repltest.LocalEvents(t, fols[n].Replica())
		if repltest.Hash(replica) != repltest.Hash(local) || len(replica) != len(local) {
			t.Fatalf("%s: replica %d events %s, node %d events %s", n, len(replica), repltest.Hash(replica), len(local), repltest.Hash(local))
		}
		t.Logf("%s: %d events, %d acknowledged before the loss, hash %s", n, len(local), ackedAtLoss[n], repltest.Hash(local))
	}
}

// A follower's replica of a simulated node (API commands, timers, executor
// results) replays to the node's own state: same state hash.
func TestFollowerReplicaReplaysToNodeState(t *testing.T) {
	srv := natstest.Single(t)
	_, js := natstest.Connect(t, srv.ClientURL())
	node := repltest.OpenLog(t, "n1")
	st := fsm.New()
	if err := fsmtest.Record(context.Background(), node, st, fsmsim.New(42, fsmsim.Options{}), 600, nil); err != nil {
		t.Fatal(err)
	}
	repltest.Replicate(t, srv.ClientURL(), node)
	f, err := follower.New(follower.Options{JS: js, Replica: repltest.OpenLog(t, "n1"), Batch: 50})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.Run(ctx) }()
	defer func() { cancel(); <-done }()
	wctx, wcancel := context.WithTimeout(ctx, 20*time.Second)
	defer wcancel()
	if err := f.WaitFor(wctx, node.LastSeq()); err != nil {
		t.Fatal(err)
	}
	res, err := engine.Rebuild(f.Replica(), engine.RebuildOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := fsm.HashHex(res.State), fsm.HashHex(st); got != want || res.Seq != node.LastSeq() {
		t.Fatalf("replica replays to %s at seq %d, node state %s at %d", got, res.Seq, want, node.LastSeq())
	}
}

// The consumers ride out a restart of the embedded server: the follower
// (durable consumer) and the cluster view (ephemeral consumer) both end at
// the node's last event, the replica identical.
func TestConsumersSurviveNATSRestart(t *testing.T) {
	srv := natstest.Single(t)
	_, js := natstest.Connect(t, srv.ClientURL())
	node := repltest.OpenLog(t, "n1")
	st := fsm.New()
	sim := fsmsim.New(5, fsmsim.Options{})
	if err := fsmtest.Record(context.Background(), node, st, sim, 200, nil); err != nil {
		t.Fatal(err)
	}
	repltest.Replicate(t, srv.ClientURL(), node)
	f, err := follower.New(follower.Options{JS: js, Replica: repltest.OpenLog(t, "n1")})
	if err != nil {
		t.Fatal(err)
	}
	view := cluster.NewView(nil, natstest.Logger())
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	wg.Add(2)
	go func() {
		defer wg.Done()
		if err := f.Run(ctx); err != nil {
			t.Errorf("follower: %v", err)
		}
	}()
	go func() {
		defer wg.Done()
		if err := view.Follow(ctx, feed.Options{JS: js}); err != nil {
			t.Errorf("view: %v", err)
		}
	}()
	caughtUp := func() bool {
		return f.LastSeq() == node.LastSeq() && view.Position("n1") == node.LastSeq()
	}
	natstest.Eventually(t, 20*time.Second, "consumers before the restart", caughtUp)

	srv.Shutdown()
	if err := fsmtest.Record(context.Background(), node, st, sim, 200, nil); err != nil {
		t.Fatal(err)
	}
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 30*time.Second, "consumers after the restart", caughtUp)
	if a, b := repltest.Hash(repltest.LocalEvents(t, node)), repltest.Hash(repltest.LocalEvents(t, f.Replica())); a != b {
		t.Fatalf("replica %s, node %s", b, a)
	}
	ns := view.Nodes()
	if len(ns) != 1 || ns[0].Claims != st.LiveClaims() || ns[0].Broken != "" {
		t.Fatalf("view %+v, node has %d live claims", ns, st.LiveClaims())
	}
}
