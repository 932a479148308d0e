package cluster_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/sbxlog/sbxlog/eventlog/event"
	"github.com/sbxlog/sbxlog/eventlog/replication/feed"
	"github.com/sbxlog/sbxlog/eventlog/replication/natsembed/natstest"
	"github.com/sbxlog/sbxlog/eventlog/replication/repltest"
	"github.com/sbxlog/sbxlog/fsm"
	"github.com/sbxlog/sbxlog/fsm/fsmtest"
	"github.com/sbxlog/sbxlog/projections/cluster"
)

var (
	k1 = event.PoolKey{Template: "tpl", Net: "none", Size: "small"}
	k2 = event.PoolKey{Template: "tpl", Net: "none", Size: "medium"}
)

// fakeClock is the directory's injected clock.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// The view of two nodes matches each node's own state: warm per key, owner
// of each claim; the redirect for a key a node lacks names the node that
// has it, only while that node announces its address.
func TestViewCapacityOwnersAndRedirects(t *testing.T) {
	srv := natstest.Single(t)
	_, js := natstest.Connect(t, srv.ClientURL())
	a := fsmtest.NewNode(t, repltest.OpenLog(t, "node-a"), fsm.PoolSpec{PoolKey: k1, Warm: 0}, fsm.PoolSpec{PoolKey: k2, Warm: 2})
	b := fsmtest.NewNode(t, repltest.OpenLog(t, "node-b"), fsm.PoolSpec{PoolKey: k1, Warm: 3})
	onA := a.Claim(k2)
	onB := b.Claim(k1) // takes one warm VM; not refilled yet
	for _, n := range []*fsmtest.Node{a, b} {
		repltest.Replicate(t, srv.ClientURL(), n.Log)
	}

	// The clock starts at the real time: replayed entries are judged by the
	// server's timestamps too.
	clock := &fakeClock{t: time.Now()}
	dopts := cluster.DirectoryOptions{JS: js, TTL: 3 * time.Second, Now: clock.Now}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dir, err := cluster.WatchDirectory(ctx, dopts)
	if err != nil {
		t.Fatal(err)
	}
	annA, stopA := context.WithCancel(ctx)
	annB, stopB := context.WithCancel(ctx)
	var ann sync.WaitGroup
	for _, x := range []struct {
		ctx  context.Context
		node string
	}{{annA, "node-a"}, {annB, "node-b"}} {
		ann.Add(1)
		go func() {
			defer ann.Done()
			if err := cluster.Announce(x.ctx, dopts, x.node, x.node+".example:7777"); err != nil {
				t.Error(err)
			}
		}()
	}
	defer func() { stopA(); stopB(); ann.Wait() }()

	view := cluster.NewView(dir, natstest.Logger())
	go func() {
		if err := view.Follow(ctx, feed.Options{JS: js}); err != nil {
			t.Error(err)
		}
	}()
	natstest.Eventually(t, 10*time.Second, "view to catch up", func() bool {
		return view.Position("node-a") == a.Log.LastSeq() && view.Position("node-b") == b.Log.LastSeq()
	})
	natstest.Eventually(t, 10*time.Second, "both addresses", func() bool { return len(dir.Live()) == 2 })

	if got := view.Warm(k1); len(got) != 1 || got[0] != (cluster.Capacity{Node: "node-b", Warm: b.Warm(k1)}) || b.Warm(k1) != 2 {
		t.Fatalf("warm k1: %+v (node b has %d)", got, b.Warm(k1))
	}
	if got := view.Warm(k2); len(got) != 1 || got[0] != (cluster.Capacity{Node: "node-a", Warm: a.Warm(k2)}) {
		t.Fatalf("warm k2: %+v (node a has %d)", got, a.Warm(k2))
	}
	for claim, owner := range map[string]string{onA: "node-a", onB: "node-b"} {
		node, addr, ok, err := view.OwnerAddr(claim)
		if !ok || err != nil || node != owner || addr != owner+".example:7777" {
			t.Fatalf("owner of %s: %s %s %v %v", claim, node, addr, ok, err)
		}
	}
	if _, ok := view.Owner("sb_unknown"); ok {
		t.Fatal("owner of an unknown claim")
	}
	if got := view.RedirectTargets(k1, "node-a"); len(got) != 1 || got[0] != "node-b.example:7777" {
		t.Fatalf("redirect for k1 from a: %v", got)
	}
	if got := view.RedirectTargets(k1, "node-b"); len(got) != 0 {
		t.Fatalf("redirect for k1 from b (itself): %v", got)
	}

	// Node b refills; the view follows.
	b.Settle()
	natstest.Eventually(t, 10*time.Second, "refill seen", func() bool {
		got := view.Warm(k1)
		return len(got) == 1 && got[0].Warm == 3
	})
	if ns := view.Nodes(); len(ns) != 2 || ns[1].Warm[k1.String()] != 3 || ns[1].Claims != 1 || ns[0].Broken != "" {
		t.Fatalf("nodes %+v", ns)
	}

	// Node b stops announcing: once its heartbeat is older than the TTL it
	// is no redirect target, though its log and capacity are still known.
	stopB()
	clock.Add(2 * time.Second)
	if _, live := dir.Addr("node-b"); !live {
		t.Fatal("node b gone before its TTL")
	}
	// Liveness time runs while the watch delivers (node a's beats).
	natstest.Eventually(t, 10*time.Second, "node b's address to lapse", func() bool {
		clock.Add(100 * time.Millisecond)
		_, live := dir.Addr("node-b")
		return !live
	})
	if got := view.RedirectTargets(k1, "node-a"); len(got) != 0 {
		t.Fatalf("redirect to a silent node: %v", got)
	}
	if _, _, ok, err := view.OwnerAddr(onB); !ok || !errors.Is(err, cluster.ErrNoAddress) {
		t.Fatalf("owner address of a silent node: %v %v", ok, err)
	}
}

// A node whose events do not apply is left out, the others stay.
func TestViewIsolatesBrokenNode(t *testing.T) {
	srv := natstest.Single(t)
	_, js := natstest.Connect(t, srv.ClientURL())
	good := fsmtest.NewNode(t, repltest.OpenLog(t, "good"), fsm.PoolSpec{PoolKey: k1, Warm: 1})
	bad := fsmtest.NewNode(t, repltest.OpenLog(t, "bad"), fsm.PoolSpec{PoolKey: k1, Warm: 2})
	ev, err := event.New(event.ClaimServed{Claim: "sb_nope", VM: "vm"}, "sb_nope", repltest.NextOp(), event.ZeroOpID, 1_800_000_000_000_000_000)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bad.Log.Append(context.Background(), []event.Event{ev}); err != nil {
		t.Fatal(err)
	}
	for _, n := range []*fsmtest.Node{good, bad} {
		repltest.Replicate(t, srv.ClientURL(), n.Log)
	}
	view := cluster.NewView(nil, natstest.Logger())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = view.Follow(ctx, feed.Options{JS: js}) }()
	natstest.Eventually(t, 10*time.Second, "view to catch up", func() bool {
		return view.Position("good") == good.Log.LastSeq() && view.Position("bad") == bad.Log.LastSeq()
	})
	if got := view.Warm(k1); len(got) != 1 || got[0].Node != "good" {
		t.Fatalf("warm %+v", got)
	}
	ns := view.Nodes()
	if len(ns) != 2 || ns[0].Node != "bad" || ns[0].Broken == "" || ns[1].Broken != "" {
		t.Fatalf("nodes %+v", ns)
	}
	if got := view.RedirectTargets(k1, "x"); got != nil {
		t.Fatalf("redirect without a directory: %v", got)
	}
	if err := view.Follow(ctx, feed.Options{JS: js, Durable: "x"}); err == nil {
		t.Fatal("durable view feed accepted")
	}
}
