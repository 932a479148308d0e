package fsm

import (
	"slices"
	"testing"

	"github.com/sbxlog/sbxlog/eventlog/event"
)

// collects returns the pending collections.
func collects(s *State) []CollectSnapshot {
	var out []CollectSnapshot
	for _, in := range Intents(s) {
		if c, ok := in.(CollectSnapshot); ok {
			out = append(out, c)
		}
	}
	return out
}

// refDirs lists SnapshotRefs' dirs.
func refDirs(s *State) []string {
	var out []string
	for _, r := range s.SnapshotRefs() {
		out = append(out, r.Dir)
	}
	return out
}

// doBatch is do that also returns NewIntents of the batch.
func (h *harness) doBatch(cmd Command, want ...event.Type) []Intent {
	h.t.Helper()
	evs := h.do(cmd, want...)
	return NewIntents(h.s, evs)
}

// collect completes the collection of dir.
func (h *harness) collect(dir string) {
	h.t.Helper()
	for _, c := range collects(h.s) {
		if c.Dir == dir {
			h.do(c.Succeeded(h.res(c), Outcome{}), event.TypeSnapshotCollected)
			return
		}
	}
	h.t.Fatalf("no collection of %s in %+v", dir, collects(h.s))
}

// destroyAll completes every pending destroy.
func (h *harness) destroyAll() {
	h.t.Helper()
	for _, in := range Intents(h.s) {
		if d, ok := in.(DestroyVM); ok {
			h.do(d.Succeeded(h.res(d), Outcome{}), event.TypeVMDestroyed)
		}
	}
}

// promote runs a promote of claim id into template name to its result.
func (h *harness) promote(id, name, tenant, dir string) PromoteVM {
	h.t.Helper()
	h.do(Promote{Meta: h.meta(), Claim: id, Template: name, Tenant: tenant}, event.TypePromoteRequested)
	in := h.intentFor(h.claim(id).VM, kA).(PromoteVM)
	h.do(in.Succeeded(h.res(in), Outcome{SnapshotDir: dir, Digest: "sha256:" + dir}), event.TypePromoted)
	return in
}

func TestStoreOwnership(t *testing.T) {
	for _, tc := range []struct {
		name string
		run  func(t *testing.T, h *harness)
	}{
		{"a rebuilt golden's old dir waits for its last clone, then is collected", func(t *testing.T, h *harness) {
			h.setup(2)
			old := "goldens/" + kA.String()
			if !slices.Equal(refDirs(h.s), []string{old}) || h.s.Mappers(old) != 2 {
				t.Fatalf("refs %v, %d mappers", refDirs(h.s), h.s.Mappers(old))
			}
			h.do(RebuildGolden{Meta: h.meta(), Key: kA}, event.TypeGoldenBuildRequested)
			h.do(RebuildGolden{Meta: h.meta(), Key: kA}) // a build in flight: no-op
			in := h.intentFor("", kA)
			h.do(GoldenBuilt{Meta: h.res(in), Key: kA, SnapshotDir: "golden/new"}, event.TypeGoldenBuilt)
			if r := h.s.Retired(); len(r) != 1 || r[0].Dir != old || r[0].Op != event.ZeroOpID || len(collects(h.s)) != 0 {
				t.Fatalf("retired %+v, collects %+v: the old golden is still mapped by two clones", r, collects(h.s))
			}
			if refs := h.s.SnapshotRefs(); len(refs) != 2 || refs[0] != (SnapshotRef{Dir: "golden/new", Kind: OwnerGolden, Owner: kA.String()}) || refs[1].Kind != OwnerRetired {
				t.Fatalf("refs %+v", refs)
			}
			// A clone of the new golden maps the new one.
			c := h.claimWarm(1, kA)
			h.do(Release{Meta: h.meta(), Claim: c.ID}, event.TypeClaimReleased, event.TypeVMDestroyRequested)
			h.destroyAll()
			if len(collects(h.s)) != 0 {
				t.Fatal("collected while a clone still maps it")
			}
			p, _ := h.s.Pool(kA)
			c2 := h.claimWarm(2, kA)
			if c2.VM != p.WarmVMs()[0] {
				t.Fatal("not the last warm VM")
			}
			h.do(Release{Meta: h.meta(), Claim: c2.ID}, event.TypeClaimReleased, event.TypeVMDestroyRequested)
			d := h.intentFor(c2.VM, kA)
			news := h.doBatch(d.Succeeded(h.res(d), Outcome{}), event.TypeVMDestroyed)
			col := collects(h.s)
			if len(col) != 1 || col[0].Dir != old || !slices.ContainsFunc(news, func(in Intent) bool { return in == Intent(col[0]) }) {
				t.Fatalf("collections %+v; the batch's new intents %+v", col, news)
			}
			h.do(SnapshotCollected{Meta: h.res(col[0]), Dir: old}, event.TypeSnapshotCollected)
			h.rejects(SnapshotCollected{Meta: h.res(col[0]), Dir: old}, NotFound)
			if !slices.Equal(refDirs(h.s), []string{"golden/new"}) {
				t.Fatalf("refs after collection %v", refDirs(h.s))
			}
			// A dir being collected is never an owner's again.
			h.do(RebuildGolden{Meta: h.meta(), Key: kA}, event.TypeGoldenBuildRequested)
		}},
		{"a drained pool's golden is collected once its record goes", func(t *testing.T, h *harness) {
			h.setup(1)
			c := h.claimWarm(1, kA)
			h.do(ConfigurePools{Meta: h.meta()}, event.TypePoolsConfigured)
			if _, ok := h.s.Golden(kA); !ok || len(h.s.Retired()) != 0 {
				t.Fatal("the golden of a draining pool with a live claim is retired")
			}
			h.do(Release{Meta: h.meta(), Claim: c.ID}, event.TypeClaimReleased, event.TypeVMDestroyRequested)
			d := h.intentFor(c.VM, kA)
			news := h.doBatch(d.Succeeded(h.res(d), Outcome{}), event.TypeVMDestroyed)
			if len(news) != 1 || news[0].Kind() != KindCollect || news[0].Subject() != "goldens/"+kA.String() {
				t.Fatalf("new intents %+v", news)
			}
			h.collect("goldens/" + kA.String())
			if len(h.s.SnapshotRefs()) != 0 || len(h.s.Retired()) != 0 {
				t.Fatalf("refs %+v retired %+v", h.s.SnapshotRefs(), h.s.Retired())
			}
		}},
		{"a golden building for a dropped pool is retired when built", func(t *testing.T, h *harness) {
			h.node()
			h.pools(PoolSpec{PoolKey: kA, Warm: 1})
			in := h.intentFor("", kA)
			h.pools()
			h.do(GoldenBuilt{Meta: h.res(in), Key: kA, SnapshotDir: "golden/late"}, event.TypeGoldenBuilt)
			if _, ok := h.s.Golden(kA); ok {
				t.Fatal("kept")
			}
			h.collect("golden/late")
		}},
		{"promote a running sandbox; claim the template; re-promote, label, delete", func(t *testing.T, h *harness) {
			h.setup(1)
			c := h.claimWarm(1, kA)
			kT := PoolKey{Template: "myproj:v1", Net: kA.Net, Size: kA.Size}
			in := h.promote(c.ID, "myproj:v1", "acme", "template/one")
			if in.Target != kT || in.SnapshotDir != "" || in.VM != c.VM {
				t.Fatalf("intent %+v", in)
			}
			if v := h.vm(c.VM); v.Status != VMClaimed || h.claim(c.ID).Status != ClaimRunning {
				t.Fatalf("VM %s after the promote", v.Status)
			}
			tr, ok := h.s.Template(kT)
			if !ok || tr.Tenant != "acme" || tr.Digest != "sha256:template/one" {
				t.Fatalf("template %+v %v", tr, ok)
			}
			if g, _ := h.s.Golden(kT); g.Status != GoldenReady || g.SnapshotDir != "template/one" {
				t.Fatalf("golden %+v", g)
			}
			// Claims of the key clone from it.
			evs := h.do(Claim{Meta: h.meta(), ID: claimID(2), Key: kT}, event.TypeClaimCreated, event.TypeVMCloneRequested)
			if payload[event.ClaimCreated](t, evs, 0).Tier != TierClone.String() {
				t.Fatal("not a clone of the template")
			}
			clone := h.intentFor(h.claim(claimID(2)).VM, kT).(CloneVM)
			if clone.GoldenDir != "template/one" {
				t.Fatalf("clone from %q", clone.GoldenDir)
			}
			h.do(clone.Succeeded(h.res(clone), Outcome{}), event.TypeVMCloned, event.TypeClaimServed)
			// Another tenant can neither replace, label nor delete it.
			h.rejects(Promote{Meta: h.meta(), Claim: c.ID, Template: "myproj:v1", Tenant: "other"}, InvalidTransition)
			h.rejects(DeleteTemplate{Meta: h.meta(), Key: kT, Tenant: "other"}, NotFound)
			h.rejects(SetTemplateLabels{Meta: h.meta(), Key: kT, Tenant: "other", Labels: map[string]string{"a": "b"}}, NotFound)
			h.rejects(DeleteTemplate{Meta: h.meta(), Key: kT, Digest: "sha256:else"}, PreconditionFailed)
			h.rejects(SetTemplateLabels{Meta: h.meta(), Key: kT, Labels: map[string]string{"": "b"}}, Invalid)
			h.do(SetTemplateLabels{Meta: h.meta(), Key: kT, Tenant: "acme", Digest: "sha256:template/one", Labels: map[string]string{"v1": "x"}}, event.TypeTemplateLabelsSet)
			h.do(SetTemplateLabels{Meta: h.meta(), Key: kT, Labels: map[string]string{"v1": "x"}}) // unchanged
			// Re-promoting replaces the golden; the old one stays while its clone runs.
			h.promote(c.ID, "myproj:v1", "acme", "template/two")
			if tr, _ := h.s.Template(kT); tr.Labels != nil {
				t.Fatal("a re-promote keeps the old labels")
			}
			if r := h.s.Retired(); len(r) != 1 || r[0].Dir != "template/one" || len(collects(h.s)) != 0 {
				t.Fatalf("retired %+v", r)
			}
			// Deleting the template leaves its golden to the key's draining
			// record (claim 2 holds it) until its last claim ends.
			h.do(DeleteTemplate{Meta: h.meta(), Key: kT, Tenant: "acme"}, event.TypeTemplateDeleted)
			h.rejects(DeleteTemplate{Meta: h.meta(), Key: kT}, NotFound)
			if g, ok := h.s.Golden(kT); !ok || g.SnapshotDir != "template/two" || len(collects(h.s)) != 0 {
				t.Fatalf("golden %+v %v after the delete", g, ok)
			}
			h.do(Release{Meta: h.meta(), Claim: claimID(2)}, event.TypeClaimReleased, event.TypeVMDestroyRequested)
			h.destroyAll()
			h.collect("template/one")
			h.collect("template/two")
			if !slices.Equal(refDirs(h.s), []string{"goldens/" + kA.String()}) {
				t.Fatalf("refs %v", refDirs(h.s))
			}
		}},
		{"promote a hibernated sandbox from its image, without waking it", func(t *testing.T, h *harness) {
			h.setup(1)
			c := h.claimWarm(1, kA)
			v := h.hibernate(c.ID)
			h.do(Promote{Meta: h.meta(), Claim: c.ID, Template: "snap"}, event.TypePromoteRequested)
			in := h.intentFor(c.VM, kA).(PromoteVM)
			if in.SnapshotDir != v.SnapshotDir || in.SnapshotDir == "" {
				t.Fatalf("intent %+v, image %s", in, v.SnapshotDir)
			}
			if !slices.Contains(refDirs(h.s), v.SnapshotDir) {
				t.Fatal("the image being promoted from is not referenced")
			}
			h.rejects(Wake{Meta: h.meta(), Claim: c.ID}, InvalidTransition)
			h.do(PromoteFailed{Meta: h.res(in), VM: c.VM, Error: "no space"}, event.TypePromoteFailed)
			if h.vm(c.VM).Status != VMHibernated || h.claim(c.ID).Status != ClaimHibernated {
				t.Fatal("a failed promote did not leave the sandbox hibernated")
			}
		}},
		{"a sandbox released while promoting is destroyed when the promote settles; a lost one fails its claim", func(t *testing.T, h *harness) {
			h.setup(2)
			c1, c2 := h.claimWarm(1, kA), h.claimWarm(2, kA)
			h.do(Promote{Meta: h.meta(), Claim: c1.ID, Template: "t1"}, event.TypePromoteRequested)
			in1 := h.intentFor(c1.VM, kA)
			h.rejects(Promote{Meta: h.meta(), Claim: c2.ID, Template: "t1"}, InvalidTransition) // one promote per key at a time
			h.do(Release{Meta: h.meta(), Claim: c1.ID}, event.TypeClaimReleased)
			h.do(in1.Succeeded(h.res(in1), Outcome{SnapshotDir: "template/t1"}), event.TypePromoted, event.TypeVMDestroyRequested)
			h.do(Promote{Meta: h.meta(), Claim: c2.ID, Template: "t2"}, event.TypePromoteRequested)
			in2 := h.intentFor(c2.VM, kA)
			h.do(in2.Failed(h.res(in2), "VMM died", true), event.TypePromoteFailed, event.TypeClaimFailed, event.TypeVMDestroyRequested)
			if cl := h.claim(c2.ID); cl.Reason != "promote_failed" {
				t.Fatalf("claim %+v", cl)
			}
		}},
		{"a sandbox lost in its promote closes its relays as it fails", func(t *testing.T, h *harness) {
			h.setup(1)
			c := h.claimWarm(1, kA)
			h.openRelay(1, c.ID)
			h.do(Promote{Meta: h.meta(), Claim: c.ID, Template: "t1"}, event.TypePromoteRequested)
			in := h.intentFor(c.VM, kA)
			evs := h.do(in.Failed(h.res(in), "VMM died", true),
				event.TypePromoteFailed, event.TypeRelayClosed, event.TypeClaimFailed, event.TypeVMDestroyRequested)
			if r := relayReasons(t, evs); !slices.Equal(r, []string{"failed"}) {
				t.Fatalf("relays closed with %v", r)
			}
		}},
		{"promote refusals", func(t *testing.T, h *harness) {
			h.setup(1)
			c := h.claimWarm(1, kA)
			h.rejects(Promote{Meta: h.meta(), Claim: c.ID, Template: kA.Template}, InvalidTransition) // a configured pool's key
			h.rejects(Promote{Meta: h.meta(), Claim: c.ID, Template: "bad name!"}, Invalid)
			h.rejects(Promote{Meta: h.meta(), Claim: claimID(9), Template: "x"}, NotFound)
			h.rejects(RebuildGolden{Meta: h.meta(), Key: kB}, UnknownPool)
			h.do(Hibernate{Meta: h.meta(), Claim: c.ID}, event.TypeHibernateRequested)
			h.rejects(Promote{Meta: h.meta(), Claim: c.ID, Template: "x"}, InvalidTransition) // hibernating
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			tc.run(t, h)
			back, err := Decode(Encode(h.s))
			if err != nil {
				t.Fatal(err)
			}
			if Hash(back) != Hash(h.s) || !slices.Equal(refDirs(back), refDirs(h.s)) {
				t.Fatal("the store's records do not survive an encoding")
			}
		})
	}
}
