package follower_test

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sbxlog/sbxlog/eventlog"
	"github.com/sbxlog/sbxlog/eventlog/event"
	"github.com/sbxlog/sbxlog/eventlog/replication/feed"
	"github.com/sbxlog/sbxlog/eventlog/replication/follower"
	"github.com/sbxlog/sbxlog/eventlog/replication/natsembed/natstest"
	"github.com/sbxlog/sbxlog/eventlog/replication/repltest"
	"github.com/sbxlog/sbxlog/eventlog/replication/stream"
)

// setup runs a server and a replicator for node n1 with a multi-event op
// log, so replica batches split ops.
func setup(t *testing.T) (url string, js jetstream.JetStream, src *eventlog.Log) {
	t.Helper()
	srv := natstest.Single(t)
	_, js = natstest.Connect(t, srv.ClientURL())
	src = repltest.OpenLog(t, "n1")
	appendOps(t, src, 30)
	repltest.Replicate(t, srv.ClientURL(), src)
	return srv.ClientURL(), js, src
}

// appendOps appends n ops of 1..5 events each.
func appendOps(t *testing.T, l *eventlog.Log, n int) {
	t.Helper()
	for i := range n {
		op := repltest.NextOp()
		var evs []event.Event
		for j := range i%5 + 1 {
			ev := repltest.Filler(i*10 + j)
			ev.OpID = op
			evs = append(evs, ev)
		}
		if _, err := l.Append(context.Background(), evs); err != nil {
			t.Fatal(err)
		}
	}
}

func run(t *testing.T, f *follower.Follower) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.Run(ctx) }()
	var once bool
	var res error
	stop = func() error {
		if !once {
			once = true
			cancel()
			res = <-done
		}
		return res
	}
	t.Cleanup(func() { _ = stop() })
	return stop
}

func waitFor(t *testing.T, f *follower.Follower, seq uint64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if err := f.WaitFor(ctx, seq); err != nil {
		t.Fatalf("replica at %d waiting for %d (status %+v): %v", f.LastSeq(), seq, f.Status(), err)
	}
}

func requireSameLog(t *testing.T, src, replica *eventlog.Log) {
	t.Helper()
	a, b := repltest.LocalEvents(t, src), repltest.LocalEvents(t, replica)
	if len(a) != len(b) || repltest.Hash(a) != repltest.Hash(b) {
		t.Fatalf("replica differs: %d events hash %s, source %d events hash %s", len(b), repltest.Hash(b), len(a), repltest.Hash(a))
	}
	rep, err := replica.Verify()
	if err != nil {
		t.Fatalf("replica fails Verify: %v", err)
	}
	if rep.Events != uint64(len(a)) {
		t.Fatalf("Verify saw %d events", rep.Events)
	}
}

// The replica matches the node byte for byte through restarts of the
// follower while the node keeps appending, with small batches that split ops.
func TestFollowerReplicatesThroughRestarts(t *testing.T) {
	_, js, src := setup(t)
	dir := filepath.Join(t.TempDir(), "replica")
	replica := repltest.OpenLogAt(t, dir, "n1")
	for round := range 3 {
		f, err := follower.New(follower.Options{JS: js, Replica: replica, Batch: 7})
		if err != nil {
			t.Fatal(err)
		}
		stop := run(t, f)
		appendOps(t, src, 20)
		waitFor(t, f, src.LastSeq())
		if err := stop(); err != nil {
			t.Fatalf("round %d: Run: %v", round, err)
		}
		if st := f.Status(); st.State != "stopped" || st.Positions["n1"] != src.LastSeq() {
			t.Fatalf("status %+v", st)
		}
	}
	requireSameLog(t, src, replica)
}

// A replica that lost its data while its durable consumer kept its position
// is rebuilt from the start of the stream.
func TestFollowerRebuildsConsumerForEmptyReplica(t *testing.T) {
	_, js, src := setup(t)
	catchUp(t, js, src, "f1")
	appendOps(t, src, 5)

	fresh := repltest.OpenLog(t, "n1")
	f2, err := follower.New(follower.Options{JS: js, Replica: fresh, Durable: "f1"})
	if err != nil {
		t.Fatal(err)
	}
	run(t, f2)
	waitFor(t, f2, src.LastSeq())
	requireSameLog(t, src, fresh)
}

// catchUp runs a follower of src into a replica of its own under durable
// until it holds all of src, and stops it.
func catchUp(t *testing.T, js jetstream.JetStream, src *eventlog.Log, durable string) {
	t.Helper()
	f, err := follower.New(follower.Options{JS: js, Replica: repltest.OpenLog(t, src.NodeID()), Durable: durable})
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, f)
	waitFor(t, f, src.LastSeq())
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}

func TestFollowerRefusesGapAndCorruption(t *testing.T) {
	for _, tc := range []struct {
		name   string
		inject func(t *testing.T, js jetstream.JetStream)
		check  func(err error) bool
	}{
		{"corrupt record", func(t *testing.T, js jetstream.JetStream) {
			publishRaw(t, js, "sbx.ev.n9", "n9-1", []byte("not a record"))
		}, func(err error) bool { var ce *feed.CorruptError; return errors.As(err, &ce) }},
		{"wrong message id", func(t *testing.T, js jetstream.JetStream) {
			publishRaw(t, js, "sbx.ev.n9", "n9-7", record(1))
		}, func(err error) bool { var ce *feed.CorruptError; return errors.As(err, &ce) }},
		{"gap", func(t *testing.T, js jetstream.JetStream) {
			publishRaw(t, js, "sbx.ev.n9", "n9-1", record(1))
			publishRaw(t, js, "sbx.ev.n9", "n9-3", record(3))
		}, func(err error) bool {
			var ge *feed.GapError
			return errors.As(err, &ge) && ge.Want == 2 && ge.Got == 3 && ge.Node == "n9"
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := natstest.Single(t)
			_, js := natstest.Connect(t, srv.ClientURL())
			if _, err := stream.Ensure(context.Background(), js, stream.Config{}); err != nil {
				t.Fatal(err)
			}
			tc.inject(t, js)
			f, err := follower.New(follower.Options{JS: js, Replica: repltest.OpenLog(t, "n9")})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			defer cancel()
			err = f.Run(ctx)
			if !tc.check(err) {
				t.Fatalf("Run: %v", err)
			}
			if st := f.Status(); st.State != "failed" || st.LastError == "" {
				t.Fatalf("status %+v", st)
			}
		})
	}
}

func record(seq uint64) []byte {
	ev := repltest.Filler(int(seq))
	ev.Seq, ev.Node = seq, "n9"
	return event.Encode(&ev)
}

func publishRaw(t *testing.T, js jetstream.JetStream, subj, id string, data []byte) {
	t.Helper()
	m := nats.NewMsg(subj)
	m.Header.Set(jetstream.MsgIDHeader, id)
	m.Data = data
	if _, err := js.PublishMsg(context.Background(), m); err != nil {
		t.Fatal(err)
	}
}

func TestNewRejectsBadOptions(t *testing.T) {
	if _, err := follower.New(follower.Options{}); err == nil {
		t.Fatal("no replica accepted")
	}
	if _, err := follower.New(follower.Options{Replica: repltest.OpenLog(t, "n1")}); err == nil {
		t.Fatal("no JetStream accepted")
	}
	srv := natstest.Single(t)
	_, js := natstest.Connect(t, srv.ClientURL())
	if _, err := follower.New(follower.Options{JS: js, Replica: repltest.OpenLog(t, "n1"), Durable: "a.b"}); err == nil {
		t.Fatal("bad durable accepted")
	}
}
