package fsm

import (
	"testing"

	"github.com/sbxlog/sbxlog/eventlog/event"
)

// archiveSetup: node, pool kA (one warm VM) with spec's archive settings,
// and claim 1 taken warm with on_expire onExpire and a 60 s lease.
func archiveSetup(t *testing.T, spec PoolSpec, onExpire string) (*harness, string) {
	h := newHarness(t)
	h.node()
	spec.PoolKey, spec.Warm = kA, 1
	h.pools(spec)
	h.goldenReady(kA)
	h.fill(kA)
	h.do(Claim{Meta: h.meta(), ID: claimID(1), Key: kA, TTLSeconds: 60, OnExpire: onExpire}, event.TypeClaimCreated)
	return h, h.claim(claimID(1)).VM
}

// tick advances the clock by ns and sends a Tick expecting want.
func (h *harness) tick(ns int64, want ...event.Type) []event.Event {
	h.t.Helper()
	h.advance(ns)
	return h.do(Tick{Meta: h.meta()}, want...)
}

// archive completes the pending archive of vm as name.
func (h *harness) archive(vm, name string) []event.Event {
	h.t.Helper()
	in := h.intentFor(vm, kA).(ArchiveVM)
	return h.do(in.Succeeded(h.res(in), Outcome{SnapshotDir: name}), event.TypeArchived)
}

func TestArchiveTransitions(t *testing.T) {
	cases := []struct {
		name string
		run  func(t *testing.T)
	}{
		{"on_expire archive: expiry hibernates, then archives; a wake copies back, then wakes with a fresh lease", func(t *testing.T) {
			h, vm := archiveSetup(t, PoolSpec{}, event.OnExpireArchive)
			if !h.claim(claimID(1)).OnExpireArchive {
				t.Fatal("on_expire not recorded")
			}
			evs := h.tick(60*second, event.TypeHibernateRequested)
			if p := payload[event.HibernateRequested](t, evs, 0); p.Reason != "expire" {
				t.Fatalf("reason %q", p.Reason)
			}
			h.do(HibernateDone{Meta: h.res(h.intentFor(vm, kA)), VM: vm, SnapshotDir: "hibernate/x"}, event.TypeHibernated)
			// The lease is over: the next Tick archives, it does not end the claim.
			h.tick(0, event.TypeArchiveRequested)
			in := h.intentFor(vm, kA).(ArchiveVM)
			if in.SnapshotDir != "hibernate/x" || in.Claim != claimID(1) || in.Instance != "i1" || in.Kind() != KindArchive {
				t.Fatalf("archive intent %+v", in)
			}
			h.archive(vm, "i1/vm-x")
			c, v := h.claim(claimID(1)), h.vm(vm)
			if v.Status != VMArchived || v.Archive != "i1/vm-x" || v.SnapshotDir != "" || c.Status != ClaimHibernated || c.Deadline != 0 || !h.s.Archived(&c) {
				t.Fatalf("after archive: claim %+v VM %+v", c, v)
			}
			// Kept until released: no timer, a Tick much later does nothing.
			if at, ok := h.s.NextTimer(); ok {
				t.Fatalf("a timer is armed at %d", at)
			}
			h.tick(30 * 86400 * second)
			h.rejects(Renew{Meta: h.meta(), Claim: claimID(1)}, InvalidTransition)
			h.do(Wake{Meta: h.meta(), Claim: claimID(1)}, event.TypeUnarchiveRequested)
			un := h.intentFor(vm, kA).(UnarchiveVM)
			if un.Archive != "i1/vm-x" || un.Kind() != KindUnarchive || h.claim(claimID(1)).Status != ClaimWaking {
				t.Fatalf("unarchive intent %+v", un)
			}
			h.do(Wake{Meta: h.meta(), Claim: claimID(1)}) // already waking: no-op
			h.do(un.Succeeded(h.res(un), Outcome{SnapshotDir: "hibernate/back"}), event.TypeUnarchived, event.TypeWakeRequested)
			if c := h.claim(claimID(1)); c.Deadline != h.now+60*second || c.Status != ClaimWaking {
				t.Fatalf("fresh lease: %+v", c)
			}
			wk := h.intentFor(vm, kA).(WakeVM)
			if wk.SnapshotDir != "hibernate/back" {
				t.Fatalf("wake intent %+v", wk)
			}
			h.do(WakeDone{Meta: h.res(wk), VM: vm}, event.TypeWoken)
			if c, v := h.claim(claimID(1)), h.vm(vm); c.Status != ClaimRunning || v.Archive != "" {
				t.Fatalf("after wake: %+v %+v", c, v)
			}
		}},
		{"pool archive_after archives a hibernated claim; its retention ends the claim and deletes the archive", func(t *testing.T) {
			h, vm := archiveSetup(t, PoolSpec{ArchiveAfterSeconds: 30, ArchiveDeleteAfterSeconds: 50}, "")
			h.hibernate(claimID(1))
			h.tick(29 * second)
			evs := h.tick(second, event.TypeArchiveRequested)
			if p := payload[event.ArchiveRequested](t, evs, 0); p.Reason != "idle" {
				t.Fatalf("reason %q", p.Reason)
			}
			evs = h.archive(vm, "i1/vm-a")
			if p := payload[event.Archived](t, evs, 0); p.RetainUntilNS != h.now+50*second {
				t.Fatalf("retention %+v", p)
			}
			h.tick(50*second, event.TypeClaimExpired, event.TypeVMDestroyRequested)
			del := h.intentFor(vm, kA).(DeleteArchiveVM)
			if del.Archive != "i1/vm-a" || del.Kind() != KindArchiveDelete {
				t.Fatalf("delete intent %+v", del)
			}
			h.do(del.Succeeded(h.res(del), Outcome{}), event.TypeVMDestroyed)
			if _, ok := h.s.VM(vm); ok {
				t.Fatal("VM still in state")
			}
		}},
		{"a hibernated claim's lease end archives it when its pool archives", func(t *testing.T) {
			h, vm := archiveSetup(t, PoolSpec{ArchiveAfterSeconds: 3600}, "")
			h.hibernate(claimID(1))
			h.tick(60*second, event.TypeArchiveRequested)
			h.archive(vm, "i1/vm-b")
		}},
		{"without on_expire or an archiving pool the lease end destroys as before", func(t *testing.T) {
			h, _ := archiveSetup(t, PoolSpec{}, "")
			h.hibernate(claimID(1))
			h.tick(60*second, event.TypeClaimExpired, event.TypeVMDestroyRequested)
		}},
		{"a failed archive keeps the snapshot and is retried after ArchiveRetryNS, never destroyed", func(t *testing.T) {
			h, vm := archiveSetup(t, PoolSpec{}, event.OnExpireArchive)
			h.hibernate(claimID(1))
			h.tick(60*second, event.TypeArchiveRequested)
			in := h.intentFor(vm, kA)
			h.do(in.Failed(h.res(in), "put: no space", false), event.TypeArchiveFailed)
			if v := h.vm(vm); v.Status != VMHibernated || v.SnapshotDir == "" {
				t.Fatalf("after a failed archive: %+v", v)
			}
			h.tick(ArchiveRetryNS - 1)
			h.tick(1, event.TypeArchiveRequested)
		}},
		{"a failed hibernate at an archiving expiry is retried after ArchiveRetryNS", func(t *testing.T) {
			h, vm := archiveSetup(t, PoolSpec{}, event.OnExpireArchive)
			h.tick(60*second, event.TypeHibernateRequested)
			in := h.intentFor(vm, kA)
			h.do(in.Failed(h.res(in), "snapshot: 500", false), event.TypeHibernateFailed)
			h.tick(ArchiveRetryNS - 1)
			h.tick(1, event.TypeHibernateRequested)
		}},
		{"a lost archive fails the claim and deletes what is left", func(t *testing.T) {
			h, vm := archiveSetup(t, PoolSpec{}, event.OnExpireArchive)
			h.hibernate(claimID(1))
			h.tick(60*second, event.TypeArchiveRequested)
			h.archive(vm, "i1/vm-c")
			h.do(Wake{Meta: h.meta(), Claim: claimID(1)}, event.TypeUnarchiveRequested)
			in := h.intentFor(vm, kA)
			h.do(in.Failed(h.res(in), "memory-ranges: sha256 mismatch", true), event.TypeUnarchiveFailed, event.TypeClaimFailed, event.TypeVMDestroyRequested)
			if _, ok := h.intentFor(vm, kA).(DeleteArchiveVM); !ok {
				t.Fatal("the archive is not deleted")
			}
		}},
		{"a failed copy back leaves the claim archived", func(t *testing.T) {
			h, vm := archiveSetup(t, PoolSpec{}, event.OnExpireArchive)
			h.hibernate(claimID(1))
			h.tick(60*second, event.TypeArchiveRequested)
			h.archive(vm, "i1/vm-d")
			h.do(Wake{Meta: h.meta(), Claim: claimID(1)}, event.TypeUnarchiveRequested)
			in := h.intentFor(vm, kA)
			h.do(in.Failed(h.res(in), "read: EIO", false), event.TypeUnarchiveFailed)
			if c, v := h.claim(claimID(1)), h.vm(vm); c.Status != ClaimHibernated || v.Status != VMArchived {
				t.Fatalf("%+v %+v", c, v)
			}
		}},
		{"release of an archived claim deletes its archive; release while archiving deletes it once archived", func(t *testing.T) {
			h, vm := archiveSetup(t, PoolSpec{}, event.OnExpireArchive)
			h.hibernate(claimID(1))
			h.tick(60*second, event.TypeArchiveRequested)
			h.rejects(Wake{Meta: h.meta(), Claim: claimID(1)}, InvalidTransition)
			h.do(Release{Meta: h.meta(), Claim: claimID(1)}, event.TypeClaimReleased)
			in := h.intentFor(vm, kA)
			h.do(in.Succeeded(h.res(in), Outcome{SnapshotDir: "i1/vm-e"}), event.TypeArchived, event.TypeVMDestroyRequested)
			h.do(VMDestroyed{Meta: h.res(h.intentFor(vm, kA)), VM: vm}, event.TypeVMDestroyed)
		}},
		{"renew switches on_expire; an unknown on_expire is refused", func(t *testing.T) {
			h, _ := archiveSetup(t, PoolSpec{}, "")
			h.do(Renew{Meta: h.meta(), Claim: claimID(1), TTLSeconds: 60, OnExpire: event.OnExpireArchive}, event.TypeClaimRenewed)
			if !h.claim(claimID(1)).OnExpireArchive {
				t.Fatal("renew did not switch on_expire")
			}
			h.do(Renew{Meta: h.meta(), Claim: claimID(1), TTLSeconds: 60}, event.TypeClaimRenewed)
			if !h.claim(claimID(1)).OnExpireArchive {
				t.Fatal("a renew without on_expire changed it")
			}
			h.rejects(Renew{Meta: h.meta(), Claim: claimID(1), OnExpire: "keep"}, Invalid)
			h.rejects(Claim{Meta: h.meta(), ID: claimID(2), Key: kA, OnExpire: "keep"}, Invalid)
		}},
		{"pool archive settings: negative or not above idle refused", func(t *testing.T) {
			h := newHarness(t)
			h.node()
			for _, sp := range []PoolSpec{
				{PoolKey: kA, ArchiveAfterSeconds: -1},
				{PoolKey: kA, ArchiveDeleteAfterSeconds: -1},
				{PoolKey: kA, IdleHibernateSeconds: 60, ArchiveAfterSeconds: 60},
			} {
				h.rejects(ConfigurePools{Meta: h.meta(), Pools: []PoolSpec{sp}}, Invalid)
			}
		}},
		{"an archived state survives Encode and Decode", func(t *testing.T) {
			h, vm := archiveSetup(t, PoolSpec{ArchiveAfterSeconds: 10, ArchiveDeleteAfterSeconds: 70}, event.OnExpireArchive)
			h.hibernate(claimID(1))
			h.tick(10*second, event.TypeArchiveRequested)
			h.archive(vm, "i1/vm-f")
			back, err := Decode(Encode(h.s))
			if err != nil {
				t.Fatal(err)
			}
			if Hash(back) != Hash(h.s) {
				t.Fatal("hash differs after a round trip")
			}
			if v, _ := back.VM(vm); v.Archive != "i1/vm-f" {
				t.Fatalf("decoded VM %+v", v)
			}
			a, _ := back.NextTimer()
			b, _ := h.s.NextTimer()
			if a != b {
				t.Fatalf("decoded timers %d, want %d", a, b)
			}
		}},
	}
	for _, c := range cases {
		t.Run(c.name, c.run)
	}
}

// An archiving expiry never starts a hibernate (nor an archive) while a
// volume operation of the claim is in flight: it waits for the claim to be
// settled (settledVM, as checkpoint, promote and the idle hibernate do),
// holds no due timer meanwhile, and acts at the first Tick after the
// operation's result, whatever it was. The randomized test found an
// archiving expiry hibernating a claim whose live attach was running.
func TestArchiveWaitsForSettledClaim(t *testing.T) {
	cases := []struct {
		name string
		// start begins the volume operation on running claim 1 (its
		// volume "imagenet" attached or not, as attached says).
		attached bool
		start    func(h *harness)
		// settle ends it, done or failed.
		settle func(h *harness, in Intent)
	}{
		{"attach done", false,
			func(h *harness) {
				h.do(AttachVolumes{Meta: h.meta(), Claim: claimID(1), Volumes: []VolumeRequest{{Name: "imagenet"}}}, event.TypeVolumeAttachRequested)
			},
			func(h *harness, in Intent) {
				h.do(in.Succeeded(h.res(in), Outcome{}), event.TypeVolumeAttached)
			}},
		{"attach failed", false,
			func(h *harness) {
				h.do(AttachVolumes{Meta: h.meta(), Claim: claimID(1), Volumes: []VolumeRequest{{Name: "imagenet"}}}, event.TypeVolumeAttachRequested)
			},
			func(h *harness, in Intent) {
				h.do(in.Failed(h.res(in), "device busy", false), event.TypeVolumeAttachFailed)
			}},
		{"detach done", true,
			func(h *harness) {
				h.do(DetachVolumes{Meta: h.meta(), Claim: claimID(1), Names: []string{"imagenet"}}, event.TypeVolumeDetachRequested)
			},
			func(h *harness, in Intent) {
				h.do(in.Succeeded(h.res(in), Outcome{}), event.TypeVolumeDetached)
			}},
		{"detach failed", true,
			func(h *harness) {
				h.do(DetachVolumes{Meta: h.meta(), Claim: claimID(1), Names: []string{"imagenet"}}, event.TypeVolumeDetachRequested)
			},
			func(h *harness, in Intent) {
				h.do(in.Failed(h.res(in), "target is busy", false), event.TypeVolumeDetachFailed)
			}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			h.node()
			h.volumes()
			h.pools(PoolSpec{PoolKey: kA, Warm: 1})
			h.goldenReady(kA)
			h.fill(kA)
			var vols []VolumeRequest
			if tc.attached {
				vols = []VolumeRequest{{Name: "imagenet"}}
			}
			h.do(Claim{Meta: h.meta(), ID: claimID(1), Key: kA, TTLSeconds: 60, OnExpire: event.OnExpireArchive, Volumes: vols}, event.TypeClaimCreated)
			vm := h.claim(claimID(1)).VM
			if tc.attached {
				in := h.volumeIntent(claimID(1), "imagenet")
				h.do(in.Succeeded(h.res(in), Outcome{}), event.TypeVolumeAttached)
			}
			tc.start(h)
			in := h.volumeIntent(claimID(1), "imagenet")
			// The lease ends with the operation in flight: nothing starts,
			// and no timer stays due (a Tick would find it again and again).
			h.tick(60 * second)
			if v := h.vm(vm); v.Status != VMClaimed {
				t.Fatalf("the expiry acted on an unsettled claim: VM %+v", v)
			}
			if at, ok := h.s.NextTimer(); ok && at <= h.now {
				t.Fatalf("a timer is due at %d (now %d) with nothing to do", at, h.now)
			}
			h.rejects(Checkpoint{Meta: h.meta(), Claim: claimID(1), ID: "ck_0000000000000001"}, InvalidTransition)
			tc.settle(h, in)
			// Settled: the next Tick hibernates it, and the archive follows.
			h.tick(0, event.TypeHibernateRequested)
			h.do(HibernateDone{Meta: h.res(h.intentFor(vm, kA)), VM: vm, SnapshotDir: "hibernate/x"}, event.TypeHibernated)
			h.tick(0, event.TypeArchiveRequested)
			h.archive(vm, "i1/vm-x")
		})
	}
}
