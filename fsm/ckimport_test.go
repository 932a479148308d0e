package fsm

import (
	"testing"

	"github.com/sbxlog/sbxlog/eventlog/event"
)

// fetch returns the pending FetchCheckpoint of checkpoint id.
func (h *harness) fetch(id string) FetchCheckpoint {
	h.t.Helper()
	for _, in := range Intents(h.s) {
		if f, ok := in.(FetchCheckpoint); ok && f.Checkpoint == id {
			return f
		}
	}
	h.t.Fatalf("no import intent for %s in %+v", id, Intents(h.s))
	return FetchCheckpoint{}
}

func TestCheckpointImportTransitions(t *testing.T) {
	const origin = "10.0.0.2:7777"
	imported := CheckpointMeta{Key: kA, Name: "before", Tenant: "acme", Claim: claimID(9), Created: 1_789_000_000 * second}
	cases := []struct {
		name string
		run  func(t *testing.T, h *harness)
	}{
		{"an import is fetched, then held as this node's own and claimable", func(t *testing.T, h *harness) {
			h.setup(1)
			evs := h.do(ImportCheckpoint{Meta: h.meta(), ID: ckID(1), Origin: origin}, event.TypeCheckpointImportRequested)
			if p := payload[event.CheckpointImportRequested](t, evs, 0); p.Origin != origin {
				t.Fatalf("request %+v", p)
			}
			// Concurrent claims share it: asking again is a no-op.
			h.do(ImportCheckpoint{Meta: h.meta(), ID: ckID(1), Origin: origin})
			// Not claimable, listed or deletable while it is fetched.
			h.rejects(Claim{Meta: h.meta(), ID: claimID(2), Checkpoint: ckID(1)}, NotFound)
			h.rejects(DeleteCheckpoint{Meta: h.meta(), ID: ckID(1)}, InvalidTransition)
			h.rejects(DeleteCheckpoint{Meta: h.meta(), ID: ckID(1), Tenant: "acme"}, NotFound)
			if len(h.s.Checkpoints("")) != 0 || len(h.s.CheckpointSnapshots()) != 0 {
				t.Fatal("an import in flight is listed or references a dir")
			}
			in := h.fetch(ckID(1))
			if in.Origin != origin || in.Kind() != KindCheckpointImport {
				t.Fatalf("intent %+v", in)
			}
			m := imported
			m.Expires = h.now + 3600*second
			evs = h.do(in.Succeeded(h.res(in), Outcome{SnapshotDir: "checkpoint/" + ckID(1), Checkpoint: &m}), event.TypeCheckpointImported)
			if p := payload[event.CheckpointImported](t, evs, 0); p.Key != kA || p.Tenant != "acme" || p.Claim != claimID(9) || p.ExpiresNS != m.Expires {
				t.Fatalf("imported %+v", p)
			}
			l := h.s.Checkpoints("acme")
			if len(l) != 1 || l[0].Name != "before" || l[0].Claim != claimID(9) || l[0].Created != imported.Created || l[0].SnapshotDir != "checkpoint/"+ckID(1) {
				t.Fatalf("listed %+v", l)
			}
			// Held now: asking again changes nothing.
			h.do(ImportCheckpoint{Meta: h.meta(), ID: ckID(1), Origin: origin})
			evs = h.do(Claim{Meta: h.meta(), ID: claimID(2), Checkpoint: ckID(1)}, event.TypeClaimCreated, event.TypeVMCloneRequested)
			if vr := payload[event.VMCloneRequested](t, evs, 1); vr.Checkpoint != ckID(1) || vr.Key != kA {
				t.Fatalf("clone %+v", vr)
			}
			// Its origin's TTL carries over (the claim, never served,
			// fails at its serve deadline first).
			h.advance(3601 * second)
			h.do(Tick{Meta: h.meta()}, event.TypeClaimFailed, event.TypeCheckpointDeleteRequested)
		}},
		{"a failed import leaves nothing, with its reason; the next claim asks again", func(t *testing.T, h *harness) {
			h.setup(1)
			h.do(ImportCheckpoint{Meta: h.meta(), ID: ckID(1), Origin: origin}, event.TypeCheckpointImportRequested)
			in := h.fetch(ckID(1))
			evs := h.do(in.Failed(h.res(in), ImportUnreachable+": dial tcp: connection refused", false), event.TypeCheckpointImportFailed)
			if p := payload[event.CheckpointImportFailed](t, evs, 0); p.Reason != ImportUnreachable {
				t.Fatalf("failed %+v", p)
			}
			if _, ok := h.s.Checkpoint(ckID(1)); ok || len(Intents(h.s)) != 0 {
				t.Fatal("a failed import is kept")
			}
			// A stale second result is refused.
			h.rejects(in.Succeeded(h.res(in), Outcome{SnapshotDir: "checkpoint/" + ckID(1), Checkpoint: &imported}), NotFound)
			h.do(ImportCheckpoint{Meta: h.meta(), ID: ckID(1), Origin: origin}, event.TypeCheckpointImportRequested)
			again := h.fetch(ckID(1))
			if again.OpID == in.OpID {
				t.Fatal("a new import reuses the failed one's op")
			}
			h.rejects(in.Succeeded(h.res(in), Outcome{SnapshotDir: "checkpoint/" + ckID(1), Checkpoint: &imported}), InvalidTransition)
			evs = h.do(again.Failed(h.res(again), "sha256 mismatch", false), event.TypeCheckpointImportFailed)
			if p := payload[event.CheckpointImportFailed](t, evs, 0); p.Reason != ImportRefused {
				t.Fatalf("failed %+v", p)
			}
		}},
		{"bad requests and results are refused", func(t *testing.T, h *harness) {
			h.setup(1)
			h.rejects(ImportCheckpoint{Meta: h.meta(), ID: "ck_1", Origin: origin}, Invalid)
			h.rejects(ImportCheckpoint{Meta: h.meta(), ID: ckID(1)}, Invalid)
			h.rejects(ImportCheckpoint{Meta: h.meta(), ID: ckID(1), Origin: "a/b:1"}, Invalid)
			// A checkpoint this node holds in another state is not fetched again.
			c := h.claimWarm(1, kA)
			h.taken(2, c.ID)
			h.do(DeleteCheckpoint{Meta: h.meta(), ID: ckID(2), Tenant: "acme"}, event.TypeCheckpointDeleteRequested)
			h.rejects(ImportCheckpoint{Meta: h.meta(), ID: ckID(2), Origin: origin}, NotFound)
			h.do(ImportCheckpoint{Meta: h.meta(), ID: ckID(1), Origin: origin}, event.TypeCheckpointImportRequested)
			in := h.fetch(ckID(1))
			for _, bad := range []CheckpointMeta{
				{Key: PoolKey{}, Created: 1},
				{Key: kA, Name: "no spaces", Created: 1},
				{Key: kA, Claim: "x", Created: 1},
				{Key: kA, Created: 0},
				{Key: kA, Created: 1, Expires: -1},
			} {
				h.rejects(in.Succeeded(h.res(in), Outcome{SnapshotDir: "checkpoint/" + ckID(1), Checkpoint: &bad}), Invalid)
			}
			h.rejects(in.Succeeded(h.res(in), Outcome{Checkpoint: &imported}), Invalid)
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t)
			c.run(t, h)
		})
	}
}

// The reason is the first one the text carries: an origin's answer quoted
// after it must not reclassify the failure (an unreachable origin whose
// error text says "not_found: " is not the claim's 404).
func TestImportFailureReasonFirstWins(t *testing.T) {
	for _, c := range []struct{ msg, want string }{
		{"checkpoint_import fetch: unrecoverable: not_found: origin a:1 holds no checkpoint ck_x", ImportNotFound},
		{"checkpoint_import fetch: unrecoverable: unreachable: origin a:1: dial tcp: refused", ImportUnreachable},
		{"checkpoint_import fetch: unrecoverable: refused: from a:1: refused: digest mismatch", ImportRefused},
		{"checkpoint_import fetch: unrecoverable: unreachable: origin a:1 answered 500: store: not_found: x", ImportUnreachable},
		{"checkpoint_import fetch: unrecoverable: refused: from a:1: entry \"unreachable: x\"", ImportRefused},
		{"checkpoint_import fetch: disk full", ImportRefused},
	} {
		if got := ImportFailureReason(c.msg); got != c.want {
			t.Errorf("ImportFailureReason(%q) = %q, want %q", c.msg, got, c.want)
		}
	}
}
