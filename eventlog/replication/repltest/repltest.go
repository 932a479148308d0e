// Package repltest holds what the replication tests share: real op logs in
// t.TempDir(), event generators, and a reader of a node's subject.
package repltest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sbxlog/sbxlog/eventlog"
	"github.com/sbxlog/sbxlog/eventlog/event"
	"github.com/sbxlog/sbxlog/eventlog/replication/replicator"
	"github.com/sbxlog/sbxlog/eventlog/replication/stream"
)

// OpenLog opens an op log for node in a fresh directory, closed at cleanup.
func OpenLog(t testing.TB, node string) *eventlog.Log {
	t.Helper()
	return OpenLogAt(t, filepath.Join(t.TempDir(), "log"), node)
}

// OpenLogAt opens an op log for node in dir, closed at cleanup.
func OpenLogAt(t testing.TB, dir, node string) *eventlog.Log {
	t.Helper()
	l, err := eventlog.Open(dir, eventlog.Options{NodeID: node})
	if err != nil {
		t.Fatalf("open log %s: %v", dir, err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

var opCounter atomic.Uint64

// NextOp returns a fresh op id; tag separates logs that must differ.
func NextOp() event.OpID {
	return event.OpIDFromUint(uint64(time.Now().UnixMilli()), opCounter.Add(1))
}

// Filler builds a claim_renewed event: any valid event will do where the
// content does not matter, and a unique op id makes every log distinct.
func Filler(i int) event.Event {
	return event.Event{
		Time:    int64(1_700_000_000_000_000_000 + i),
		Type:    event.TypeClaimRenewed,
		Version: 1,
		AggKind: event.AggClaim,
		AggID:   fmt.Sprintf("claim-%d", i%17),
		OpID:    NextOp(),
		Payload: []byte(fmt.Sprintf(`{"n":%d}`, i)),
	}
}

// AppendFillers appends n single-event ops.
func AppendFillers(t testing.TB, l *eventlog.Log, n int) {
	t.Helper()
	for i := range n {
		if _, err := l.Append(context.Background(), []event.Event{Filler(i)}); err != nil {
			t.Fatalf("append: %v", err)
		}
	}
}

// LocalEvents reads the whole log.
func LocalEvents(t testing.TB, l *eventlog.Log) []event.Event {
	t.Helper()
	evs, err := l.Read(0, 0)
	if err != nil {
		t.Fatalf("read log: %v", err)
	}
	return evs
}

// Hash is a digest of events' records in order.
func Hash(evs []event.Event) string {
	h := sha256.New()
	for i := range evs {
		h.Write(event.Encode(&evs[i]))
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// SubjectMsg is one message of a node's subject.
type SubjectMsg struct {
	MsgID  string
	Header nats.Header
	Data   []byte
	Event  event.Event
}

// ReadSubject returns every message on node's subject in stream order. It
// retries from scratch on errors for up to 30 s: right after a cluster
// member rejoins, consumer requests can briefly find no responder.
func ReadSubject(t testing.TB, js jetstream.JetStream, streamName, node string) []SubjectMsg {
	t.Helper()
	return ReadSubjectIn(t, js, stream.Config{Name: streamName}, node)
}

// ReadSubjectIn is ReadSubject in the stream and under the subject prefix
// of c.
func ReadSubjectIn(t testing.TB, js jetstream.JetStream, c stream.Config, node string) []SubjectMsg {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		out, err := readSubject(ctx, js, c, node)
		if err == nil {
			return out
		}
		if ctx.Err() != nil {
			t.Fatalf("read subject of %s: %v", node, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func readSubject(ctx context.Context, js jetstream.JetStream, c stream.Config, node string) ([]SubjectMsg, error) {
	st, err := js.Stream(ctx, c.StreamName())
	if err != nil {
		return nil, err
	}
	subj := c.Subject(node)
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(subj))
	if err != nil {
		return nil, err
	}
	want := info.State.Subjects[subj]
	if want == 0 {
		return nil, nil
	}
	cons, err := st.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{subj}})
	if err != nil {
		return nil, err
	}
	var out []SubjectMsg
	for uint64(len(out)) < want {
		batch, err := cons.Fetch(int(min(want-uint64(len(out)), 500)), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			return nil, err
		}
		for m := range batch.Messages() {
			ev, err := event.Decode(m.Data())
			if err != nil {
				return nil, fmt.Errorf("decode message %d: %w", len(out), err)
			}
			out = append(out, SubjectMsg{MsgID: m.Headers().Get(jetstream.MsgIDHeader), Header: m.Headers(), Data: m.Data(), Event: ev})
		}
		if err := batch.Error(); err != nil {
			return nil, err
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("read %d of %d messages: %w", len(out), want, ctx.Err())
		}
	}
	return out, nil
}

// RequireSubjectIs fails unless node's subject holds exactly the events of
// want, in order, once each, with the replicator's message ids.
func RequireSubjectIs(t testing.TB, js jetstream.JetStream, streamName, node string, want []event.Event) {
	t.Helper()
	got := ReadSubject(t, js, streamName, node)
	if len(got) != len(want) {
		seen := map[uint64]int{}
		for _, m := range got {
			seen[m.Event.Seq]++
		}
		var missing, dup []uint64
		for i := range want {
			switch s := want[i].Seq; {
			case seen[s] == 0 && len(missing) < 20:
				missing = append(missing, s)
			case seen[s] > 1 && len(dup) < 20:
				dup = append(dup, s)
			}
		}
		t.Fatalf("subject of %s holds %d messages, want %d (missing %v, duplicated %v)", node, len(got), len(want), missing, dup)
	}
	for i := range want {
		if got[i].Event.Seq != want[i].Seq {
			t.Fatalf("message %d carries seq %d, want %d", i, got[i].Event.Seq, want[i].Seq)
		}
		if string(got[i].Data) != string(event.Encode(&want[i])) {
			t.Fatalf("message %d (seq %d) differs from the local event", i, want[i].Seq)
		}
		if got[i].MsgID != stream.MsgID(node, want[i].Seq) {
			t.Fatalf("message %d has Nats-Msg-Id %q", i, got[i].MsgID)
		}
	}
}

// Replicate runs a replicator of l to url in the background until cleanup.
func Replicate(t testing.TB, url string, l *eventlog.Log) *replicator.Replicator {
	t.Helper()
	r, err := replicator.New(replicator.Options{Log: l, URL: url})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("replicator of %s: %v", l.NodeID(), err)
		}
	})
	return r
}

// LogBuffer is a log sink safe for the goroutines of the parts under test
// (zerolog.New(&buf)).
type LogBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *LogBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *LogBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Lines returns the lines logged so far that contain sub.
func (s *LogBuffer) Lines(sub string) []string {
	var out []string
	for _, l := range strings.Split(s.String(), "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return out
}
