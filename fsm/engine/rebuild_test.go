package engine

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/rs/zerolog"

	"github.com/sbxlog/sbxlog/eventlog"
	"github.com/sbxlog/sbxlog/fsm"
	"github.com/sbxlog/sbxlog/fsm/fsmsim"
	"github.com/sbxlog/sbxlog/fsm/fsmtest"
)

// recorded is a real Pebble log holding a generated workload, with the state
// hash the writer saw after each decision.
type recorded struct {
	l      *eventlog.Log
	dir    string
	final  *fsm.State
	hashes map[uint64][32]byte
	seqs   []uint64
}

func record(t *testing.T, seed uint64, steps int) *recorded {
	t.Helper()
	dir := t.TempDir()
	l, err := eventlog.Open(dir, eventlog.Options{NodeID: "node-sim", Logger: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	r := &recorded{l: l, dir: dir, final: fsm.New(), hashes: map[uint64][32]byte{}}
	err = fsmtest.Record(context.Background(), l, r.final, fsmsim.New(seed, fsmsim.Options{}), steps, func(seq uint64, s *fsm.State) {
		r.hashes[seq] = fsm.Hash(s)
		r.seqs = append(r.seqs, seq)
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.seqs) < 100 || l.LastSeq() != r.seqs[len(r.seqs)-1] {
		t.Fatalf("workload too small or log out of step: %d decisions, last seq %d", len(r.seqs), l.LastSeq())
	}
	return r
}

func TestRebuildMatchesWriter(t *testing.T) {
	r := record(t, 7, 1500)
	last := r.l.LastSeq()

	res, err := Rebuild(r.l, RebuildOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Seq != last || res.SnapshotSeq != 0 || res.Events != int(last) || fsm.Hash(res.State) != fsm.Hash(r.final) {
		t.Fatalf("full replay: seq %d snapshot %d events %d", res.Seq, res.SnapshotSeq, res.Events)
	}
	// --until at decision boundaries throughout the log.
	for _, i := range []int{0, len(r.seqs) / 3, len(r.seqs) / 2, len(r.seqs) - 2} {
		seq := r.seqs[i]
		res, err := Rebuild(r.l, RebuildOptions{Until: seq})
		if err != nil {
			t.Fatal(err)
		}
		if fsm.Hash(res.State) != r.hashes[seq] {
			t.Fatalf("state at %d differs from what the writer saw", seq)
		}
	}

	// Snapshot in the middle: later rebuilds start from it and replay the tail.
	mid := r.seqs[len(r.seqs)/2]
	midState, err := Rebuild(r.l, RebuildOptions{Until: mid})
	if err != nil {
		t.Fatal(err)
	}
	if err := SaveSnapshot(r.l, midState.State, mid); err != nil {
		t.Fatal(err)
	}
	res, err = Rebuild(r.l, RebuildOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if res.SnapshotSeq != mid || res.Events != int(last-mid) || fsm.Hash(res.State) != fsm.Hash(r.final) {
		t.Fatalf("snapshot + tail: snapshot %d events %d", res.SnapshotSeq, res.Events)
	}
	// Before the snapshot: a full replay, still exact.
	early := r.seqs[len(r.seqs)/4]
	res, err = Rebuild(r.l, RebuildOptions{Until: early})
	if err != nil {
		t.Fatal(err)
	}
	if res.SnapshotSeq != 0 || res.SnapshotErr == nil || fsm.Hash(res.State) != r.hashes[early] {
		t.Fatalf("until before the snapshot: snapshot %d (%v)", res.SnapshotSeq, res.SnapshotErr)
	}
	// NoSnapshot ignores it.
	res, err = Rebuild(r.l, RebuildOptions{NoSnapshot: true})
	if err != nil || res.SnapshotSeq != 0 || fsm.Hash(res.State) != fsm.Hash(r.final) {
		t.Fatalf("no-snapshot replay: %v", err)
	}
	if _, err := Rebuild(r.l, RebuildOptions{Until: last + 1}); !errors.Is(err, ErrBeyondEnd) {
		t.Fatalf("until past the end: %v", err)
	}
}

// A snapshot that does not decode is skipped for a full replay while the log
// holds every event; once the prefix is truncated it is an error.
func TestRebuildBadSnapshot(t *testing.T) {
	r := record(t, 11, 600)
	last := r.l.LastSeq()
	if err := r.l.SaveSnapshot(last, []byte{fsm.StateFormatCurrent + 1, 0}); err != nil {
		t.Fatal(err)
	}
	res, err := Rebuild(r.l, RebuildOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if res.SnapshotSeq != 0 || !errors.Is(res.SnapshotErr, fsm.ErrStateFormat) || fsm.Hash(res.State) != fsm.Hash(r.final) {
		t.Fatalf("snapshot %d err %v", res.SnapshotSeq, res.SnapshotErr)
	}
	if err := r.l.TruncatePrefix(last); err != nil {
		t.Fatal(err)
	}
	if _, err := Rebuild(r.l, RebuildOptions{}); !errors.Is(err, ErrUnreachable) {
		t.Fatalf("truncated log with an unusable snapshot: %v", err)
	}
}

// After a truncation, a good snapshot is enough to rebuild.
func TestRebuildAfterTruncate(t *testing.T) {
	r := record(t, 5, 600)
	mid := r.seqs[len(r.seqs)/2]
	s, err := Rebuild(r.l, RebuildOptions{Until: mid})
	if err != nil {
		t.Fatal(err)
	}
	if err := SaveSnapshot(r.l, s.State, mid); err != nil {
		t.Fatal(err)
	}
	if err := r.l.TruncatePrefix(mid + 1); err != nil {
		t.Fatal(err)
	}
	res, err := Rebuild(r.l, RebuildOptions{})
	if err != nil || fsm.Hash(res.State) != fsm.Hash(r.final) || res.SnapshotSeq != mid {
		t.Fatalf("rebuild after truncate: %v", err)
	}
	idx := slices.Index(r.seqs, mid)
	if _, err := Rebuild(r.l, RebuildOptions{Until: r.seqs[idx-1]}); !errors.Is(err, ErrUnreachable) {
		t.Fatalf("state before the retained prefix: %v", err)
	}
}
