package replicator_test

// How the replicator copes with what operators do to the stream and to
// NATS: limits that age messages out, more replicas than configured,
// outages one after another; and what an operator sees of each message.

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/sbxlog/sbxlog/eventlog/event"
	"github.com/sbxlog/sbxlog/eventlog/replication/natsembed/natstest"
	"github.com/sbxlog/sbxlog/eventlog/replication/replicator"
	"github.com/sbxlog/sbxlog/eventlog/replication/repltest"
	"github.com/sbxlog/sbxlog/eventlog/replication/stream"
)

// A stream with an operator's max_age whose messages of this node all aged
// out: the next start resumes after what was published (the cursor), and
// publishes only what is new, not the whole log from seq 1.
func TestAgedOutSubjectNotRepublished(t *testing.T) {
	srv := natstest.Single(t)
	_, js := natstest.Connect(t, srv.ClientURL())
	ctx := context.Background()
	scfg := stream.Config{Duplicates: time.Second}
	sc, err := scfg.StreamConfig()
	if err != nil {
		t.Fatal(err)
	}
	sc.MaxAge = 1500 * time.Millisecond
	if _, err := js.CreateStream(ctx, sc); err != nil {
		t.Fatal(err)
	}
	l := repltest.OpenLog(t, "n1")
	repltest.AppendFillers(t, l, 20)
	var logged repltest.LogBuffer
	rr := start(t, replicator.Options{Log: l, URL: srv.ClientURL(), Stream: scfg, Logger: zerolog.New(&logged)})
	waitReplicated(t, rr.r, l, 10*time.Second)
	if w := rr.r.Status().Warnings; len(w) != 1 || !strings.Contains(w[0], "max_age") || !strings.Contains(logged.String(), "max_age") {
		t.Fatalf("warnings %q; log:\n%s", w, logged.String())
	}
	if err := rr.halt(t); err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 15*time.Second, "the node's messages to age out", func() bool {
		st, err := js.Stream(ctx, stream.DefaultName)
		if err != nil {
			return false
		}
		info, err := st.Info(ctx, jetstream.WithSubjectFilter(stream.Subject("n1")))
		return err == nil && info.State.Msgs == 0
	})

	repltest.AppendFillers(t, l, 5)
	rr2 := start(t, replicator.Options{Log: l, URL: srv.ClientURL(), Stream: scfg})
	waitReplicated(t, rr2.r, l, 10*time.Second)
	got := repltest.ReadSubject(t, js, stream.DefaultName, "n1")
	if len(got) != 5 || got[0].Event.Seq != 21 || got[4].Event.Seq != 25 {
		seqs := []uint64{}
		for _, m := range got {
			seqs = append(seqs, m.Event.Seq)
		}
		t.Fatalf("after the restart the subject holds seqs %v, want 21..25", seqs)
	}

	// A stream deleted and created again is a new stream: the whole log
	// goes into it.
	if err := js.DeleteStream(ctx, stream.DefaultName); err != nil {
		t.Fatal(err)
	}
	if err := rr2.halt(t); err != nil {
		t.Fatal(err)
	}
	rr3 := start(t, replicator.Options{Log: l, URL: srv.ClientURL(), Stream: scfg})
	waitReplicated(t, rr3.r, l, 10*time.Second)
	repltest.RequireSubjectIs(t, js, stream.DefaultName, "n1", repltest.LocalEvents(t, l))
}

// Every outage is a warning and every recovery an info line; last_error
// says NATS is unreachable during an outage and is cleared after it.
func TestEveryOutageLoggedAndCleared(t *testing.T) {
	srv := natstest.Single(t)
	l := repltest.OpenLog(t, "n1")
	var logged repltest.LogBuffer
	rr := start(t, replicator.Options{Log: l, URL: srv.ClientURL(), Logger: zerolog.New(&logged).Level(zerolog.InfoLevel)})
	repltest.AppendFillers(t, l, 10)
	waitReplicated(t, rr.r, l, 10*time.Second)
	for round := range 3 {
		srv.Shutdown()
		repltest.AppendFillers(t, l, 3) // something to publish, so the outage shows
		natstest.Eventually(t, 10*time.Second, "the outage in the status", func() bool {
			st := rr.r.Status()
			return st.State == replicator.StateRetrying && strings.Contains(st.LastError, "NATS unreachable at "+srv.ClientURL())
		})
		if st := rr.r.Status(); strings.Contains(st.LastError, "outbound buffer") && !strings.HasPrefix(st.LastError, "NATS unreachable") {
			t.Fatalf("round %d: last_error %q", round, st.LastError)
		}
		if err := srv.Restart(); err != nil {
			t.Fatal(err)
		}
		waitReplicated(t, rr.r, l, 15*time.Second)
		natstest.Eventually(t, 10*time.Second, "recovery in the status", func() bool {
			st := rr.r.Status()
			return st.State == replicator.StateRunning && st.LastError == ""
		})
	}
	var warns, infos int
	for _, line := range strings.Split(strings.TrimSpace(logged.String()), "\n") {
		var rec struct{ Level, Message, Error string }
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		switch {
		case rec.Level == "warn" && rec.Message == "replication interrupted; retrying":
			warns++
			if !strings.Contains(rec.Error, "NATS unreachable") {
				t.Errorf("outage warning without the reason: %s", line)
			}
		case rec.Level == "info" && rec.Message == "replication resumed":
			infos++
		}
	}
	if warns != 3 || infos != 3 {
		t.Fatalf("%d outage warnings and %d recoveries logged, want 3 each:\n%s", warns, infos, logged.String())
	}
}

// A node configured for one replica against an R3 stream (the operator's
// choice, or replicas raised later) keeps replicating, with a warning, and
// publishes windows as atomic batches as the stream's replicas require.
func TestMoreStreamReplicasThanConfigured(t *testing.T) {
	cl := natstest.Cluster(t, 3)
	_, js := natstest.Connect(t, cl.URLs())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := stream.Ensure(ctx, js, stream.Config{Replicas: 3}); err != nil {
		t.Fatal(err)
	}
	l := repltest.OpenLog(t, "n1")
	repltest.AppendFillers(t, l, 300)
	rr := start(t, replicator.Options{Log: l, URL: cl.URLs(), Stream: stream.Config{Replicas: 1}, Window: 50})
	waitReplicated(t, rr.r, l, 20*time.Second)
	st := rr.r.Status()
	if st.State != replicator.StateRunning || len(st.Warnings) != 1 || !strings.Contains(st.Warnings[0], "3 replicas") {
		t.Fatalf("status %+v", st)
	}
	repltest.RequireSubjectIs(t, js, stream.DefaultName, "n1", repltest.LocalEvents(t, l))
}

// Each message says in its headers what event it carries, so the standard
// tools (nats stream view prints headers) show it without decoding the
// record; the record is the payload, byte for byte the local log's.
func TestMessagesDescribeTheirEvent(t *testing.T) {
	srv := natstest.Single(t)
	_, js := natstest.Connect(t, srv.ClientURL())
	l := repltest.OpenLog(t, "host.example.com")
	cause := repltest.NextOp()
	ev := repltest.Filler(1)
	ev.Causation = cause
	for _, e := range []event.Event{repltest.Filler(0), ev} {
		if _, err := l.Append(context.Background(), []event.Event{e}); err != nil {
			t.Fatal(err)
		}
	}
	rr := start(t, replicator.Options{Log: l, URL: srv.ClientURL()})
	waitReplicated(t, rr.r, l, 10*time.Second)
	local := repltest.LocalEvents(t, l)
	repltest.RequireSubjectIs(t, js, stream.DefaultName, "host.example.com", local)
	got := repltest.ReadSubject(t, js, stream.DefaultName, "host.example.com")
	for i, m := range got {
		e := local[i]
		want := map[string]string{
			jetstream.MsgIDHeader: "host=2Eexample=2Ecom-" + strconv.Itoa(i+1),
			"Sbx-Format":          "2",
			"Sbx-Node":            "host.example.com",
			"Sbx-Seq":             strconv.Itoa(i + 1),
			"Sbx-Type":            "claim_renewed",
			"Sbx-Version":         "1",
			"Sbx-Agg-Kind":        "claim",
			"Sbx-Agg-Id":          e.AggID,
			"Sbx-Op":              e.OpID.String(),
			"Sbx-Time":            time.Unix(0, e.Time).UTC().Format(time.RFC3339Nano),
		}
		if i == 1 {
			want["Sbx-Cause"] = cause.String()
		}
		for k, v := range want {
			if h := m.Header.Get(k); h != v {
				t.Errorf("message %d: header %s = %q, want %q", i, k, h, v)
			}
		}
		if i == 0 && m.Header.Get("Sbx-Cause") != "" {
			t.Errorf("message 0 has a cause header %q", m.Header.Get("Sbx-Cause"))
		}
	}
}

// Issue 22, defect 3: a node restarted while NATS is down reports what it
// published before (its cursor), marked unconfirmed, not 0; once NATS is
// back the figure is the stream's and confirmed. WaitReplicated trusts only
// the stream.
func TestRestartWhileNATSDownReportsCursor(t *testing.T) {
	srv := natstest.Single(t)
	l := repltest.OpenLog(t, "n1")
	rr := start(t, replicator.Options{Log: l, URL: srv.ClientURL()})
	repltest.AppendFillers(t, l, 10)
	waitReplicated(t, rr.r, l, 10*time.Second)
	if err := rr.halt(t); err != nil {
		t.Fatal(err)
	}
	srv.Shutdown()
	repltest.AppendFillers(t, l, 3)

	var logged repltest.LogBuffer
	rr = start(t, replicator.Options{Log: l, URL: srv.ClientURL(), Logger: zerolog.New(&logged)})
	natstest.Eventually(t, 10*time.Second, "the outage in the status", func() bool {
		return rr.r.Status().State == replicator.StateRetrying
	})
	st := rr.r.Status()
	if st.Replicated != 10 || st.Confirmed || st.StreamSeq != 10 || st.Pending != 3 {
		t.Fatalf("status while NATS is down: %+v, want replicated 10 (unconfirmed), stream seq 10, pending 3", st)
	}
	b, _ := json.Marshal(st)
	if !strings.Contains(string(b), `"replicated":10,"confirmed":false`) {
		t.Fatalf("status JSON %s", b)
	}
	if rr.r.Replicated() != 0 {
		t.Fatalf("Replicated() %d before the stream confirmed anything", rr.r.Replicated())
	}
	warn := logged.Lines("replication interrupted; retrying")
	if len(warn) == 0 || !strings.Contains(warn[0], `"replicated":10,"confirmed":false`) {
		t.Fatalf("outage warning %q", warn)
	}

	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	waitReplicated(t, rr.r, l, 15*time.Second)
	if st := rr.r.Status(); st.Replicated != 13 || !st.Confirmed || st.Pending != 0 {
		t.Fatalf("status after NATS is back: %+v", st)
	}
}
