package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sbxlog/sbxlog/eventlog"
	"github.com/sbxlog/sbxlog/eventlog/event"
	"github.com/sbxlog/sbxlog/eventlog/replication/natsembed/natstest"
	"github.com/sbxlog/sbxlog/eventlog/replication/replicator"
	"github.com/sbxlog/sbxlog/eventlog/replication/repltest"
	"github.com/sbxlog/sbxlog/eventlog/replication/stream"
	"github.com/sbxlog/sbxlog/fsm"
	"github.com/sbxlog/sbxlog/fsm/engine"
	"github.com/sbxlog/sbxlog/fsm/fsmsim"
	"github.com/sbxlog/sbxlog/fsm/fsmtest"
)

// replNode is a simulated node's log replicated to a NATS server.
type replNode struct {
	log *eventlog.Log
	st  *fsm.State
	sim *fsmsim.Sim
	rep *replicator.Replicator
}

func startReplNode(t *testing.T, url, node string, opts ...nats.Option) *replNode {
	t.Helper()
	l, err := eventlog.Open(filepath.Join(t.TempDir(), "log"), eventlog.Options{NodeID: node})
	if err != nil {
		t.Fatal(err)
	}
	rep, err := replicator.New(replicator.Options{Log: l, URL: url, NATSOptions: opts})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- rep.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("replicator: %v", err)
		}
		_ = l.Close()
	})
	return &replNode{log: l, st: fsm.New(), sim: fsmsim.New(7, fsmsim.Options{}), rep: rep}
}

// record runs steps simulated commands and waits until JetStream holds them.
func (n *replNode) record(t *testing.T, steps int) {
	t.Helper()
	if err := fsmtest.Record(context.Background(), n.log, n.st, n.sim, steps, nil); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := n.rep.WaitReplicated(ctx, n.log.LastSeq()); err != nil {
		t.Fatalf("replicate to %d: %v", n.log.LastSeq(), err)
	}
}

// encoded returns every event of l, encoded, in order.
func encoded(t *testing.T, l *eventlog.Log) [][]byte {
	t.Helper()
	evs, err := l.Read(0, 0)
	if err != nil {
		t.Fatal(err)
	}
	out := make([][]byte, len(evs))
	for i := range evs {
		out[i] = event.Encode(&evs[i])
	}
	return out
}

func jsonLines(t *testing.T, path string) []map[string]any {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []map[string]any
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("%s: line %d: %v", path, len(out)+1, err)
		}
		out = append(out, m)
	}
	return out
}

// follow, audit and usage with --once, twice with new events in between:
// the replica equals the node's log and replays to its state, audit has one
// record per event, usage grows without duplicates and keeps what it wrote.
func TestReplCommands(t *testing.T) {
	srv := natstest.Single(t)
	url := srv.ClientURL()
	n := startReplNode(t, url, "n1")
	dir := t.TempDir()
	replicaDir := filepath.Join(dir, "replica")
	auditFile, usageFile := filepath.Join(dir, "audit.jsonl"), filepath.Join(dir, "usage.jsonl")

	var usageBefore []byte
	for round := range 2 {
		n.record(t, 400)
		last := n.log.LastSeq()
		for _, args := range [][]string{
			{"follow", "--nats", url, "--node", "n1", "--data", replicaDir, "--once"},
			{"audit", "--nats", url, "--out", auditFile, "--once"},
			{"usage", "--nats", url, "--out", usageFile, "--once", "--nodes", "n1"},
		} {
			code, out, errs := run(args...)
			if code != 0 || !strings.Contains(out, "1") {
				t.Fatalf("round %d: sbxctl %s: exit %d\n%s%s", round, strings.Join(args, " "), code, out, errs)
			}
		}

		replica, err := eventlog.Open(replicaDir, eventlog.Options{ReadOnly: true})
		if err != nil {
			t.Fatal(err)
		}
		got, want := encoded(t, replica), encoded(t, n.log)
		res, err := engine.Rebuild(replica, engine.RebuildOptions{})
		_ = replica.Close()
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != len(want) {
			t.Fatalf("round %d: replica has %d events, the node %d", round, len(got), len(want))
		}
		for i := range got {
			if !bytes.Equal(got[i], want[i]) {
				t.Fatalf("round %d: replica event %d differs", round, i+1)
			}
		}
		if fsm.HashHex(res.State) != fsm.HashHex(n.st) {
			t.Fatalf("round %d: replica replays to %s, the node's state is %s", round, fsm.HashHex(res.State), fsm.HashHex(n.st))
		}

		audit := jsonLines(t, auditFile)
		if uint64(len(audit)) != last {
			t.Fatalf("round %d: audit has %d records, the log %d events", round, len(audit), last)
		}
		for i, r := range audit {
			if r["seq"] != float64(i+1) || r["node"] != "n1" {
				t.Fatalf("round %d: audit record %d: %v", round, i+1, r)
			}
		}

		raw, err := os.ReadFile(usageFile)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.HasPrefix(raw, usageBefore) {
			t.Fatalf("round %d: usage.jsonl rewrote what the previous run wrote", round)
		}
		usageBefore = raw
		seen := map[string]bool{}
		var summaries int
		for _, r := range jsonLines(t, usageFile) {
			k, _ := json.Marshal([]any{r["node"], r["seq"], r["ev"], r["id"]})
			if seen[string(k)] {
				t.Fatalf("round %d: usage record %s twice", round, k)
			}
			seen[string(k)] = true
			if r["ev"] == "summary" {
				summaries++
			}
		}
		if len(seen) == 0 || summaries == 0 {
			t.Fatalf("round %d: usage has %d records, %d summaries", round, len(seen), summaries)
		}
		t.Logf("round %d: %d events, %d usage records (%d summaries)", round, last, len(seen), summaries)
	}
}

func TestReplCommandsBadInput(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		args []string
		code int
		msg  string
	}{
		{[]string{"follow", "--data", dir}, 2, "--node is required"},
		{[]string{"follow", "--node", "n1"}, 2, "--data is required"},
		{[]string{"follow", "--node", "a\nb", "--data", dir}, 2, "not a valid subject token"},
		{[]string{"follow", "--node", "n1", "--data", dir, "extra"}, 2, "unexpected argument"},
		{[]string{"usage"}, 2, "--out is required"},
		{[]string{"usage", "--out", filepath.Join(dir, "u"), "--nodes", "a,,c"}, 2, "--nodes"},
		{[]string{"audit", "--out", filepath.Join(dir, "a"), "--log-level", "loud"}, 2, "--log-level"},
		{[]string{"audit", "--out", filepath.Join(dir, "a"), "--durable", "a.b", "--nats", "nats://127.0.0.1:1"}, 1, "connect to NATS"},
		{[]string{"follow", "--node", "n1", "--data", dir, "--nats", "nats://127.0.0.1:1"}, 1, "connect to NATS"},
	} {
		code, _, errs := run(tc.args...)
		if code != tc.code || !strings.Contains(errs, tc.msg) {
			t.Errorf("sbxctl %s: exit %d %q, want %d containing %q", strings.Join(tc.args, " "), code, errs, tc.code, tc.msg)
		}
	}
}

// Issue 22, defect 3: follow into a fresh replica from a stream whose limit
// removed the node's first events, or all of them, fails with the first
// event the stream has and what to do, instead of ending with an empty or
// refused replica (before: "events 1..0" and exit 0 when all were gone).
func TestFollowRefusesTrimmedStream(t *testing.T) {
	srv := natstest.Single(t)
	url := srv.ClientURL()
	_, js := natstest.Connect(t, url)
	cfg, err := stream.Config{}.StreamConfig()
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxMsgs = 30 // keeps the last 30 messages of all nodes
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	l1, l2 := repltest.OpenLog(t, "n1"), repltest.OpenLog(t, "n2")
	r1, r2 := repltest.Replicate(t, url, l1), repltest.Replicate(t, url, l2)
	repltest.AppendFillers(t, l1, 10)
	if err := r1.WaitReplicated(ctx, 10); err != nil {
		t.Fatal(err)
	}
	repltest.AppendFillers(t, l2, 60)
	if err := r2.WaitReplicated(ctx, 60); err != nil {
		t.Fatal(err)
	}
	// The stream holds n2's events 31..60 (stream seqs 41..70), none of n1's.
	for _, tc := range []struct {
		node string
		want []string
	}{
		{"n2", []string{"node n2's first event in stream SBX_EVENTS is 31 (stream seq 41)", "events 1..30 are no longer in the stream", "max_age"}},
		{"n1", []string{"stream SBX_EVENTS holds no event of node n1", "up to stream seq 40 are gone", "copy the node's data dir"}},
	} {
		t.Run(tc.node, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "replica")
			code, out, errs := run("follow", "--nats", url, "--node", tc.node, "--data", dir, "--once")
			if code != 1 {
				t.Fatalf("exit %d, want 1\n%s%s", code, out, errs)
			}
			for _, w := range tc.want {
				if !strings.Contains(errs, w) {
					t.Errorf("stderr %q lacks %q", errs, w)
				}
			}
		})
	}
}
