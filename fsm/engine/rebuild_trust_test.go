package engine

import (
	"testing"

	"github.com/sbxlog/sbxlog/fsm"
)

// TrustSnapshot (the daemon's path) rebuilds the same state from a snapshot
// as the checked decode does.
func TestRebuildTrustSnapshot(t *testing.T) {
	r := record(t, 11, 1500)
	mid := r.seqs[len(r.seqs)/2]
	at, err := Rebuild(r.l, RebuildOptions{Until: mid})
	if err != nil {
		t.Fatal(err)
	}
	if err := SaveSnapshot(r.l, at.State, mid); err != nil {
		t.Fatal(err)
	}
	checked, err := Rebuild(r.l, RebuildOptions{})
	if err != nil {
		t.Fatal(err)
	}
	trusted, err := Rebuild(r.l, RebuildOptions{TrustSnapshot: true})
	if err != nil {
		t.Fatal(err)
	}
	if trusted.SnapshotSeq != mid || checked.SnapshotSeq != mid {
		t.Fatalf("snapshots used: %d and %d, want %d", trusted.SnapshotSeq, checked.SnapshotSeq, mid)
	}
	if fsm.Hash(trusted.State) != fsm.Hash(checked.State) || fsm.Hash(trusted.State) != fsm.Hash(r.final) {
		t.Fatal("trusted snapshot decode rebuilt another state")
	}
	if err := trusted.State.Check(); err != nil {
		t.Fatal(err)
	}
}
