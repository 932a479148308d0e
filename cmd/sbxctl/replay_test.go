package main

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"github.com/sbxlog/sbxlog/eventlog"
	"github.com/sbxlog/sbxlog/fsm"
	"github.com/sbxlog/sbxlog/fsm/engine"
	"github.com/sbxlog/sbxlog/fsm/fsmsim"
	"github.com/sbxlog/sbxlog/fsm/fsmtest"
)

// Acceptance 4: a log written by the randomized workload (fsmsim driven
// through Decide, a real Pebble log and Apply, as the daemon does) replays
// with sbxctl to the writer's live hash, and --until at a random sequence
// gives the state the writer saw there.
func TestReplayMatchesWriter(t *testing.T) {
	const seed = 20260901
	dir := t.TempDir()
	l, err := eventlog.Open(dir, eventlog.Options{NodeID: "node-sim", Logger: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	live := fsm.New()
	seen := map[uint64]string{}
	var seqs []uint64
	if err := fsmtest.Record(context.Background(), l, live, fsmsim.New(seed, fsmsim.Options{}), 3000, func(seq uint64, s *fsm.State) {
		seen[seq] = fsm.HashHex(s)
		seqs = append(seqs, seq)
	}); err != nil {
		t.Fatal(err)
	}
	last := l.LastSeq()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}

	out := replayJSON(t, "--data", dir)
	if out.Hash != fsm.HashHex(live) || out.Seq != last || out.Events != int(last) || out.SnapshotSeq != 0 || out.EventsPerSec <= 0 {
		t.Fatalf("full replay: %+v, want hash %s at %d", out, fsm.HashHex(live), last)
	}
	if out.Claims["pending"]+out.Claims["running"]+out.Claims["hibernating"]+out.Claims["hibernated"]+out.Claims["waking"] != out.LiveClaims {
		t.Fatalf("claim counts %v do not add up to %d live", out.Claims, out.LiveClaims)
	}
	// --until at sequences picked by the seed (decision boundaries, where
	// the writer observed the state).
	x := uint64(seed)
	for range 5 {
		x = x*6364136223846793005 + 1442695040888963407
		seq := seqs[(x>>33)%uint64(len(seqs))]
		out := replayJSON(t, "--data", dir, "--until", u(seq))
		if out.Hash != seen[seq] || out.Seq != seq {
			t.Fatalf("--until %d: hash %s, the writer saw %s", seq, out.Hash, seen[seq])
		}
	}

	// With a snapshot in the middle the answer is the same, from fewer events.
	mid := seqs[len(seqs)/2]
	l, err = eventlog.Open(dir, eventlog.Options{NodeID: "node-sim", Logger: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	res, err := engine.Rebuild(l, engine.RebuildOptions{Until: mid})
	if err == nil {
		err = engine.SaveSnapshot(l, res.State, mid)
	}
	if cerr := l.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
	out = replayJSON(t, "--data", dir, "--show", "intents")
	if out.Hash != fsm.HashHex(live) || out.SnapshotSeq != mid || out.Events != int(last-mid) {
		t.Fatalf("snapshot + tail: snapshot %d, %d events, hash %s", out.SnapshotSeq, out.Events, out.Hash)
	}
	if len(out.Intents) != len(fsm.Intents(live)) {
		t.Fatalf("%d intents listed, state has %d", len(out.Intents), len(fsm.Intents(live)))
	}
	if out := replayJSON(t, "--data", dir, "--no-snapshot"); out.Hash != fsm.HashHex(live) || out.SnapshotSeq != 0 {
		t.Fatal("--no-snapshot differs")
	}
	if out := replayJSON(t, "--data", dir, "--until", u(seqs[2]), "--check"); out.Hash != seen[seqs[2]] || out.SnapshotSkipped == "" || out.Check != "ok" {
		t.Fatalf("--until before the snapshot: %+v", out)
	}

	// The table views.
	code, text, errs := run("replay", "--data", dir)
	if code != 0 || !strings.Contains(text, "hash "+fsm.HashHex(live)) || !strings.Contains(text, "POOL") || !strings.Contains(text, "snapshot at") {
		t.Fatalf("text view: %d %q %q", code, text, errs)
	}
	for _, show := range []string{"claims", "vms", "intents"} {
		if code, text, errs := run("replay", "--data", dir, "--show", show); code != 0 || !strings.Contains(text, "ID") && !strings.Contains(text, "KIND") {
			t.Fatalf("--show %s: %d %q %q", show, code, text, errs)
		}
	}
	for _, c := range []struct {
		args []string
		code int
		msg  string
	}{
		{[]string{"replay", "--data", dir, "--show", "tenants"}, 2, "--show"},
		{[]string{"replay", "--data", dir, "--until", u(last + 1)}, 1, "beyond the end"},
		{[]string{"replay", "--data", "/nonexistent/sbxlog"}, 1, "sbxctl"},
	} {
		if code, _, errs := run(c.args...); code != c.code || !strings.Contains(errs, c.msg) {
			t.Errorf("%v: code %d stderr %q", c.args, code, errs)
		}
	}
}

func u(n uint64) string { return strconv.FormatUint(n, 10) }

func replayJSON(t *testing.T, args ...string) replayOut {
	t.Helper()
	code, out, errs := run(append([]string{"replay", "--json"}, args...)...)
	if code != 0 {
		t.Fatalf("replay %v: exit %d: %s", args, code, errs)
	}
	var r replayOut
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("replay %v: %v\n%s", args, err, out)
	}
	return r
}
