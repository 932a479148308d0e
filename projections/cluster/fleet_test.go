package cluster_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/sbxlog/sbxlog/eventlog/replication/feed"
	"github.com/sbxlog/sbxlog/eventlog/replication/natsembed/natstest"
	"github.com/sbxlog/sbxlog/eventlog/replication/repltest"
	"github.com/sbxlog/sbxlog/eventlog/replication/stream"
	"github.com/sbxlog/sbxlog/fsm"
	"github.com/sbxlog/sbxlog/fsm/fsmtest"
	"github.com/sbxlog/sbxlog/projections/cluster"
)

// announcer runs cluster.Announce for one node until stopped.
type announcer struct {
	stop context.CancelFunc
	done chan struct{}
}

func announce(t *testing.T, o cluster.DirectoryOptions, node, addr string) *announcer {
	ctx, cancel := context.WithCancel(context.Background())
	a := &announcer{stop: cancel, done: make(chan struct{})}
	go func() {
		defer close(a.done)
		if err := cluster.Announce(ctx, o, node, addr); err != nil {
			t.Error(err)
		}
	}()
	t.Cleanup(a.halt)
	return a
}

func (a *announcer) halt() { a.stop(); <-a.done }

// Placement: among equal nodes, a redirect names at most two of them,
// chosen by power-of-two-choices, and the first target of 1,000 claims
// lands within 20% of even on each; a withdrawn node is named by none.
func TestRedirectPowerOfTwoChoices(t *testing.T) {
	srv := natstest.Single(t)
	_, js := natstest.Connect(t, srv.ClientURL())
	ids := []string{"n0", "n1", "n2", "n3"}
	for _, id := range ids {
		n := fsmtest.NewNode(t, repltest.OpenLog(t, id), fsm.PoolSpec{PoolKey: k1, Warm: 2})
		repltest.Replicate(t, srv.ClientURL(), n.Log)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dopts := cluster.DirectoryOptions{JS: js}
	dir, err := cluster.WatchDirectory(ctx, dopts)
	if err != nil {
		t.Fatal(err)
	}
	ann := map[string]*announcer{}
	for _, id := range ids {
		ann[id] = announce(t, dopts, id, id+":7777")
	}
	view := cluster.NewView(dir, natstest.Logger())
	view.SetRand(rand.New(rand.NewPCG(26, 1)).IntN)
	go func() { _ = view.Follow(ctx, feed.Options{JS: js}) }()
	natstest.Eventually(t, 10*time.Second, "all four nodes warm and live", func() bool {
		return len(view.Warm(k1)) == 4 && len(dir.Live()) == 4
	})

	const claims = 1000
	spread := func() map[string]int {
		first := map[string]int{}
		for range claims {
			got := view.RedirectTargets(k1, "n0")
			if len(got) != 2 || got[0] == got[1] {
				t.Fatalf("redirect %v: want two distinct targets", got)
			}
			for _, a := range got {
				if a == "n0:7777" {
					t.Fatalf("redirect %v names the node itself", got)
				}
			}
			first[got[0]]++
		}
		return first
	}
	first := spread()
	even := claims / 3
	for _, id := range ids[1:] {
		if n := first[id+":7777"]; n < even*8/10 || n > even*12/10 {
			t.Errorf("%s first in %d of %d redirects, want %d ± 20%% (%v)", id, n, claims, even, first)
		}
	}
	t.Logf("first targets over %d redirects: %v", claims, first)

	// n3 stops cleanly: it withdraws, and at once no redirect names it.
	ann["n3"].halt()
	if err := cluster.Withdraw(ctx, dopts, "n3"); err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 5*time.Second, "n3 withdrawn", func() bool {
		e, ok := dir.Lookup("n3")
		return ok && e.Withdrawn && !e.Live
	})
	for range claims {
		for _, a := range view.RedirectTargets(k1, "n0") {
			if a == "n3:7777" {
				t.Fatal("a redirect names the withdrawn node")
			}
		}
	}
	for _, ns := range view.Nodes() {
		if want := ns.Node != "n3"; ns.Live != want || ns.LastSeen == "" || ns.Addr != ns.Node+":7777" || ns.Withdrawn == want {
			t.Errorf("row %+v: want live %v with last_seen and addr", ns, want)
		}
	}
}

// pickTwo orders a pair by warm VMs: the emptier node is never first.
func TestRedirectMoreWarmFirst(t *testing.T) {
	srv := natstest.Single(t)
	_, js := natstest.Connect(t, srv.ClientURL())
	for id, warm := range map[string]int{"a": 1, "b": 3} {
		n := fsmtest.NewNode(t, repltest.OpenLog(t, id), fsm.PoolSpec{PoolKey: k1, Warm: warm})
		repltest.Replicate(t, srv.ClientURL(), n.Log)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dopts := cluster.DirectoryOptions{JS: js}
	dir, _ := cluster.WatchDirectory(ctx, dopts)
	announce(t, dopts, "a", "a:1")
	announce(t, dopts, "b", "b:1")
	view := cluster.NewView(dir, natstest.Logger())
	go func() { _ = view.Follow(ctx, feed.Options{JS: js}) }()
	natstest.Eventually(t, 10*time.Second, "both warm and live", func() bool {
		return len(view.Warm(k1)) == 2 && len(dir.Live()) == 2
	})
	for range 100 {
		if got := view.RedirectTargets(k1, "self"); len(got) != 2 || got[0] != "b:1" {
			t.Fatalf("redirect %v, want b (3 warm) before a (1 warm)", got)
		}
	}
}

// Liveness is judged by last-seen time counted while the watch delivers:
// when no heartbeat arrives at all (a KV leader change, the watch's server
// lost) nobody is declared dead, however long the stall; once deliveries
// resume, a node that stayed silent lapses within the TTL.
func TestDirectoryLivenessThroughAStall(t *testing.T) {
	srv := natstest.Single(t)
	_, js := natstest.Connect(t, srv.ClientURL())
	clock := &fakeClock{t: time.Now()}
	dopts := cluster.DirectoryOptions{JS: js, TTL: 2 * time.Second, Now: clock.Now}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dir, err := cluster.WatchDirectory(ctx, dopts)
	if err != nil {
		t.Fatal(err)
	}
	a := announce(t, dopts, "a", "a:1")
	b := announce(t, dopts, "b", "b:1")
	natstest.Eventually(t, 10*time.Second, "both live", func() bool { return len(dir.Live()) == 2 })

	// The stall: no heartbeat reaches the directory for a minute.
	a.halt()
	b.halt()
	clock.Add(time.Minute)
	if live := dir.Live(); len(live) != 2 {
		t.Fatalf("after a one-minute stall of the watch: live %v, want both", live)
	}

	// Deliveries resume with a's heartbeats only: b lapses, a stays.
	announce(t, dopts, "a", "a:1")
	natstest.Eventually(t, 10*time.Second, "b to lapse", func() bool {
		clock.Add(50 * time.Millisecond)
		_, bLive := dir.Addr("b")
		return !bLive
	})
	if _, aLive := dir.Addr("a"); !aLive {
		t.Fatal("a lapsed while it beats")
	}
	e, ok := dir.Lookup("b")
	if !ok || e.Live || e.Withdrawn || e.LastSeen.IsZero() {
		t.Fatalf("b's entry %+v", e)
	}
}

// The view's consumer survives the loss of any one server of a three-server
// cluster: after each server in turn is shut down, an event appended then
// reaches the view within the bound docs/operations.md states (5 s), not
// after the client's ~30 s heartbeat timeout.
func TestViewSurvivesAServerLoss(t *testing.T) {
	c := natstest.Cluster(t, 3)
	_, js := natstest.Connect(t, c.URLs())
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := stream.Ensure(ctx, js, stream.Config{Replicas: 3}); err != nil {
		t.Fatal(err)
	}
	n := fsmtest.NewNode(t, repltest.OpenLog(t, "n"), fsm.PoolSpec{PoolKey: k1, Warm: 1})
	rep := repltest.Replicate(t, c.URLs(), n.Log)
	view := cluster.NewView(nil, natstest.Logger())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := view.Follow(ctx, feed.Options{JS: js}); err != nil {
			t.Error(err)
		}
	}()
	defer func() { cancel(); wg.Wait() }()
	natstest.Eventually(t, 20*time.Second, "view caught up", func() bool { return view.Position("n") == n.Log.LastSeq() })

	for i, s := range c.Servers {
		s.Shutdown()
		start := time.Now()
		id := n.Claim(k1)
		seq := n.Log.LastSeq()
		// Publishing recovers on its own schedule (a stream leader
		// election); the view's lag counts from the stream holding the
		// event.
		var published, seen time.Time
		natstest.Eventually(t, 30*time.Second, fmt.Sprintf("claim after server %d's loss in the view", i), func() bool {
			if published.IsZero() && rep.Replicated() >= seq {
				published = time.Now()
			}
			if _, ok := view.Owner(id); ok && seen.IsZero() {
				seen = time.Now()
			}
			return !published.IsZero() && !seen.IsZero()
		})
		lag := max(seen.Sub(published), 0)
		t.Logf("server %d (%s) lost: published after %v, in the view %v later", i, s.Name(), published.Sub(start).Round(time.Millisecond), lag.Round(time.Millisecond))
		if lag > 5*time.Second {
			t.Errorf("server %d lost: view lag %v, over the 5 s bound", i, lag)
		}
		n.Release(id)
		if err := s.Restart(); err != nil {
			t.Fatal(err)
		}
		if err := c.WaitJetStream(ctx); err != nil {
			t.Fatal(err)
		}
		natstest.Eventually(t, 30*time.Second, "view caught up after the restart", func() bool { return view.Position("n") == n.Log.LastSeq() })
	}
}
