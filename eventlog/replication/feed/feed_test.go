package feed_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/sbxlog/sbxlog/eventlog"
	"github.com/sbxlog/sbxlog/eventlog/event"
	"github.com/sbxlog/sbxlog/eventlog/replication/feed"
	"github.com/sbxlog/sbxlog/eventlog/replication/natsembed/natstest"
	"github.com/sbxlog/sbxlog/eventlog/replication/repltest"
	"github.com/sbxlog/sbxlog/eventlog/replication/stream"
)

// lagger is a Lagging handler, the way usage is one: its output keeps a
// record only for event 1 and events whose seq is a multiple of every, so
// its Position stays at the last of those. (Event 1 keeps the output from
// holding nothing of a node the durable acknowledged events of: that
// cannot be told from a fresh output, and is rebuilt from the start.) The
// output outlives the feeds that write it (one lagger across restarts).
// Writing a record twice is an error.
type lagger struct {
	every uint64

	mu      sync.Mutex
	records map[string][]uint64 // the output
	applied map[string]uint64   // the highest seq Apply saw, for the tests' waits
}

func newLagger(every uint64) *lagger {
	return &lagger{every: every, records: map[string][]uint64{}, applied: map[string]uint64{}}
}

var _ feed.Lagging = (*lagger)(nil)

func (l *lagger) PositionLags() bool { return true }

func (l *lagger) Position(node string) uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	if r := l.records[node]; len(r) > 0 {
		return r[len(r)-1]
	}
	return 0
}

func (l *lagger) Apply(_ context.Context, evs []event.Event) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, ev := range evs {
		l.applied[ev.Node] = max(l.applied[ev.Node], ev.Seq)
		if !l.leavesRecord(ev.Seq) {
			continue
		}
		if r := l.records[ev.Node]; len(r) > 0 && r[len(r)-1] >= ev.Seq {
			return fmt.Errorf("node %s: event %d recorded twice (output at %d)", ev.Node, ev.Seq, r[len(r)-1])
		}
		l.records[ev.Node] = append(l.records[ev.Node], ev.Seq)
	}
	return nil
}

// leavesRecord reports whether event seq leaves a record.
func (l *lagger) leavesRecord(seq uint64) bool { return seq == 1 || seq%l.every == 0 }

func (l *lagger) lastApplied(node string) uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.applied[node]
}

// requireRecords fails unless node's records are those of the events up
// to last, once each, in order.
func (l *lagger) requireRecords(t *testing.T, node string, last uint64) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	var want []uint64
	for s := uint64(1); s <= last; s++ {
		if l.leavesRecord(s) {
			want = append(want, s)
		}
	}
	if fmt.Sprint(l.records[node]) != fmt.Sprint(want) {
		t.Fatalf("node %s: records %v, want %v", node, l.records[node], want)
	}
}

// feedLog collects a feed's log lines.
type feedLog struct{ repltest.LogBuffer }

func (b *feedLog) logger() zerolog.Logger { return zerolog.New(b).Level(zerolog.DebugLevel) }

// rebuilds are the log lines of a durable consumer rebuilt from the start
// of the stream, for a gap or for an output behind it.
func (b *feedLog) rebuilds() []string { return b.Lines("from the start of the stream") }

// ackFloor is the durable consumer's acknowledged stream sequence.
func ackFloor(t *testing.T, js jetstream.JetStream, durable string) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := js.Consumer(ctx, stream.DefaultName, durable)
	if err != nil {
		return 0
	}
	info, err := c.Info(ctx)
	if err != nil {
		return 0
	}
	return info.AckFloor.Stream
}

// streamLast is the stream's last sequence.
func streamLast(t *testing.T, js jetstream.JetStream) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := js.Stream(ctx, stream.DefaultName)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return info.State.LastSeq
}

// runUntil runs a feed until cond holds and it has acknowledged the
// stream's last message, then stops it. It fails on any feed error.
func runUntil(t *testing.T, js jetstream.JetStream, opts feed.Options, logs *feedLog, h feed.Handler, cond func() bool) {
	t.Helper()
	f, err := feed.New(opts, h)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.Run(ctx) }()
	// Past the pull consumer's heartbeat check (twice its 15 s): a pull
	// request lost under load is only noticed and issued again then.
	deadline := time.Now().Add(45 * time.Second)
	for !(cond() && ackFloor(t, js, opts.Durable) == streamLast(t, js)) {
		select {
		case err := <-done:
			cancel()
			t.Fatalf("feed stopped: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			cancel()
			<-done
			t.Fatalf("feed did not catch up: status %+v, ack floor %d, stream at %d; log:\n%s", f.Status(), ackFloor(t, js, opts.Durable), streamLast(t, js), logs)
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("feed: %v", err)
	}
}

// deletable creates the stream as sbxlog would, except that it allows
// deleting messages (an operator's stream; sbxlog's own denies it), so a
// test can make a hole.
func deletable(t *testing.T, js jetstream.JetStream) {
	t.Helper()
	cfg, err := stream.Config{}.StreamConfig()
	if err != nil {
		t.Fatal(err)
	}
	cfg.DenyDelete = false
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
}

// appendN appends n events to l and waits until the stream holds them.
func appendN(t *testing.T, js jetstream.JetStream, l *eventlog.Log, n int, r interface{ Replicated() uint64 }) {
	t.Helper()
	repltest.AppendFillers(t, l, n)
	natstest.Eventually(t, 10*time.Second, "replicated", func() bool { return r.Replicated() == l.LastSeq() })
}

// Acceptance (issue 22, defect 2): a Lagging handler restarted again and
// again while the node appends. Its Position stays below what the durable
// consumer acknowledged whenever the last events made no record; the feed
// must take the acknowledged position for the node's, not the next delivery
// for a gap. The stream is complete throughout: no restart rebuilds the
// consumer, nothing warns of missing events, and every record is written
// once.
func TestLaggingHandlerRestartsUnderLoad(t *testing.T) {
	srv := natstest.Single(t)
	_, js := natstest.Connect(t, srv.ClientURL())
	l := repltest.OpenLog(t, "n1")
	repltest.Replicate(t, srv.ClientURL(), l)

	const total = 1500
	var stop atomic.Bool
	gen := make(chan struct{})
	go func() {
		defer close(gen)
		for i := 0; i < total && !stop.Load(); i += 3 {
			// One op of three events.
			evs := []event.Event{repltest.Filler(i), repltest.Filler(i + 1), repltest.Filler(i + 2)}
			evs[1].OpID, evs[2].OpID = evs[0].OpID, evs[0].OpID
			if _, err := l.Append(context.Background(), evs); err != nil {
				t.Errorf("append: %v", err)
				return
			}
			time.Sleep(2 * time.Millisecond)
		}
	}()
	t.Cleanup(func() { stop.Store(true); <-gen })

	h := newLagger(7)
	logs := &feedLog{}
	opts := feed.Options{JS: js, Durable: "lag-n1", Nodes: []string{"n1"}, Batch: 8, Logger: logs.logger()}
	restarts := 0
	for generating := true; generating; restarts++ {
		select {
		case <-gen:
			generating = false
		default:
		}
		f, err := feed.New(opts, h)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Duration(30+restarts%4*15)*time.Millisecond)
		err = f.Run(ctx)
		cancel()
		if err != nil {
			t.Fatalf("restart %d: %v", restarts, err)
		}
	}
	runUntil(t, js, opts, logs, h, func() bool { return h.lastApplied("n1") == l.LastSeq() })
	t.Logf("%d restarts over %d events", restarts, l.LastSeq())
	if restarts < 20 {
		t.Fatalf("only %d restarts", restarts)
	}
	if r := logs.rebuilds(); len(r) > 0 {
		t.Fatalf("%d of %d restarts rebuilt the consumer of a complete stream; first: %s", len(r), restarts, r[0])
	}
	if m := logs.Lines("missing from the stream"); len(m) > 0 {
		t.Fatalf("a complete stream was reported with missing events: %s", m[0])
	}
	h.requireRecords(t, "n1", l.LastSeq())
}

// The same with two nodes under one consumer: the last message the durable
// acknowledged is one node's, and the other node's acknowledged position
// must be found all the same.
func TestLaggingHandlerRestartManyNodes(t *testing.T) {
	srv := natstest.Single(t)
	_, js := natstest.Connect(t, srv.ClientURL())
	l1, l2 := repltest.OpenLog(t, "n1"), repltest.OpenLog(t, "n2")
	r1, r2 := repltest.Replicate(t, srv.ClientURL(), l1), repltest.Replicate(t, srv.ClientURL(), l2)

	h := newLagger(7)
	logs := &feedLog{}
	opts := feed.Options{JS: js, Durable: "lag-all", Batch: 4, Logger: logs.logger()}
	caughtUp := func() bool {
		return h.lastApplied("n1") == l1.LastSeq() && h.lastApplied("n2") == l2.LastSeq()
	}
	// Each round ends with both nodes' last events recordless (12, 13;
	// then 18, 19; ... 36, 37): both Positions below what was
	// acknowledged.
	appendN(t, js, l1, 12, r1)
	appendN(t, js, l2, 13, r2)
	for round := range 4 {
		runUntil(t, js, opts, logs, h, caughtUp)
		if h.Position("n1") >= l1.LastSeq() || h.Position("n2") >= l2.LastSeq() {
			t.Fatalf("round %d: positions %d, %d do not lag the logs' %d, %d", round, h.Position("n1"), h.Position("n2"), l1.LastSeq(), l2.LastSeq())
		}
		appendN(t, js, l2, 6, r2)
		appendN(t, js, l1, 6, r1)
	}
	runUntil(t, js, opts, logs, h, caughtUp)
	if r := logs.rebuilds(); len(r) > 0 {
		t.Fatalf("a restart rebuilt the consumer of a complete stream: %s", r[0])
	}
	h.requireRecords(t, "n1", l1.LastSeq())
	h.requireRecords(t, "n2", l2.LastSeq())
}

// Only a real gap is reported: messages deleted from the stream
// (JetStream DeleteMsg) or pushed out by a limit after the durable
// consumer acknowledged them cost nothing, and messages removed before it
// got them stop the feed with a *GapError naming them, after one rebuild
// from the start.
func TestGapOnlyForMissingMessages(t *testing.T) {
	for _, tc := range []struct {
		name    string
		deleted []uint64 // stream sequences (= the node's seqs: one node)
		maxMsgs int64    // a limit set after the first 20 were consumed, before 10 more
		gap     *feed.GapError
	}{
		{name: "acknowledged messages deleted", deleted: []uint64{13, 14, 15, 16, 17, 18, 19, 20}},
		{name: "unacknowledged messages deleted", deleted: []uint64{23, 24}, gap: &feed.GapError{Node: "n1", Want: 23, Got: 25}},
		{name: "the next messages deleted", deleted: []uint64{21, 22}, gap: &feed.GapError{Node: "n1", Want: 21, Got: 23}},
		{name: "the last acknowledged message deleted", deleted: []uint64{20}},
		{name: "a limit removed acknowledged messages", maxMsgs: 25},
		// The floor's message is gone as well: it proves nothing (a durable
		// created below the stream's first sequence gets a floor just
		// under it), so the output's position is all there is.
		{name: "a limit removed unacknowledged messages", maxMsgs: 5, gap: &feed.GapError{Node: "n1", Want: 15, Got: 26}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := natstest.Single(t)
			_, js := natstest.Connect(t, srv.ClientURL())
			deletable(t, js)
			l := repltest.OpenLog(t, "n1")
			r := repltest.Replicate(t, srv.ClientURL(), l)
			h := newLagger(7)
			logs := &feedLog{}
			opts := feed.Options{JS: js, Durable: "gap-n1", Nodes: []string{"n1"}, Batch: 4, Logger: logs.logger()}

			appendN(t, js, l, 20, r)
			runUntil(t, js, opts, logs, h, func() bool { return h.lastApplied("n1") == 20 })
			if h.Position("n1") != 14 {
				t.Fatalf("position %d, want 14", h.Position("n1"))
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			st, err := js.Stream(ctx, stream.DefaultName)
			if err != nil {
				t.Fatal(err)
			}
			if tc.maxMsgs > 0 {
				cfg := st.CachedInfo().Config
				cfg.MaxMsgs = tc.maxMsgs
				if _, err := js.UpdateStream(ctx, cfg); err != nil {
					t.Fatal(err)
				}
			}
			appendN(t, js, l, 10, r)
			for _, seq := range tc.deleted {
				if err := st.DeleteMsg(ctx, seq); err != nil {
					t.Fatalf("delete %d: %v", seq, err)
				}
			}

			if tc.gap == nil {
				runUntil(t, js, opts, logs, h, func() bool { return h.lastApplied("n1") == 30 })
				if m := logs.Lines("missing"); len(m) > 0 {
					t.Fatalf("reported missing events: %s", m[0])
				}
				if r := logs.rebuilds(); len(r) > 0 {
					t.Fatalf("rebuilt the consumer: %s", r[0])
				}
				h.requireRecords(t, "n1", 30)
				return
			}
			f, err := feed.New(opts, h)
			if err != nil {
				t.Fatal(err)
			}
			err = f.Run(ctx)
			var ge *feed.GapError
			if !errors.As(err, &ge) || *ge != *tc.gap {
				t.Fatalf("Run: %v, want %v", err, tc.gap)
			}
			want := fmt.Sprintf("events %d..%d are missing from the stream", tc.gap.Want, tc.gap.Got-1)
			if m := logs.Lines(want); len(m) == 0 {
				t.Fatalf("no warning %q in the log:\n%s", want, logs.String())
			}
			// Nothing past the gap was applied.
			if h.lastApplied("n1") >= tc.gap.Got {
				t.Fatalf("applied up to %d past the gap at %d", h.lastApplied("n1"), tc.gap.Got)
			}
		})
	}
}

// With RetryGaps, an ephemeral feed (the cluster view's) that finds a
// node's event missing from the stream does not stop for good: it reads
// the stream again from its start after a pause, never past the gap and
// never "running" while the gap lasts, until its context ends.
func TestEphemeralFeedRetriesGaps(t *testing.T) {
	srv := natstest.Single(t)
	_, js := natstest.Connect(t, srv.ClientURL())
	deletable(t, js)
	l := repltest.OpenLog(t, "n1")
	r := repltest.Replicate(t, srv.ClientURL(), l)
	appendN(t, js, l, 10, r)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := js.Stream(ctx, stream.DefaultName)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.DeleteMsg(ctx, 5); err != nil {
		t.Fatal(err)
	}
	h := newLagger(1)
	logs := &feedLog{}
	f, err := feed.New(feed.Options{JS: js, Nodes: []string{"n1"}, Batch: 2, RetryGaps: true, MaxBackoff: 100 * time.Millisecond, Logger: logs.logger()}, h)
	if err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- f.Run(rctx) }()
	natstest.Eventually(t, 20*time.Second, "three reads up to the gap", func() bool {
		select {
		case err := <-done:
			t.Fatalf("Run ended at the gap: %v", err)
		default:
		}
		if s := f.Status().State; s == "running" || s == "failed" {
			t.Fatalf("feed %s with events 5.. missing", s)
		}
		return len(logs.Lines("reading the stream again")) >= 3
	})
	if got := h.lastApplied("n1"); got != 4 {
		t.Errorf("applied up to %d, want 4 (the gap is at 5)", got)
	}
	h.requireRecords(t, "n1", 4)
	stop()
	if err := <-done; err != nil {
		t.Errorf("Run after its context ended: %v", err)
	}
}

// Issue 26: while the consumer cannot be created (on a cluster: the
// JetStream meta leader lost with a server, until its election), a feed
// with DirectReads applies what the stream holds by direct gets, each event
// once, and goes on through its consumer once one can be made. Here the
// stream's consumer limit, taken by another consumer, refuses the feed's
// consumer the way a missing meta leader does. Without DirectReads, or on a
// stream that does not allow direct gets, nothing arrives meanwhile.
func TestDirectReadsWhileConsumerAway(t *testing.T) {
	for _, tc := range []struct {
		name        string
		directReads bool
		allowDirect bool
	}{
		{"direct reads", true, true},
		{"consumer only", false, true},
		{"stream without direct gets", true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := natstest.Single(t)
			_, js := natstest.Connect(t, srv.ClientURL())
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			cfg := refuseConsumers(t, ctx, js, tc.allowDirect)
			l := repltest.OpenLog(t, "n1")
			r := repltest.Replicate(t, srv.ClientURL(), l)
			appendN(t, js, l, 10, r)

			h := newLagger(1) // a record per event: one applied twice fails Apply
			logs := &feedLog{}
			f := startFeed(t, ctx, feed.Options{JS: js, Nodes: []string{"n1"}, Batch: 4, DirectReads: tc.directReads,
				Heartbeat: 500 * time.Millisecond, MaxBackoff: 100 * time.Millisecond, Logger: logs.logger()}, h)
			refused := func() bool { return len(logs.Lines("maximum consumers limit")) >= 3 }
			if tc.directReads && tc.allowDirect {
				natstest.Eventually(t, 20*time.Second, "the stream's events read directly", func() bool { return h.lastApplied("n1") == 10 })
				appendN(t, js, l, 5, r)
				natstest.Eventually(t, 20*time.Second, "later events read directly", func() bool { return h.lastApplied("n1") == 15 })
				if len(logs.Lines("read the stream directly")) == 0 {
					t.Errorf("no log line says the feed read the stream directly:\n%s", logs)
				}
			} else {
				natstest.Eventually(t, 20*time.Second, "consumer refused three times", refused)
				if got := h.lastApplied("n1"); got != 0 {
					t.Fatalf("applied up to %d with no consumer and no direct reads", got)
				}
			}
			if s := f.Status().State; s == "running" {
				t.Fatalf("feed running while its consumer is refused")
			}
			admitConsumers(t, ctx, js, cfg)
			appendN(t, js, l, 5, r)
			last := l.LastSeq()
			natstest.Eventually(t, 20*time.Second, "the consumer delivers the rest", func() bool {
				return f.Status().State == "running" && h.lastApplied("n1") == last
			})
			h.requireRecords(t, "n1", last)
		})
	}
}

// A feed limited to some nodes reads by direct gets past the messages of
// the nodes it does not follow, interleaved with its own, and applies its
// own once each, without taking a skipped message for the end of what it
// applied (the consumer then starts after it, and nothing is lost). The
// consumer is refused as in TestDirectReadsWhileConsumerAway.
func TestDirectReadsSkipOtherNodes(t *testing.T) {
	srv := natstest.Single(t)
	_, js := natstest.Connect(t, srv.ClientURL())
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cfg := refuseConsumers(t, ctx, js, true)
	l1, l2 := repltest.OpenLog(t, "n1"), repltest.OpenLog(t, "n2")
	r1, r2 := repltest.Replicate(t, srv.ClientURL(), l1), repltest.Replicate(t, srv.ClientURL(), l2)
	interleave := func(rounds int) {
		for range rounds {
			appendN(t, js, l1, 1, r1)
			appendN(t, js, l2, 2, r2)
		}
	}
	interleave(6)

	h := newLagger(1)
	logs := &feedLog{}
	f := startFeed(t, ctx, feed.Options{JS: js, Nodes: []string{"n1"}, Batch: 4, DirectReads: true,
		Heartbeat: 500 * time.Millisecond, MaxBackoff: 100 * time.Millisecond, Logger: logs.logger()}, h)
	natstest.Eventually(t, 20*time.Second, "n1's events read directly", func() bool { return h.lastApplied("n1") == l1.LastSeq() })
	interleave(3)
	natstest.Eventually(t, 20*time.Second, "n1's later events read directly", func() bool { return h.lastApplied("n1") == l1.LastSeq() })
	admitConsumers(t, ctx, js, cfg)
	interleave(3)
	natstest.Eventually(t, 20*time.Second, "the consumer delivers the rest", func() bool {
		return f.Status().State == "running" && h.lastApplied("n1") == l1.LastSeq()
	})
	h.requireRecords(t, "n1", l1.LastSeq())
	if got := h.lastApplied("n2"); got != 0 {
		t.Errorf("applied n2's events up to %d; the feed follows n1 only", got)
	}
}

// refuseConsumers creates the stream as sbxlog would (with or without
// direct gets) but for one consumer at most, and takes that one: a feed's
// consumer is refused, the way it is while the JetStream meta group has no
// leader, until admitConsumers.
func refuseConsumers(t *testing.T, ctx context.Context, js jetstream.JetStream, allowDirect bool) jetstream.StreamConfig {
	t.Helper()
	cfg, err := stream.Config{}.StreamConfig()
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConsumers, cfg.AllowDirect = 1, allowDirect
	if _, err := js.CreateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateConsumer(ctx, cfg.Name, jetstream.ConsumerConfig{Durable: "blocker"}); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// startFeed runs a feed until the test ends, and fails the test if Run
// returns an error.
func startFeed(t *testing.T, ctx context.Context, opts feed.Options, h feed.Handler) *feed.Feed {
	t.Helper()
	f, err := feed.New(opts, h)
	if err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- f.Run(rctx) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return f
}

// A mirror of the stream answers the stream's direct gets too (the server
// has a mirror inherit direct gets from the stream it mirrors), and one
// that keeps some subjects only holds no prefix of the stream: its answers
// would pass over the events of the other nodes, and the consumer would
// start after them. Direct reads take only the stream's own answers, so
// every event still arrives once. Here the stream no longer answers direct
// gets itself, which leaves the mirror the only one that does.
func TestDirectReadsRefuseAMirror(t *testing.T) {
	srv := natstest.Single(t)
	_, js := natstest.Connect(t, srv.ClientURL())
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cfg := refuseConsumers(t, ctx, js, true)
	mirror, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "SBX_MIRROR", Storage: jetstream.FileStorage,
		Mirror: &jetstream.StreamSource{Name: cfg.Name, FilterSubject: stream.Subject("n1")}})
	if err != nil {
		t.Fatal(err)
	}
	if !mirror.CachedInfo().Config.MirrorDirect {
		t.Fatal("the mirror does not answer the stream's direct gets")
	}
	cfg.AllowDirect = false
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	l1, l2 := repltest.OpenLog(t, "n1"), repltest.OpenLog(t, "n2")
	r1, r2 := repltest.Replicate(t, srv.ClientURL(), l1), repltest.Replicate(t, srv.ClientURL(), l2)
	for range 5 {
		appendN(t, js, l2, 1, r2)
		appendN(t, js, l1, 1, r1)
	}
	natstest.Eventually(t, 10*time.Second, "the mirror holds n1's events", func() bool {
		info, err := mirror.Info(ctx)
		return err == nil && info.State.Msgs == l1.LastSeq()
	})

	h := newLagger(1)
	logs := &feedLog{}
	f := startFeed(t, ctx, feed.Options{JS: js, Batch: 4, DirectReads: true, RetryGaps: true,
		Heartbeat: 500 * time.Millisecond, MaxBackoff: 100 * time.Millisecond, Logger: logs.logger()}, h)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("status %+v; applied n1 %d, n2 %d; log:\n%s", f.Status(), h.lastApplied("n1"), h.lastApplied("n2"), logs)
		}
	})
	natstest.Eventually(t, 20*time.Second, "consumer refused three times", func() bool {
		return len(logs.Lines("maximum consumers limit")) >= 3
	})
	admitConsumers(t, ctx, js, cfg)
	natstest.Eventually(t, 20*time.Second, "every event of both nodes", func() bool {
		return f.Status().State == "running" && h.lastApplied("n1") == l1.LastSeq() && h.lastApplied("n2") == l2.LastSeq()
	})
	h.requireRecords(t, "n1", l1.LastSeq())
	h.requireRecords(t, "n2", l2.LastSeq())
}

// admitConsumers lifts refuseConsumers' limit. (Deleting the blocker would
// admit one consumer only: a feed whose first session ends, e.g. on a
// heartbeat missed on a loaded host, leaves its consumer until the
// server's inactive threshold, and would be refused again.)
func admitConsumers(t *testing.T, ctx context.Context, js jetstream.JetStream, cfg jetstream.StreamConfig) {
	t.Helper()
	cfg.MaxConsumers = -1
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
}

// slowOutput is a handler whose every Apply takes a while (an output on a
// slow disk), so that reading a long stream one message per direct get
// takes longer than an attempt to create the consumer.
type slowOutput struct {
	*lagger
	per time.Duration
}

func (s slowOutput) Apply(ctx context.Context, evs []event.Event) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(s.per):
	}
	return s.lagger.Apply(ctx, evs)
}

// Direct reads of a long stream give way to the consumer: once a consumer
// can be made, the feed does not go on reading what the stream holds one
// message per get until its end, it tries its consumer again within about
// one attempt's time (four heartbeats) and goes on from there.
func TestDirectReadsGiveWayToTheConsumer(t *testing.T) {
	srv := natstest.Single(t)
	_, js := natstest.Connect(t, srv.ClientURL())
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cfg := refuseConsumers(t, ctx, js, true)
	l := repltest.OpenLog(t, "n1")
	r := repltest.Replicate(t, srv.ClientURL(), l)
	const total = 60
	appendN(t, js, l, total, r)

	h := slowOutput{newLagger(1), 100 * time.Millisecond} // the stream read directly: 6 s
	f := startFeed(t, ctx, feed.Options{JS: js, Nodes: []string{"n1"}, Batch: 1, DirectReads: true,
		Heartbeat: 500 * time.Millisecond, MaxBackoff: 100 * time.Millisecond}, h)
	natstest.Eventually(t, 10*time.Second, "the first event read directly", func() bool { return h.lastApplied("n1") > 0 })
	admitConsumers(t, ctx, js, cfg)
	natstest.Eventually(t, 20*time.Second, "the consumer", func() bool {
		s := f.Status().State
		return s == "catching_up" || s == "running"
	})
	if got := h.lastApplied("n1"); got == total {
		t.Errorf("the consumer was made again only once the direct reads had read the whole stream (%d events)", got)
	}
	natstest.Eventually(t, 20*time.Second, "the rest", func() bool {
		return f.Status().State == "running" && h.lastApplied("n1") == total
	})
	h.requireRecords(t, "n1", total)
}
