package fsm

import (
	"fmt"
	"slices"
	"testing"

	"github.com/sbxlog/sbxlog/eventlog/event"
)

func ckID(n int) string { return fmt.Sprintf("ck_%016x", n) }

// capture returns the pending CaptureCheckpoint of checkpoint id.
func (h *harness) capture(id string) CaptureCheckpoint {
	h.t.Helper()
	for _, in := range Intents(h.s) {
		if c, ok := in.(CaptureCheckpoint); ok && c.Checkpoint == id {
			return c
		}
	}
	h.t.Fatalf("no capture intent for %s in %+v", id, Intents(h.s))
	return CaptureCheckpoint{}
}

// removal returns the pending RemoveCheckpoint of checkpoint id, if any.
func (h *harness) removal(id string) (RemoveCheckpoint, bool) {
	for _, in := range Intents(h.s) {
		if r, ok := in.(RemoveCheckpoint); ok && r.Checkpoint == id {
			return r, true
		}
	}
	return RemoveCheckpoint{}, false
}

// taken takes checkpoint n of claim and completes its capture.
func (h *harness) taken(n int, claim string, want ...event.Type) {
	h.t.Helper()
	h.do(Checkpoint{Meta: h.meta(), ID: ckID(n), Claim: claim, Tenant: "acme"}, event.TypeCheckpointRequested)
	in := h.capture(ckID(n))
	h.do(in.Succeeded(h.res(in), Outcome{SnapshotDir: "checkpoint/" + ckID(n)}), append([]event.Type{event.TypeCheckpointTaken}, want...)...)
}

func TestCheckpointTransitions(t *testing.T) {
	cases := []struct {
		name string
		run  func(t *testing.T, h *harness)
	}{
		{"a running claim is captured, paused only by the driver, and branched", func(t *testing.T, h *harness) {
			h.setup(1)
			c := h.claimWarm(1, kA)
			evs := h.do(Checkpoint{Meta: h.meta(), ID: ckID(1), Claim: c.ID, Tenant: "acme", Name: "before", TTLSeconds: 0}, event.TypeCheckpointRequested)
			if p := payload[event.CheckpointRequested](t, evs, 0); p.Source != "" || p.VM != c.VM || p.Fork || p.ExpiresNS != 0 {
				t.Fatalf("request %+v", p)
			}
			if v := h.vm(c.VM); v.Status != VMCheckpointing || h.claim(c.ID).Status != ClaimRunning {
				t.Fatalf("VM %s, claim %s", v.Status, h.claim(c.ID).Status)
			}
			in := h.capture(ckID(1))
			if in.RunDir != "i1/"+c.VM || in.Source != "" || in.Instance != "i1" {
				t.Fatalf("capture %+v", in)
			}
			// Nothing else runs on the VM while it is captured.
			h.rejects(Hibernate{Meta: h.meta(), Claim: c.ID}, InvalidTransition)
			h.rejects(Checkpoint{Meta: h.meta(), ID: ckID(2), Claim: c.ID}, InvalidTransition)
			if len(h.s.Checkpoints("")) != 0 {
				t.Fatal("a checkpoint being taken is listed")
			}
			h.do(in.Succeeded(h.res(in), Outcome{SnapshotDir: "checkpoint/" + ckID(1)}), event.TypeCheckpointTaken)
			if v := h.vm(c.VM); v.Status != VMClaimed {
				t.Fatalf("VM %s after the capture", v.Status)
			}
			if l := h.s.Checkpoints("acme"); len(l) != 1 || l[0].Name != "before" || l[0].Claim != c.ID || l[0].Key != kA {
				t.Fatalf("listed %+v", l)
			}
			if l := h.s.Checkpoints("other"); len(l) != 0 {
				t.Fatalf("another tenant sees %+v", l)
			}
			if refs := h.s.CheckpointSnapshots(); len(refs) != 1 || refs[0].Dir != "checkpoint/"+ckID(1) {
				t.Fatalf("snapshot refs %+v", refs)
			}
			// A claim from it: the checkpoint's key, cloned from its snapshot.
			evs = h.do(Claim{Meta: h.meta(), ID: claimID(2), Tenant: "beta", Checkpoint: ckID(1)}, event.TypeClaimCreated, event.TypeVMCloneRequested)
			cc := payload[event.ClaimCreated](t, evs, 0)
			vr := payload[event.VMCloneRequested](t, evs, 1)
			if cc.Key != kA || cc.Tier != "clone" || cc.FromCheckpoint != ckID(1) || vr.Checkpoint != ckID(1) {
				t.Fatalf("claim %+v clone %+v", cc, vr)
			}
			clone := h.intentFor(vr.VM, kA).(CloneVM)
			if clone.GoldenDir != "checkpoint/"+ckID(1) || clone.Cold {
				t.Fatalf("clone %+v", clone)
			}
			// Deleted while a clone reads it: doomed, not removed yet.
			h.rejects(DeleteCheckpoint{Meta: h.meta(), ID: ckID(1), Tenant: "beta"}, NotFound)
			h.do(DeleteCheckpoint{Meta: h.meta(), ID: ckID(1), Tenant: "acme"}, event.TypeCheckpointDeleteRequested)
			if _, ok := h.removal(ckID(1)); ok || len(h.s.Checkpoints("")) != 0 {
				t.Fatal("a checkpoint a clone reads is removed, or a doomed one listed")
			}
			h.rejects(Claim{Meta: h.meta(), ID: claimID(3), Checkpoint: ckID(1)}, NotFound)
			h.do(VMCloned{Meta: h.res(clone), VM: vr.VM}, event.TypeVMCloned, event.TypeCheckpointDeleteRequested, event.TypeClaimServed)
			rm, ok := h.removal(ckID(1))
			if !ok || rm.SnapshotDir != "checkpoint/"+ckID(1) {
				t.Fatalf("no removal once the last clone settled: %+v", Intents(h.s))
			}
			h.do(rm.Succeeded(h.res(rm), Outcome{}), event.TypeCheckpointDeleted)
			if _, ok := h.s.Checkpoint(ckID(1)); ok || len(h.s.CheckpointSnapshots()) != 0 {
				t.Fatal("checkpoint still in the state")
			}
			if c := h.claim(claimID(2)); c.Status != ClaimRunning || c.FromCheckpoint != ckID(1) || c.Tenant != "beta" {
				t.Fatalf("branch %+v", c)
			}
		}},
		{"a hibernated claim is exported from its image without waking", func(t *testing.T, h *harness) {
			h.setup(1)
			c := h.claimWarm(1, kA)
			v := h.hibernate(c.ID)
			evs := h.do(Checkpoint{Meta: h.meta(), ID: ckID(1), Claim: c.ID}, event.TypeCheckpointRequested)
			if p := payload[event.CheckpointRequested](t, evs, 0); p.Source != v.SnapshotDir {
				t.Fatalf("source %q, want %q", p.Source, v.SnapshotDir)
			}
			h.rejects(Wake{Meta: h.meta(), Claim: c.ID}, InvalidTransition)
			// The image the capture copies is still the VM's: the store
			// references it throughout.
			if !slices.Contains(h.s.SnapshotRefs(), SnapshotRef{Dir: v.SnapshotDir, Kind: OwnerHibernate, Owner: v.ID}) {
				t.Fatalf("refs %+v miss the image %s being copied", h.s.SnapshotRefs(), v.SnapshotDir)
			}
			in := h.capture(ckID(1))
			if in.Source != v.SnapshotDir {
				t.Fatalf("capture %+v", in)
			}
			h.do(in.Succeeded(h.res(in), Outcome{SnapshotDir: "checkpoint/x"}), event.TypeCheckpointTaken)
			if h.vm(c.VM).Status != VMHibernated || h.claim(c.ID).Status != ClaimHibernated {
				t.Fatal("not hibernated again")
			}
		}},
		{"a failed capture leaves nothing; a lost VM fails its claim", func(t *testing.T, h *harness) {
			h.setup(2)
			c := h.claimWarm(1, kA)
			h.do(Checkpoint{Meta: h.meta(), ID: ckID(1), Claim: c.ID}, event.TypeCheckpointRequested)
			in := h.capture(ckID(1))
			h.do(CheckpointFailed{Meta: h.res(in), Checkpoint: ckID(1), Error: "vm.snapshot: 500"}, event.TypeCheckpointFailed)
			if _, ok := h.s.Checkpoint(ckID(1)); ok || h.vm(c.VM).Status != VMClaimed {
				t.Fatal("failed checkpoint kept, or VM not back")
			}
			h.do(Checkpoint{Meta: h.meta(), ID: ckID(2), Claim: c.ID}, event.TypeCheckpointRequested)
			in = h.capture(ckID(2))
			h.do(in.Failed(h.res(in), "VMM exited", true), event.TypeCheckpointFailed, event.TypeClaimFailed, event.TypeVMDestroyRequested)
			if cl := h.claim(c.ID); cl.Reason != "checkpoint_failed" {
				t.Fatalf("claim %+v", cl)
			}
		}},
		{"a claim released during the capture has its VM destroyed after", func(t *testing.T, h *harness) {
			h.setup(1)
			c := h.claimWarm(1, kA)
			h.do(Checkpoint{Meta: h.meta(), ID: ckID(1), Claim: c.ID}, event.TypeCheckpointRequested)
			h.do(Release{Meta: h.meta(), Claim: c.ID}, event.TypeClaimReleased)
			in := h.capture(ckID(1))
			h.do(in.Succeeded(h.res(in), Outcome{SnapshotDir: "checkpoint/x"}), event.TypeCheckpointTaken, event.TypeVMDestroyRequested)
			if l := h.s.Checkpoints(""); len(l) != 1 {
				t.Fatalf("the checkpoint outlives its sandbox: %+v", l)
			}
		}},
		{"a checkpoint's TTL is a timer", func(t *testing.T, h *harness) {
			h.setup(1)
			c := h.claimWarm(1, kA)
			h.do(Checkpoint{Meta: h.meta(), ID: ckID(1), Claim: c.ID, TTLSeconds: 60}, event.TypeCheckpointRequested)
			in := h.capture(ckID(1))
			h.advance(10 * second)
			h.do(in.Succeeded(h.res(in), Outcome{SnapshotDir: "checkpoint/x"}), event.TypeCheckpointTaken)
			at, ok := h.s.NextTimer()
			ck, _ := h.s.Checkpoint(ckID(1))
			if !ok || at > ck.Expires || ck.Expires != ck.Created+60*second {
				t.Fatalf("next timer %d %v, expires %d", at, ok, ck.Expires)
			}
			h.advance(51 * second)
			h.do(Tick{Meta: h.meta()}, event.TypeCheckpointDeleteRequested)
			if _, ok := h.removal(ckID(1)); !ok {
				t.Fatal("expired checkpoint not removed")
			}
		}},
		{"fork: every child cloned from one capture, then the capture goes", func(t *testing.T, h *harness) {
			h.setup(1)
			c := h.claimWarm(1, kA)
			kids := []string{claimID(10), claimID(11)}
			evs := h.do(Fork{Meta: h.meta(), Parent: c.ID, Checkpoint: ckID(1), Children: kids, TTLSeconds: 120, ClaimRefPrefix: "t/"},
				event.TypeCheckpointRequested, event.TypeClaimCreated, event.TypeClaimCreated)
			if p := payload[event.CheckpointRequested](t, evs, 0); !p.Fork {
				t.Fatalf("fork request %+v", p)
			}
			if cc := payload[event.ClaimCreated](t, evs, 1); cc.Fork != ckID(1) || cc.ClaimRef != "t/"+kids[0] || cc.TTLSeconds != 120 || cc.Tier != "clone" {
				t.Fatalf("child %+v", cc)
			}
			if len(h.s.Checkpoints("")) != 0 {
				t.Fatal("a fork's capture is listed")
			}
			in := h.capture(ckID(1))
			if !in.Fork || CompareIntents(in, HibernateVM{ReqSeq: 0}) >= 0 {
				t.Fatalf("fork capture %+v does not rank with claim clones", in)
			}
			evs = h.do(in.Succeeded(h.res(in), Outcome{SnapshotDir: "checkpoint/f"}), event.TypeCheckpointTaken, event.TypeVMCloneRequested, event.TypeVMCloneRequested)
			var clones []CloneVM
			for i := 1; i < 3; i++ {
				vr := payload[event.VMCloneRequested](t, evs, i)
				clones = append(clones, h.intentFor(vr.VM, kA).(CloneVM))
			}
			h.do(VMCloned{Meta: h.res(clones[0]), VM: clones[0].VM}, event.TypeVMCloned, event.TypeClaimServed)
			h.do(VMCloned{Meta: h.res(clones[1]), VM: clones[1].VM}, event.TypeVMCloned, event.TypeCheckpointDeleteRequested, event.TypeClaimServed)
			if _, ok := h.removal(ckID(1)); !ok {
				t.Fatal("fork capture not removed once its children run")
			}
			for _, k := range kids {
				if cl := h.claim(k); cl.Status != ClaimRunning || cl.Fork != ckID(1) {
					t.Fatalf("child %+v", cl)
				}
			}
		}},
		{"fork of a hibernated parent does not wake it", func(t *testing.T, h *harness) {
			h.setup(1)
			c := h.claimWarm(1, kA)
			v := h.hibernate(c.ID)
			h.do(Fork{Meta: h.meta(), Parent: c.ID, Checkpoint: ckID(1), Children: []string{claimID(10)}},
				event.TypeCheckpointRequested, event.TypeClaimCreated)
			if in := h.capture(ckID(1)); in.Source != v.SnapshotDir {
				t.Fatalf("capture %+v", in)
			}
			if h.claim(c.ID).Status != ClaimHibernated {
				t.Fatal("parent woken")
			}
		}},
		{"fork: one child's failed clone fails every sibling", func(t *testing.T, h *harness) {
			h.setup(1)
			c := h.claimWarm(1, kA)
			kids := []string{claimID(10), claimID(11), claimID(12)}
			h.do(Fork{Meta: h.meta(), Parent: c.ID, Checkpoint: ckID(1), Children: kids},
				event.TypeCheckpointRequested, event.TypeClaimCreated, event.TypeClaimCreated, event.TypeClaimCreated)
			in := h.capture(ckID(1))
			h.do(in.Succeeded(h.res(in), Outcome{SnapshotDir: "checkpoint/f"}), event.TypeCheckpointTaken,
				event.TypeVMCloneRequested, event.TypeVMCloneRequested, event.TypeVMCloneRequested)
			v0, v1, v2 := h.claim(kids[0]).VM, h.claim(kids[1]).VM, h.claim(kids[2]).VM
			h.do(VMCloned{Meta: h.res(h.intentFor(v0, kA)), VM: v0}, event.TypeVMCloned, event.TypeClaimServed)
			h.do(VMCloneFailed{Meta: h.res(h.intentFor(v1, kA)), VM: v1, Error: "vm.restore: 500"},
				event.TypeVMCloneFailed, event.TypeClaimFailed, event.TypeClaimFailed, event.TypeVMDestroyRequested, event.TypeClaimFailed)
			for _, k := range kids {
				if h.claim(k).Status != ClaimFailed {
					t.Fatalf("child %s is %s", k, h.claim(k).Status)
				}
			}
			// The third child's clone settles; the capture goes with it.
			h.do(VMCloned{Meta: h.res(h.intentFor(v2, kA)), VM: v2}, event.TypeVMCloned, event.TypeCheckpointDeleteRequested, event.TypeVMDestroyRequested)
			if _, ok := h.removal(ckID(1)); !ok {
				t.Fatal("failed fork's capture not removed")
			}
		}},
		{"fork: a failed capture fails the children; a serve deadline fails them together", func(t *testing.T, h *harness) {
			h.setup(1)
			c := h.claimWarm(1, kA)
			h.do(Fork{Meta: h.meta(), Parent: c.ID, Checkpoint: ckID(1), Children: []string{claimID(10), claimID(11)}},
				event.TypeCheckpointRequested, event.TypeClaimCreated, event.TypeClaimCreated)
			in := h.capture(ckID(1))
			h.do(in.Failed(h.res(in), "vm.snapshot: 500", false), event.TypeCheckpointFailed, event.TypeClaimFailed, event.TypeClaimFailed)
			h.do(Fork{Meta: h.meta(), Parent: c.ID, Checkpoint: ckID(2), Children: []string{claimID(20), claimID(21)}, ServeTimeoutSeconds: 5},
				event.TypeCheckpointRequested, event.TypeClaimCreated, event.TypeClaimCreated)
			h.advance(6 * second)
			h.do(Tick{Meta: h.meta()}, event.TypeClaimFailed, event.TypeClaimFailed)
			in = h.capture(ckID(2))
			h.do(in.Succeeded(h.res(in), Outcome{SnapshotDir: "checkpoint/g"}), event.TypeCheckpointTaken, event.TypeCheckpointDeleteRequested)
		}},
		{"fork rejections", func(t *testing.T, h *harness) {
			h.setup(1)
			c := h.claimWarm(1, kA)
			h.rejects(Fork{Meta: h.meta(), Parent: c.ID, Checkpoint: ckID(1)}, Invalid)
			kids := make([]string, DefaultMaxForkCount+1)
			for i := range kids {
				kids[i] = claimID(100 + i)
			}
			h.rejects(Fork{Meta: h.meta(), Parent: c.ID, Checkpoint: ckID(1), Children: kids}, Invalid)
			h.rejects(Fork{Meta: h.meta(), Parent: c.ID, Checkpoint: ckID(1), Children: kids[:3], MaxCount: 2}, Invalid)
			h.rejects(Fork{Meta: h.meta(), Parent: c.ID, Checkpoint: ckID(1), Children: []string{claimID(5), claimID(5)}}, Invalid)
			h.rejects(Fork{Meta: h.meta(), Parent: claimID(99), Checkpoint: ckID(1), Children: kids[:1]}, NotFound)
			h.do(ConfigureLimits{Meta: h.meta(), MaxClaims: 2}, event.TypeLimitsConfigured)
			h.rejects(Fork{Meta: h.meta(), Parent: c.ID, Checkpoint: ckID(1), Children: kids[:2]}, TooMany)
			h.do(Fork{Meta: h.meta(), Parent: c.ID, Checkpoint: ckID(1), Children: kids[:1]}, event.TypeCheckpointRequested, event.TypeClaimCreated)
			h.rejects(Checkpoint{Meta: h.meta(), ID: ckID(1), Claim: c.ID}, Invalid) // id in use
			h.rejects(Checkpoint{Meta: h.meta(), ID: "ck_x", Claim: c.ID}, Invalid)
			h.rejects(Checkpoint{Meta: h.meta(), ID: ckID(3), Claim: c.ID, Name: "a b"}, Invalid)
			h.rejects(DeleteCheckpoint{Meta: h.meta(), ID: ckID(1)}, NotFound) // a fork's
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t)
			c.run(t, h)
			// The state survives its encoding.
			back, err := Decode(Encode(h.s))
			if err != nil || Hash(back) != Hash(h.s) {
				t.Fatalf("decode: %v", err)
			}
			if !slices.EqualFunc(Intents(back), Intents(h.s), func(a, b Intent) bool { return a == b }) {
				t.Fatal("decoded state has other intents")
			}
		})
	}
}
