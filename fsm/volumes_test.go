package fsm

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/sbxlog/sbxlog/eventlog/event"
)

var testCatalog = []VolumeSpec{
	{Name: "imagenet", Path: "/srv/imagenet.img"},
	{Name: "weights", Path: "/srv/weights.img", Tenants: []string{"acme"}},
	{Name: "scratch", Path: "/srv/scratch.img", Writable: true},
}

// volumeIntent returns the pending volume intent of claim's volume name.
func (h *harness) volumeIntent(claim, name string) Intent {
	h.t.Helper()
	c := h.claim(claim)
	for _, in := range Intents(h.s) {
		if in.Subject() == c.VM+"/"+name {
			return in
		}
	}
	h.t.Fatalf("no volume intent for %s/%s in %+v", claim, name, Intents(h.s))
	return nil
}

func (h *harness) volumeStatus(claim, name string) VolumeStatus {
	h.t.Helper()
	for _, v := range h.claim(claim).Volumes {
		if v.Name == name {
			return v.Status
		}
	}
	return 0
}

func (h *harness) volumes() {
	h.t.Helper()
	h.do(ConfigureVolumes{Meta: h.meta(), Volumes: testCatalog}, event.TypeVolumesConfigured)
}

// Every volume transition: the catalog, a claim's volumes (warm and
// pending tiers), live attach and detach, results, failures, holds and the
// 409 of a read-write volume a second claim asks for.
func TestVolumeTransitions(t *testing.T) {
	cases := []struct {
		name string
		run  func(t *testing.T, h *harness)
	}{
		{"catalog replaces, identical is a no-op, bad catalogs refused", func(t *testing.T, h *harness) {
			h.node()
			h.volumes()
			rev := slices.Clone(testCatalog)
			slices.Reverse(rev)
			h.do(ConfigureVolumes{Meta: h.meta(), Volumes: rev}) // same catalog, other order: no event
			if got := h.s.Volumes(); len(got) != 3 || got[0].Name != "imagenet" || !got[1].Writable {
				t.Fatalf("catalog %+v", got)
			}
			for _, bad := range [][]VolumeSpec{
				{{Name: "Bad", Path: "/x"}},
				{{Name: "cocoon-data", Path: "/x"}},
				{{Name: "a", Path: "relative"}},
				{{Name: "a", Path: "/x/../y"}},
				{{Name: "a", Path: "/x"}, {Name: "a", Path: "/y"}},
				{{Name: "a", Path: "/x"}, {Name: "b", Path: "/x"}},
			} {
				h.rejects(ConfigureVolumes{Meta: h.meta(), Volumes: bad}, Invalid)
			}
		}},
		{"warm claim attaches its volumes at once, default mounts", func(t *testing.T, h *harness) {
			h.setup(1)
			h.volumes()
			evs := h.do(Claim{Meta: h.meta(), ID: claimID(1), Key: kA, Volumes: []VolumeRequest{{Name: "imagenet"}, {Name: "scratch", Mode: "rw", Mount: "/data"}}},
				event.TypeClaimCreated)
			p := payload[event.ClaimCreated](t, evs, 0)
			if len(p.Volumes) != 2 || p.Volumes[0] != (event.ClaimVolume{Name: "imagenet", Mount: "/volumes/imagenet", Path: "/srv/imagenet.img"}) ||
				!p.Volumes[1].RW || p.Volumes[1].Mount != "/data" {
				t.Fatalf("claim volumes %+v", p.Volumes)
			}
			// One event requested both attaches: NewIntents finds both.
			news := NewIntents(h.s, evs)
			if len(news) != 2 || news[0].Kind() != KindAttachVolume || news[1].Kind() != KindAttachVolume || news[0].IntentOp() == news[1].IntentOp() {
				t.Fatalf("new intents %+v", news)
			}
			in := h.volumeIntent(claimID(1), "scratch").(AttachVolume)
			if in.Disk != (VolumeDisk{Name: "scratch", Path: "/srv/scratch.img", Mount: "/data", RW: true}) || in.RunDir == "" || in.Claim != claimID(1) {
				t.Fatalf("intent %+v", in)
			}
			h.do(in.Succeeded(h.res(in), Outcome{}), event.TypeVolumeAttached)
			if h.volumeStatus(claimID(1), "scratch") != VolumeAttached || h.volumeStatus(claimID(1), "imagenet") != VolumeAttaching {
				t.Fatalf("volumes %+v", h.claim(claimID(1)).Volumes)
			}
			// A second result of the same intent is stale.
			h.rejects(in.Succeeded(h.res(in), Outcome{}), InvalidTransition)
		}},
		{"pending claim's volumes wait for its VM", func(t *testing.T, h *harness) {
			h.setup(0)
			h.volumes()
			h.do(Claim{Meta: h.meta(), ID: claimID(1), Key: kA, Volumes: []VolumeRequest{{Name: "imagenet"}}},
				event.TypeClaimCreated, event.TypeVMCloneRequested)
			if h.volumeStatus(claimID(1), "imagenet") != VolumeWaiting {
				t.Fatal("volume not waiting")
			}
			vm := h.claim(claimID(1)).VM
			clone := h.intentFor(vm, kA)
			evs := h.do(clone.Succeeded(h.res(clone), Outcome{}), event.TypeVMCloned, event.TypeClaimServed)
			if news := NewIntents(h.s, evs); len(news) != 1 || news[0].Kind() != KindAttachVolume {
				t.Fatalf("new intents %+v", news)
			}
		}},
		{"read-write volume refused to a second claim, readers exclude a writer", func(t *testing.T, h *harness) {
			h.setup(3)
			h.volumes()
			h.do(Claim{Meta: h.meta(), ID: claimID(1), Key: kA, Volumes: []VolumeRequest{{Name: "scratch", Mode: "rw"}}}, event.TypeClaimCreated)
			rej := h.rejects(Claim{Meta: h.meta(), ID: claimID(2), Key: kA, Volumes: []VolumeRequest{{Name: "scratch"}}}, InvalidTransition)
			if !strings.Contains(rej.Msg, "volume busy") || rej.Code.HTTPStatus() != 409 {
				t.Fatalf("rejection %+v", rej)
			}
			h.do(Claim{Meta: h.meta(), ID: claimID(3), Key: kA, Volumes: []VolumeRequest{{Name: "imagenet"}}}, event.TypeClaimCreated)
			h.rejects(Claim{Meta: h.meta(), ID: claimID(4), Key: kA, Volumes: []VolumeRequest{{Name: "imagenet", Mode: "rw"}}}, Invalid) // not writable
			// The writer's hold outlives its claim until its VM is gone.
			vm := h.claim(claimID(1)).VM
			h.do(Release{Meta: h.meta(), Claim: claimID(1)}, event.TypeClaimReleased, event.TypeVMDestroyRequested)
			if n, w := h.s.VolumeHolders("scratch"); n != 1 || !w {
				t.Fatalf("holders %d %v after release", n, w)
			}
			h.rejects(Claim{Meta: h.meta(), ID: claimID(5), Key: kA, Volumes: []VolumeRequest{{Name: "scratch", Mode: "rw"}}}, InvalidTransition)
			d := h.intentFor(vm, kA)
			h.do(d.Succeeded(h.res(d), Outcome{}), event.TypeVMDestroyed)
			if n, _ := h.s.VolumeHolders("scratch"); n != 0 {
				t.Fatalf("holders %d after the VM is gone", n)
			}
			h.do(Claim{Meta: h.meta(), ID: claimID(6), Key: kA, Volumes: []VolumeRequest{{Name: "scratch", Mode: "rw"}}}, event.TypeClaimCreated)
		}},
		{"unknown, forbidden and malformed volume requests", func(t *testing.T, h *harness) {
			h.setup(1)
			h.volumes()
			unknown := h.rejects(Claim{Meta: h.meta(), ID: claimID(1), Key: kA, Volumes: []VolumeRequest{{Name: "nope"}}}, Invalid)
			forbidden := h.rejects(Claim{Meta: h.meta(), ID: claimID(1), Key: kA, Tenant: "other", Volumes: []VolumeRequest{{Name: "weights"}}}, Invalid)
			if strings.ReplaceAll(unknown.Msg, "nope", "X") != strings.ReplaceAll(forbidden.Msg, "weights", "X") {
				t.Fatalf("unknown %q and forbidden %q differ", unknown.Msg, forbidden.Msg)
			}
			h.do(Claim{Meta: h.meta(), ID: claimID(1), Key: kA, Tenant: "acme", Volumes: []VolumeRequest{{Name: "weights"}}}, event.TypeClaimCreated)
			for _, bad := range []Claim{
				{Volumes: []VolumeRequest{{Name: "imagenet", Mount: "etc"}}},
				{Volumes: []VolumeRequest{{Name: "imagenet", Mount: "/etc/x"}}},
				{Volumes: []VolumeRequest{{Name: "imagenet", Mount: "/a/../b"}}},
				{Volumes: []VolumeRequest{{Name: "imagenet", Mount: "/a"}, {Name: "scratch", Mount: "/a/b"}}},
				{Volumes: []VolumeRequest{{Name: "imagenet"}, {Name: "imagenet", Mount: "/b"}}},
				{Volumes: []VolumeRequest{{Name: "imagenet", Mode: "wx"}}},
				{Volumes: []VolumeRequest{{Name: "imagenet", Mount: "/a"}}, VolumesAttachOnly: true},
				{VolumesAttachOnly: true},
			} {
				bad.Meta, bad.ID, bad.Key = h.meta(), claimID(2), kA
				h.rejects(bad, Invalid)
			}
		}},
		{"attach-only claims mount nothing", func(t *testing.T, h *harness) {
			h.setup(1)
			h.volumes()
			h.do(Claim{Meta: h.meta(), ID: claimID(1), Key: kA, VolumesAttachOnly: true, Volumes: []VolumeRequest{{Name: "imagenet"}}}, event.TypeClaimCreated)
			if in := h.volumeIntent(claimID(1), "imagenet").(AttachVolume); in.Disk.Mount != "" {
				t.Fatalf("attach-only mount %q", in.Disk.Mount)
			}
		}},
		{"claim-time attach failure fails the claim and destroys its VM", func(t *testing.T, h *harness) {
			h.setup(1)
			h.volumes()
			h.do(Claim{Meta: h.meta(), ID: claimID(1), Key: kA, Volumes: []VolumeRequest{{Name: "scratch", Mode: "rw"}}}, event.TypeClaimCreated)
			in := h.volumeIntent(claimID(1), "scratch")
			h.do(in.Failed(h.res(in), "no such file", false), event.TypeVolumeAttachFailed, event.TypeClaimFailed, event.TypeVMDestroyRequested)
			if c := h.claim(claimID(1)); c.Status != ClaimFailed || c.Reason != "volume_failed" {
				t.Fatalf("claim %+v", c)
			}
		}},
		{"live attach and detach of read-only volumes", func(t *testing.T, h *harness) {
			h.setup(1)
			h.volumes()
			h.claimWarm(1, kA)
			h.rejects(AttachVolumes{Meta: h.meta(), Claim: claimID(1), Volumes: []VolumeRequest{{Name: "scratch", Mode: "rw"}}}, Invalid)
			evs := h.do(AttachVolumes{Meta: h.meta(), Claim: claimID(1), Volumes: []VolumeRequest{{Name: "imagenet"}}}, event.TypeVolumeAttachRequested)
			if news := NewIntents(h.s, evs); len(news) != 1 || news[0].Kind() != KindAttachVolume {
				t.Fatalf("new intents %+v", news)
			}
			// One operation at a time: a second change and a hibernate wait.
			h.rejects(AttachVolumes{Meta: h.meta(), Claim: claimID(1), Volumes: []VolumeRequest{{Name: "scratch"}}}, InvalidTransition)
			h.rejects(Hibernate{Meta: h.meta(), Claim: claimID(1)}, InvalidTransition)
			in := h.volumeIntent(claimID(1), "imagenet")
			h.do(in.Succeeded(h.res(in), Outcome{}), event.TypeVolumeAttached)
			// The same request again is a no-op; another mount is refused.
			h.do(AttachVolumes{Meta: h.meta(), Claim: claimID(1), Volumes: []VolumeRequest{{Name: "imagenet"}}})
			h.rejects(AttachVolumes{Meta: h.meta(), Claim: claimID(1), Volumes: []VolumeRequest{{Name: "imagenet", Mount: "/elsewhere"}}}, Invalid)
			h.rejects(AttachVolumes{Meta: h.meta(), Claim: claimID(1), Volumes: []VolumeRequest{{Name: "scratch", Mount: "/volumes/imagenet/x"}}}, Invalid)
			// Detach: a busy mount fails and keeps it, then it goes.
			h.do(DetachVolumes{Meta: h.meta(), Claim: claimID(1), Names: []string{"imagenet", "weights"}}, event.TypeVolumeDetachRequested)
			d := h.volumeIntent(claimID(1), "imagenet")
			if d.Kind() != KindDetachVolume {
				t.Fatalf("intent %+v", d)
			}
			h.do(d.Failed(h.res(d), "target is busy", false), event.TypeVolumeDetachFailed)
			if h.volumeStatus(claimID(1), "imagenet") != VolumeAttached {
				t.Fatal("a failed detach dropped the volume")
			}
			h.do(DetachVolumes{Meta: h.meta(), Claim: claimID(1), Names: []string{"imagenet"}}, event.TypeVolumeDetachRequested)
			d = h.volumeIntent(claimID(1), "imagenet")
			h.do(d.Succeeded(h.res(d), Outcome{}), event.TypeVolumeDetached)
			if len(h.claim(claimID(1)).Volumes) != 0 {
				t.Fatalf("volumes %+v", h.claim(claimID(1)).Volumes)
			}
			h.do(DetachVolumes{Meta: h.meta(), Claim: claimID(1), Names: []string{"imagenet"}}) // absent: no-op
		}},
		{"live changes need a running claim; live attach failure drops only the volume", func(t *testing.T, h *harness) {
			h.setup(1)
			h.volumes()
			h.claimWarm(1, kA)
			h.do(AttachVolumes{Meta: h.meta(), Claim: claimID(1), Volumes: []VolumeRequest{{Name: "imagenet"}}}, event.TypeVolumeAttachRequested)
			in := h.volumeIntent(claimID(1), "imagenet")
			h.do(in.Failed(h.res(in), "boom", false), event.TypeVolumeAttachFailed)
			if c := h.claim(claimID(1)); c.Status != ClaimRunning || len(c.Volumes) != 0 {
				t.Fatalf("claim %+v", c)
			}
			h.hibernate(claimID(1))
			h.rejects(AttachVolumes{Meta: h.meta(), Claim: claimID(1), Volumes: []VolumeRequest{{Name: "imagenet"}}}, InvalidTransition)
			h.rejects(AttachVolumes{Meta: h.meta(), Claim: claimID(9), Volumes: []VolumeRequest{{Name: "imagenet"}}}, NotFound)
		}},
		{"attached volumes ride along wake and restart", func(t *testing.T, h *harness) {
			h.setup(1)
			h.volumes()
			h.do(Claim{Meta: h.meta(), ID: claimID(1), Key: kA, Volumes: []VolumeRequest{{Name: "imagenet"}}}, event.TypeClaimCreated)
			in := h.volumeIntent(claimID(1), "imagenet")
			h.do(in.Succeeded(h.res(in), Outcome{}), event.TypeVolumeAttached)
			want := []VolumeDisk{{Name: "imagenet", Path: "/srv/imagenet.img", Mount: "/volumes/imagenet"}}
			v := h.hibernate(claimID(1))
			h.do(Wake{Meta: h.meta(), Claim: claimID(1)}, event.TypeWakeRequested)
			w := h.intentFor(v.ID, kA).(WakeVM)
			if !slices.Equal(w.Volumes, want) {
				t.Fatalf("wake volumes %+v", w.Volumes)
			}
			h.do(w.Succeeded(h.res(w), Outcome{}), event.TypeWoken)
			h.do(VMExited{Meta: h.meta(), VM: v.ID, Restart: DefaultRestartPolicy}, event.TypeVMExited, event.TypeVMRestartRequested)
			if r := h.intentFor(v.ID, kA).(RestartVM); !slices.Equal(r.Volumes, want) {
				t.Fatalf("restart volumes %+v", r.Volumes)
			}
		}},
		{"a release while an attach runs destroys the VM; the late result is stale", func(t *testing.T, h *harness) {
			h.setup(1)
			h.volumes()
			h.do(Claim{Meta: h.meta(), ID: claimID(1), Key: kA, Volumes: []VolumeRequest{{Name: "imagenet"}}}, event.TypeClaimCreated)
			in := h.volumeIntent(claimID(1), "imagenet")
			vm := h.claim(claimID(1)).VM
			h.do(Release{Meta: h.meta(), Claim: claimID(1)}, event.TypeClaimReleased, event.TypeVMDestroyRequested)
			d := h.intentFor(vm, kA)
			h.do(d.Succeeded(h.res(d), Outcome{}), event.TypeVMDestroyed)
			if rej := h.rejects(in.Succeeded(h.res(in), Outcome{}), InvalidTransition); rej == nil {
				t.Fatal("late attach accepted")
			}
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { c.run(t, newHarness(t)) })
	}
}

// The state's encoding carries the catalog and the claims' volumes.
func TestVolumesEncode(t *testing.T) {
	h := newHarness(t)
	h.setup(2)
	h.volumes()
	h.do(Claim{Meta: h.meta(), ID: claimID(1), Key: kA, Volumes: []VolumeRequest{{Name: "scratch", Mode: "rw"}, {Name: "imagenet"}}}, event.TypeClaimCreated)
	in := h.volumeIntent(claimID(1), "scratch")
	h.do(in.Succeeded(h.res(in), Outcome{}), event.TypeVolumeAttached)
	got, err := Decode(Encode(h.s))
	if err != nil {
		t.Fatal(err)
	}
	if Hash(got) != Hash(h.s) || len(Intents(got)) != len(Intents(h.s)) {
		t.Fatal("decoded state differs")
	}
	if n, w := got.VolumeHolders("scratch"); n != 1 || !w {
		t.Fatalf("holders after decode %d %v", n, w)
	}
	if _, err := Decode(append([]byte{StateFormatV5}, Encode(h.s)[1:]...)); !errors.Is(err, ErrStateCorrupt) {
		t.Fatalf("V6 bytes read as V5: %v", err)
	}
}
