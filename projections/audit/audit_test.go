package audit_test

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sbxlog/sbxlog/eventlog/event"
	"github.com/sbxlog/sbxlog/eventlog/replication/feed"
	"github.com/sbxlog/sbxlog/eventlog/replication/natsembed/natstest"
	"github.com/sbxlog/sbxlog/eventlog/replication/repltest"
	"github.com/sbxlog/sbxlog/fsm"
	"github.com/sbxlog/sbxlog/fsm/engine"
	"github.com/sbxlog/sbxlog/fsm/fsmsim"
	"github.com/sbxlog/sbxlog/fsm/fsmtest"
	"github.com/sbxlog/sbxlog/projections/audit"
)

// A simulated node's log (API commands, timers and executor results)
// flows through the stream into audit.jsonl across two consumer runs: one
// record per event, in order, once each, with the source and cause right.
func TestAuditOneRecordPerEvent(t *testing.T) {
	srv := natstest.Single(t)
	_, js := natstest.Connect(t, srv.ClientURL())
	l := repltest.OpenLog(t, "n1")
	if err := fsmtest.Record(context.Background(), l, fsm.New(), fsmsim.New(7, fsmsim.Options{}), 400, nil); err != nil {
		t.Fatal(err)
	}
	repltest.Replicate(t, srv.ClientURL(), l)

	path := filepath.Join(t.TempDir(), "audit.jsonl")
	fo := feed.Options{JS: js, Durable: "audit-n1", Nodes: []string{"n1"}, Batch: 32}
	// First run: stop part-way.
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Millisecond)
	if err := audit.Run(ctx, path, fo); err != nil {
		t.Fatal(err)
	}
	cancel()
	// More events, then a second run to the end.
	if err := fsmtest.Record(context.Background(), l, mustRebuild(t, l), fsmsim.New(8, fsmsim.Options{}), 200, nil); err != nil {
		t.Fatal(err)
	}
	ctx, cancel = context.WithCancel(context.Background())
	defer cancel()
	c, err := audit.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	f, err := feed.New(fo, c)
	if err != nil {
		t.Fatal(err)
	}
	runDone := make(chan error, 1)
	go func() { runDone <- f.Run(ctx) }()
	natstest.Eventually(t, 20*time.Second, "audit to catch up", func() bool { return c.Position("n1") == l.LastSeq() })
	cancel()
	if err := <-runDone; err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}

	evs := repltest.LocalEvents(t, l)
	recs := read(t, path)
	if len(recs) != len(evs) {
		t.Fatalf("%d records for %d events", len(recs), len(evs))
	}
	sources := map[string]int{}
	for i, r := range recs {
		ev := evs[i]
		if r.Seq != ev.Seq || r.Node != "n1" || r.Ev != ev.Type.String() || r.Op != ev.OpID.String() || r.ID != ev.AggID {
			t.Fatalf("record %d %+v for event seq %d %s", i, r, ev.Seq, ev.Type)
		}
		wantSource := audit.SourceCommand
		if ev.Causation != event.ZeroOpID {
			wantSource = audit.SourceEffect
			if r.Cause != ev.Causation.String() {
				t.Fatalf("record %d cause %q", i, r.Cause)
			}
		}
		if r.Source != wantSource || len(r.Data) == 0 || r.DecodeError != "" {
			t.Fatalf("record %d: %+v", i, r)
		}
		sources[r.Source]++
	}
	if sources[audit.SourceCommand] == 0 || sources[audit.SourceEffect] == 0 {
		t.Fatalf("sources %v: the workload should have both", sources)
	}
}

func mustRebuild(t *testing.T, l engine.RebuildLog) *fsm.State {
	t.Helper()
	res, err := engine.Rebuild(l, engine.RebuildOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return res.State
}

func read(t *testing.T, path string) []audit.Record {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []audit.Record
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var r audit.Record
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatal(err)
		}
		out = append(out, r)
	}
	return out
}

// An event this build cannot decode is still audited, with the reason.
func TestBuildUndecodable(t *testing.T) {
	ev := event.Event{Seq: 3, Node: "n1", Time: 1, Type: event.TypeClaimReleased, Version: 9, AggKind: event.AggClaim, AggID: "c", Payload: []byte("{}")}
	r := audit.Build(&ev)
	if r.DecodeError == "" || r.Data != nil || r.Ev != "claim_released" || !strings.Contains(r.DecodeError, "v9") {
		t.Fatalf("%+v", r)
	}
}
