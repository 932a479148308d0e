package follower_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sbxlog/sbxlog/eventlog/event"
	"github.com/sbxlog/sbxlog/eventlog/replication/feed"
	"github.com/sbxlog/sbxlog/eventlog/replication/follower"
	"github.com/sbxlog/sbxlog/eventlog/replication/natsembed/natstest"
	"github.com/sbxlog/sbxlog/eventlog/replication/repltest"
	"github.com/sbxlog/sbxlog/eventlog/replication/stream"
)

// A fresh replica under a durable consumer that already delivered the
// whole subject gets the whole subject, with no new event to reveal the
// gap (sbxctl follow --once into a fresh directory printed "events 1..0").
func TestFollowerFreshReplicaUnderCaughtUpDurable(t *testing.T) {
	_, js, src := setup(t)
	catchUp(t, js, src, "f1")

	fresh := repltest.OpenLog(t, "n1")
	f2, err := follower.New(follower.Options{JS: js, Replica: fresh, Durable: "f1"})
	if err != nil {
		t.Fatal(err)
	}
	run(t, f2)
	select {
	case <-f2.Attached():
	case <-time.After(10 * time.Second):
		t.Fatal("the feed never attached")
	}
	waitFor(t, f2, src.LastSeq())
	requireSameLog(t, src, fresh)
}

// Messages of the first format (the record and its message id only) are
// read as they are, before and after messages with headers; headers that
// disagree with the record, or a format from a newer build, are refused.
func TestFollowerReadsEveryMessageFormat(t *testing.T) {
	evs := map[uint64]*event.Event{}
	for seq := uint64(1); seq <= 3; seq++ {
		e := repltest.Filler(int(seq))
		e.Seq, e.Node = seq, "n9"
		evs[seq] = &e
	}
	ev := func(seq uint64) *event.Event { return evs[seq] }
	current := func(t *testing.T, js jetstream.JetStream, e *event.Event, edit func(h map[string][]string)) {
		t.Helper()
		m := stream.Config{}.Message(e)
		if edit != nil {
			edit(m.Header)
		}
		if _, err := js.PublishMsg(context.Background(), m); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name   string
		inject func(t *testing.T, js jetstream.JetStream)
		err    func(err error) bool // nil: all three events replicated
	}{
		{"old then new", func(t *testing.T, js jetstream.JetStream) {
			publishRaw(t, js, "sbx.ev.n9", "n9-1", event.Encode(ev(1)))
			publishRaw(t, js, "sbx.ev.n9", "n9-2", event.Encode(ev(2)))
			current(t, js, ev(3), nil)
		}, nil},
		{"header disagrees", func(t *testing.T, js jetstream.JetStream) {
			current(t, js, ev(1), func(h map[string][]string) { h[stream.HdrType] = []string{"claim_released"} })
		}, func(err error) bool { var ce *feed.CorruptError; return errors.As(err, &ce) }},
		{"newer format", func(t *testing.T, js jetstream.JetStream) {
			current(t, js, ev(1), func(h map[string][]string) { h[stream.HdrFormat] = []string{"9"} })
		}, func(err error) bool { return errors.Is(err, stream.ErrFormat) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := natstest.Single(t)
			_, js := natstest.Connect(t, srv.ClientURL())
			if _, err := stream.Ensure(context.Background(), js, stream.Config{}); err != nil {
				t.Fatal(err)
			}
			tc.inject(t, js)
			replica := repltest.OpenLog(t, "n9")
			f, err := follower.New(follower.Options{JS: js, Replica: replica})
			if err != nil {
				t.Fatal(err)
			}
			if tc.err == nil {
				run(t, f)
				waitFor(t, f, 3)
				got := repltest.LocalEvents(t, replica)
				for i := range got {
					if string(event.Encode(&got[i])) != string(event.Encode(ev(uint64(i+1)))) {
						t.Fatalf("replica event %d differs", i+1)
					}
				}
				return
			}
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			defer cancel()
			if err := f.Run(ctx); !tc.err(err) {
				t.Fatalf("Run: %v", err)
			}
		})
	}
}
