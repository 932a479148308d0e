package replicator_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/sbxlog/sbxlog/eventlog"
	"github.com/sbxlog/sbxlog/eventlog/event"
	"github.com/sbxlog/sbxlog/eventlog/replication/natsembed"
	"github.com/sbxlog/sbxlog/eventlog/replication/natsembed/natstest"
	"github.com/sbxlog/sbxlog/eventlog/replication/replicator"
	"github.com/sbxlog/sbxlog/eventlog/replication/repltest"
	"github.com/sbxlog/sbxlog/eventlog/replication/stream"
)

// running is a replicator started in the background.
type running struct {
	r    *replicator.Replicator
	stop context.CancelFunc
	done chan error
}

func start(t *testing.T, opts replicator.Options) *running {
	t.Helper()
	if opts.MaxBackoff == 0 {
		opts.MaxBackoff = 200 * time.Millisecond
	}
	if opts.PublishTimeout == 0 {
		opts.PublishTimeout = 2 * time.Second
	}
	r, err := replicator.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	rr := &running{r: r, stop: cancel, done: make(chan error, 1)}
	go func() { rr.done <- r.Run(ctx) }()
	t.Cleanup(func() { rr.halt(t) })
	return rr
}

// halt stops the replicator and returns Run's result.
func (rr *running) halt(t *testing.T) error {
	t.Helper()
	rr.stop()
	select {
	case err, ok := <-rr.done:
		if ok {
			close(rr.done)
		}
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("replicator did not stop")
		return nil
	}
}

func waitReplicated(t *testing.T, r *replicator.Replicator, l *eventlog.Log, d time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	if err := r.WaitReplicated(ctx, l.LastSeq()); err != nil {
		t.Fatalf("wait for seq %d (replicated %d, status %+v): %v", l.LastSeq(), r.Replicated(), r.Status(), err)
	}
}

func TestNewRejectsBadOptions(t *testing.T) {
	l := repltest.OpenLog(t, "n1")
	for name, o := range map[string]replicator.Options{
		"no log":      {URL: "nats://127.0.0.1:1"},
		"no url":      {Log: l},
		"other node":  {Log: l, URL: "nats://x", NodeID: "n2"},
		"bad stream":  {Log: l, URL: "nats://x", Stream: stream.Config{Replicas: 9}},
		"bad node id": {Log: repltest.OpenLog(t, "a\nb"), URL: "nats://x"},
	} {
		if _, err := replicator.New(o); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// Events already in the log, events appended while running, and events
// appended while the replicator is down all reach the subject once, in
// order; a restarted replicator resumes from the stream.
func TestReplicatesAndResumesFromStream(t *testing.T) {
	srv := natstest.Single(t)
	_, js := natstest.Connect(t, srv.ClientURL())
	l := repltest.OpenLog(t, "n1")
	repltest.AppendFillers(t, l, 100)

	rr := start(t, replicator.Options{Log: l, URL: srv.ClientURL(), Window: 16})
	waitReplicated(t, rr.r, l, 10*time.Second)
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() { defer wg.Done(); repltest.AppendFillers(t, l, 50) }()
	}
	wg.Wait()
	waitReplicated(t, rr.r, l, 10*time.Second)
	if err := rr.halt(t); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if st := rr.r.Status(); st.State != replicator.StateStopped || st.Replicated != 300 || st.Pending != 0 {
		t.Fatalf("status after stop: %+v", st)
	}
	if err := rr.r.WaitReplicated(context.Background(), 301); !errors.Is(err, replicator.ErrStopped) {
		t.Fatalf("WaitReplicated after stop: %v", err)
	}

	repltest.AppendFillers(t, l, 40)
	rr2 := start(t, replicator.Options{Log: l, URL: srv.ClientURL()})
	waitReplicated(t, rr2.r, l, 10*time.Second)
	repltest.RequireSubjectIs(t, js, stream.DefaultName, "n1", repltest.LocalEvents(t, l))
}

// Acceptance 2: the embedded server is stopped under load and restarted.
// Appends go on while it is down, and the subject ends with every event
// exactly once, in order.
func TestCatchesUpAfterNATSOutage(t *testing.T) {
	srv := natstest.Single(t)
	l := repltest.OpenLog(t, "n1")
	rr := start(t, replicator.Options{Log: l, URL: srv.ClientURL(), Window: 64})

	ctx, stopLoad := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var appended atomic.Int64
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ctx.Err() == nil; i++ {
				if _, err := l.Append(context.Background(), []event.Event{repltest.Filler(w*1_000_000 + i)}); err != nil {
					t.Errorf("append: %v", err)
					return
				}
				appended.Add(1)
				time.Sleep(200 * time.Microsecond)
			}
		}()
	}
	natstest.Eventually(t, 10*time.Second, "replication under load", func() bool { return rr.r.Replicated() > 300 })

	srv.Shutdown()
	natstest.Eventually(t, 10*time.Second, "replicator to notice the outage", func() bool {
		return rr.r.Status().State == replicator.StateRetrying
	})
	before := appended.Load()
	downSince := time.Now()
	natstest.Eventually(t, 10*time.Second, "appends while NATS is down", func() bool {
		return appended.Load() > before+500 && time.Since(downSince) > time.Second
	})
	if st := rr.r.Status(); st.Pending == 0 || st.LastError == "" {
		t.Fatalf("status during outage: %+v", st)
	}
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 10*time.Second, "replication after restart", func() bool {
		return rr.r.Replicated() > uint64(before+500)
	})
	stopLoad()
	wg.Wait()
	waitReplicated(t, rr.r, l, 20*time.Second)
	_, js := natstest.Connect(t, srv.ClientURL())
	repltest.RequireSubjectIs(t, js, stream.DefaultName, "n1", repltest.LocalEvents(t, l))
}

// Acceptance 4 at the replicator level: a second process with the same node
// id and another log is refused, whether its log is shorter or longer, and
// the first node's subject stays exactly the first node's log.
func TestSecondWriterRefused(t *testing.T) {
	srv := natstest.Single(t)
	_, js := natstest.Connect(t, srv.ClientURL())
	a := repltest.OpenLog(t, "n1")
	repltest.AppendFillers(t, a, 50)
	ra := start(t, replicator.Options{Log: a, URL: srv.ClientURL()})
	waitReplicated(t, ra.r, a, 10*time.Second)

	for _, n := range []int{10, 50, 80} {
		b := repltest.OpenLog(t, "n1")
		repltest.AppendFillers(t, b, n)
		var logged repltest.LogBuffer
		rb := start(t, replicator.Options{Log: b, URL: srv.ClientURL(), Logger: zerolog.New(&logged)})
		var err error
		select {
		case err = <-rb.done:
			close(rb.done)
		case <-time.After(10 * time.Second):
			t.Fatalf("second writer with %d events not refused", n)
		}
		var swe *replicator.SecondWriterError
		if !errors.As(err, &swe) || !errors.Is(err, replicator.ErrSecondWriter) || swe.StreamSeq != a.LastSeq() {
			t.Fatalf("second writer with %d events: %v", n, err)
		}
		if line := logged.String(); !strings.Contains(line, `"level":"error"`) || !strings.Contains(line, "replication refused") {
			t.Fatalf("no error log line for the refusal: %s", line)
		}
		if st := rb.r.Status(); st.State != replicator.StateRefused || st.LastError == "" {
			t.Fatalf("status of refused writer: %+v", st)
		}
		if err := rb.r.WaitReplicated(context.Background(), 1_000); !errors.Is(err, replicator.ErrSecondWriter) {
			t.Fatalf("WaitReplicated on a refused replicator: %v", err)
		}
	}
	// The first writer is undisturbed and keeps going.
	repltest.AppendFillers(t, a, 20)
	waitReplicated(t, ra.r, a, 10*time.Second)
	repltest.RequireSubjectIs(t, js, stream.DefaultName, "n1", repltest.LocalEvents(t, a))
}

// Two fresh writers with the same node id race for an empty subject: exactly
// one wins, the other is refused before any of its events gets in.
func TestSecondWriterRace(t *testing.T) {
	srv := natstest.Single(t)
	_, js := natstest.Connect(t, srv.ClientURL())
	logs := []*eventlog.Log{repltest.OpenLog(t, "n1"), repltest.OpenLog(t, "n1")}
	for _, l := range logs {
		repltest.AppendFillers(t, l, 200)
	}
	rs := []*running{
		start(t, replicator.Options{Log: logs[0], URL: srv.ClientURL(), Window: 8}),
		start(t, replicator.Options{Log: logs[1], URL: srv.ClientURL(), Window: 8}),
	}
	var loser = -1
	select {
	case err := <-rs[0].done:
		close(rs[0].done)
		loser = 0
		if !errors.Is(err, replicator.ErrSecondWriter) {
			t.Fatalf("writer 0: %v", err)
		}
	case err := <-rs[1].done:
		close(rs[1].done)
		loser = 1
		if !errors.Is(err, replicator.ErrSecondWriter) {
			t.Fatalf("writer 1: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("neither writer was refused")
	}
	winner := 1 - loser
	waitReplicated(t, rs[winner].r, logs[winner], 10*time.Second)
	if st := rs[winner].r.Status(); st.State != replicator.StateRunning {
		t.Fatalf("winner status %+v", st)
	}
	repltest.RequireSubjectIs(t, js, stream.DefaultName, "n1", repltest.LocalEvents(t, logs[winner]))
}

func TestWaitReplicated(t *testing.T) {
	srv := natstest.Single(t)
	l := repltest.OpenLog(t, "n1")
	r, err := replicator.New(replicator.Options{Log: l, URL: srv.ClientURL()})
	if err != nil {
		t.Fatal(err)
	}
	early, cancelEarly := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancelEarly()
	if err := r.WaitReplicated(early, 1); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("before Run: %v", err)
	}
	rr := start(t, replicator.Options{Log: l, URL: srv.ClientURL()})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i := range 20 {
		res, err := l.Append(ctx, []event.Event{repltest.Filler(i)})
		if err != nil {
			t.Fatal(err)
		}
		if err := rr.r.WaitReplicated(ctx, res.Events[0].Seq); err != nil {
			t.Fatalf("sync append %d: %v", i, err)
		}
	}
	srv.Shutdown()
	res, err := l.Append(ctx, []event.Event{repltest.Filler(99)})
	if err != nil {
		t.Fatalf("local append with NATS down: %v", err)
	}
	short, cancelShort := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancelShort()
	if err := rr.r.WaitReplicated(short, res.Events[0].Seq); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WaitReplicated with NATS down: %v", err)
	}
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	if err := rr.r.WaitReplicated(ctx, res.Events[0].Seq); err != nil {
		t.Fatalf("after restart: %v", err)
	}
}

// A log truncated before its events were replicated cannot fill the stream:
// refused with a GapError rather than publishing a subject with a hole.
func TestGapRefused(t *testing.T) {
	srv := natstest.Single(t)
	l := repltest.OpenLog(t, "n1")
	repltest.AppendFillers(t, l, 10)
	if err := l.SaveSnapshot(5, []byte("state")); err != nil {
		t.Fatal(err)
	}
	if err := l.TruncatePrefix(6); err != nil {
		t.Fatal(err)
	}
	rr := start(t, replicator.Options{Log: l, URL: srv.ClientURL()})
	select {
	case err := <-rr.done:
		close(rr.done)
		var ge *replicator.GapError
		if !errors.As(err, &ge) || ge.LocalFirst != 6 || ge.Replicated != 0 {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("not refused")
	}
}

func TestIncompatibleStreamRefused(t *testing.T) {
	srv := natstest.Single(t)
	_, js := natstest.Connect(t, srv.ClientURL())
	if _, err := js.CreateStream(context.Background(), jetstream.StreamConfig{Name: stream.DefaultName, Subjects: []string{stream.AllSubjects}, Storage: jetstream.MemoryStorage}); err != nil {
		t.Fatal(err)
	}
	l := repltest.OpenLog(t, "n1")
	rr := start(t, replicator.Options{Log: l, URL: srv.ClientURL()})
	select {
	case err := <-rr.done:
		close(rr.done)
		var ie *stream.IncompatibleError
		if !errors.As(err, &ie) || ie.Setting != "storage" {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("not refused")
	}
}

// Two nodes publishing into one single-replica stream under load: each
// node's chained pipeline is refused whenever the other's message lands in
// between, and resynchronises; both subjects still end exact.
func TestSharedSingleReplicaStream(t *testing.T) {
	srv := natstest.Single(t)
	_, js := natstest.Connect(t, srv.ClientURL())
	nodes := []string{"n1", "n2"}
	logs := map[string]*eventlog.Log{}
	var wg sync.WaitGroup
	for _, n := range nodes {
		l := repltest.OpenLog(t, n)
		logs[n] = l
		rr := start(t, replicator.Options{Log: l, URL: srv.ClientURL(), Window: 32})
		wg.Add(1)
		go func() {
			defer wg.Done()
			for w := range 3 {
				repltest.AppendFillers(t, l, 300+w)
			}
			waitReplicated(t, rr.r, l, 20*time.Second)
		}()
	}
	wg.Wait()
	for _, n := range nodes {
		repltest.RequireSubjectIs(t, js, stream.DefaultName, n, repltest.LocalEvents(t, logs[n]))
	}
}

// The largest event the log accepts fits the embedded server's max_payload;
// against a server with NATS's 1 MiB default it is refused loudly instead
// of retried forever.
func TestLargestEvent(t *testing.T) {
	big := func(l *eventlog.Log) {
		ev := repltest.Filler(0)
		ev.Payload = bytes.Repeat([]byte("x"), event.MaxPayload)
		if _, err := l.Append(context.Background(), []event.Event{ev}); err != nil {
			t.Fatal(err)
		}
	}
	srv := natstest.Single(t)
	l := repltest.OpenLog(t, "n1")
	repltest.AppendFillers(t, l, 3)
	big(l)
	repltest.AppendFillers(t, l, 3)
	rr := start(t, replicator.Options{Log: l, URL: srv.ClientURL()})
	waitReplicated(t, rr.r, l, 10*time.Second)

	// A server with NATS's default 1 MiB max_payload.
	def, err := natsembed.Start(natsembed.Options{StoreDir: t.TempDir(), MaxPayload: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(def.Shutdown)
	l2 := repltest.OpenLog(t, "n2")
	big(l2)
	rr2 := start(t, replicator.Options{Log: l2, URL: def.ClientURL()})
	select {
	case err := <-rr2.done:
		close(rr2.done)
		var tl *replicator.TooLargeError
		if !errors.As(err, &tl) || tl.Seq != 1 || tl.MaxPayload != 1<<20 {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("oversized event not refused")
	}
}
