package fsm

import (
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/sbxlog/sbxlog/eventlog/event"
)

// Acceptance 2: every transition, as a table of scenarios. Each scenario
// builds its state through Decide+Apply (so setup paths are transitions
// too), then checks the events of the transition under test and the state
// after it. The harness checks all invariants after every batch.
func TestTransitions(t *testing.T) {
	type tc struct {
		name string
		run  func(t *testing.T, h *harness)
	}
	const (
		T = event.TypeClaimCreated
	)
	cases := []tc{
		{"configure node, then idempotent", func(t *testing.T, h *harness) {
			h.node()
			h.do(ConfigureNode{Meta: h.meta(), Node: "n1", Instance: "i1"})
			if h.s.Node() != "n1" || h.s.Instance() != "i1" {
				t.Fatalf("node %q instance %q", h.s.Node(), h.s.Instance())
			}
		}},
		{"new pool requests its golden", func(t *testing.T, h *harness) {
			h.node()
			evs := h.do(ConfigurePools{Meta: h.meta(), Pools: []PoolSpec{{PoolKey: kA, Warm: 2}}},
				event.TypePoolsConfigured, event.TypeGoldenBuildRequested)
			if p := payload[event.PoolsConfigured](t, evs, 0); p.Pools[0].WarmMax != 2 {
				t.Fatalf("warm_max not normalised to warm: %+v", p)
			}
			g, _ := h.s.Golden(kA)
			in := h.intentFor("", kA).(BuildGolden)
			if g.Status != GoldenBuilding || in.OpID != IntentOp(evs[1].OpID, evs[1].Type, evs[1].AggID) {
				t.Fatalf("golden %+v intent %+v", g, in)
			}
			if len(RefillsNeeded(h.s)) != 0 {
				t.Fatal("refill wanted before the golden is ready")
			}
			h.do(ConfigurePools{Meta: h.meta(), Pools: []PoolSpec{{PoolKey: kA, Warm: 2, WarmMax: 2}}}) // identical: no events
		}},
		{"golden built enables refills; refill clones count toward the target", func(t *testing.T, h *harness) {
			h.node()
			h.pools(PoolSpec{PoolKey: kA, Warm: 3})
			h.goldenReady(kA)
			if got := RefillsNeeded(h.s); !slices.Equal(got, []PoolKey{kA}) {
				t.Fatalf("RefillsNeeded = %v", got)
			}
			evs := h.do(Refill{Meta: h.meta()}, event.TypeVMCloneRequested, event.TypeVMCloneRequested, event.TypeVMCloneRequested)
			p := payload[event.VMCloneRequested](t, evs, 0)
			if p.VM != VMID(evs[0].OpID, 0) || p.RunDir != "i1/"+p.VM || p.Instance != "i1" || p.Node != "n1" || p.Claim != "" {
				t.Fatalf("clone request %+v", p)
			}
			if len(RefillsNeeded(h.s)) != 0 {
				t.Fatal("in-flight clones do not count toward the target")
			}
			h.do(Refill{Meta: h.meta(), Key: kA}) // nothing short: no events
			in := h.intentFor(p.VM, kA).(CloneVM)
			if in.GoldenDir != "goldens/"+kA.String() || in.Cold || in.ForClaim != "" {
				t.Fatalf("clone intent %+v", in)
			}
			h.do(VMCloned{Meta: h.res(in), VM: p.VM}, event.TypeVMCloned)
			if info := h.s.Info().Pools[0]; info.Warm != 1 || info.Refilling != 2 || info.Target != 3 || info.Golden != GoldenReady {
				t.Fatalf("info %+v", info)
			}
		}},
		{"warm claim takes the newest warm VM at once (LIFO)", func(t *testing.T, h *harness) {
			h.setup(3)
			p, _ := h.s.Pool(kA)
			stack := p.WarmVMs()
			evs := h.do(Claim{Meta: h.meta(), ID: claimID(1), Key: kA, Tenant: "acme", ClaimRef: "r", Metadata: map[string]string{"k": "v"}}, T)
			cc := payload[event.ClaimCreated](t, evs, 0)
			if cc.Tier != "warm" || cc.VM != stack[2] || cc.TTLSeconds != DefaultTTLSeconds || cc.DeadlineNS != h.now+DefaultTTLSeconds*second || cc.TokenGen != 1 {
				t.Fatalf("claim event %+v", cc)
			}
			c := h.claim(claimID(1))
			if c.Status != ClaimRunning || c.Tier != TierWarm || c.LastActivity != h.now || c.Metadata["k"] != "v" {
				t.Fatalf("claim %+v", c)
			}
			if v := h.vm(stack[2]); v.Status != VMClaimed || v.Claim != claimID(1) {
				t.Fatalf("VM %+v", v)
			}
			h.claimWarm(2, kA)
			if h.claim(claimID(2)).VM != stack[1] {
				t.Fatal("second claim did not take the next newest")
			}
			if !slices.Equal(RefillsNeeded(h.s), []PoolKey{kA}) {
				t.Fatal("a claimed warm VM does not trigger a refill")
			}
		}},
		{"clone tier: pending claim, on-demand clone ahead of refills, served when ready", func(t *testing.T, h *harness) {
			h.setup(1)
			h.claimWarm(1, kA)
			h.do(Refill{Meta: h.meta()}, event.TypeVMCloneRequested) // a refill in flight
			evs := h.do(Claim{Meta: h.meta(), ID: claimID(2), Key: kA, ServeTimeoutSeconds: 10}, T, event.TypeVMCloneRequested)
			cc := payload[event.ClaimCreated](t, evs, 0)
			vm := cc.VM
			if cc.Tier != "clone" || cc.ServeByNS != h.now+10*second || payload[event.VMCloneRequested](t, evs, 1).Claim != claimID(2) {
				t.Fatalf("claim %+v", cc)
			}
			if c := h.claim(claimID(2)); c.Status != ClaimPending {
				t.Fatalf("claim %+v", c)
			}
			ins := Intents(h.s)
			if first, ok := ins[0].(CloneVM); !ok || first.VM != vm || first.ForClaim != claimID(2) {
				t.Fatalf("on-demand clone is not first: %+v", ins)
			}
			h.advance(second)
			h.do(VMCloned{Meta: h.res(ins[0]), VM: vm}, event.TypeVMCloned, event.TypeClaimServed)
			if c := h.claim(claimID(2)); c.Status != ClaimRunning || c.LastActivity != h.now {
				t.Fatalf("claim %+v", c)
			}
			if v := h.vm(vm); v.Status != VMClaimed {
				t.Fatalf("VM %+v", v)
			}
		}},
		{"cold tier when no golden is ready", func(t *testing.T, h *harness) {
			h.node()
			h.pools(PoolSpec{PoolKey: kA, Warm: 1})
			evs := h.do(Claim{Meta: h.meta(), ID: claimID(1), Key: kA}, T, event.TypeVMCloneRequested)
			if payload[event.ClaimCreated](t, evs, 0).Tier != "cold" || !payload[event.VMCloneRequested](t, evs, 1).Cold {
				t.Fatal("not a cold claim")
			}
			in := h.intentFor(evs[1].AggID, kA).(CloneVM)
			if !in.Cold || in.GoldenDir != "" {
				t.Fatalf("intent %+v", in)
			}
			h.do(VMCloned{Meta: h.res(in), VM: in.VM}, event.TypeVMCloned, event.TypeClaimServed)
			if h.claim(claimID(1)).Tier != TierCold {
				t.Fatal("tier not recorded")
			}
		}},
		{"failed on-demand clone and cold boot fail the claim", func(t *testing.T, h *harness) {
			h.node()
			h.pools(PoolSpec{PoolKey: kA})
			evs := h.do(Claim{Meta: h.meta(), ID: claimID(1), Key: kA}, T, event.TypeVMCloneRequested)
			in := h.intentFor(evs[1].AggID, kA)
			f := h.do(VMCloneFailed{Meta: h.res(in), VM: evs[1].AggID, Error: "boom"}, event.TypeVMCloneFailed, event.TypeClaimFailed)
			if p := payload[event.ClaimFailed](t, f, 1); p.Reason != "cold_boot_failed" || p.Error != "boom" {
				t.Fatalf("%+v", p)
			}
			if _, ok := h.s.VM(evs[1].AggID); ok {
				t.Fatal("failed VM still in state")
			}
			h.goldenReady(kA)
			evs = h.do(Claim{Meta: h.meta(), ID: claimID(2), Key: kA}, T, event.TypeVMCloneRequested)
			f = h.do(VMCloneFailed{Meta: h.res(h.intentFor(evs[1].AggID, kA)), VM: evs[1].AggID}, event.TypeVMCloneFailed, event.TypeClaimFailed)
			if payload[event.ClaimFailed](t, f, 1).Reason != "clone_failed" {
				t.Fatal("wrong reason")
			}
			if c := h.claim(claimID(2)); c.Status != ClaimFailed || h.s.LiveClaims() != 0 {
				t.Fatalf("claim %+v", c)
			}
		}},
		{"pending claim fails at its serve deadline; its late clone is destroyed", func(t *testing.T, h *harness) {
			h.setup(0)
			evs := h.do(Claim{Meta: h.meta(), ID: claimID(1), Key: kA, ServeTimeoutSeconds: 5}, T, event.TypeVMCloneRequested)
			vm := evs[1].AggID
			h.advance(5*second - 1)
			h.do(Tick{Meta: h.meta()})
			h.advance(1)
			f := h.do(Tick{Meta: h.meta()}, event.TypeClaimFailed)
			if payload[event.ClaimFailed](t, f, 0).Reason != "deadline" {
				t.Fatal("wrong reason")
			}
			h.do(Tick{Meta: h.meta()}) // nothing left due
			h.do(VMCloned{Meta: h.res(h.intentFor(vm, kA)), VM: vm}, event.TypeVMCloned, event.TypeVMDestroyRequested)
			if v := h.vm(vm); v.Status != VMDestroying {
				t.Fatalf("VM %+v", v)
			}
		}},
		{"refill clone failure parks the pool, Tick resumes it", func(t *testing.T, h *harness) {
			h.node()
			h.pools(PoolSpec{PoolKey: kA, Warm: 1})
			h.goldenReady(kA)
			evs := h.do(Refill{Meta: h.meta()}, event.TypeVMCloneRequested)
			f := h.do(VMCloneFailed{Meta: h.res(h.intentFor(evs[0].AggID, kA)), VM: evs[0].AggID}, event.TypeVMCloneFailed, event.TypePoolParked)
			if p := payload[event.PoolParked](t, f, 1); p.Reason != ParkCloneFailed || p.UntilNS != h.now+CloneRetryNS || *p.Key != kA {
				t.Fatalf("%+v", p)
			}
			if len(RefillsNeeded(h.s)) != 0 {
				t.Fatal("parked pool still wants refills")
			}
			if info := h.s.Info().Pools[0]; !info.Parked || info.AtCapacity {
				t.Fatalf("info %+v", info)
			}
			h.advance(CloneRetryNS)
			h.do(Tick{Meta: h.meta()}, event.TypePoolUnparked)
			if !slices.Equal(RefillsNeeded(h.s), []PoolKey{kA}) {
				t.Fatal("refills did not resume")
			}
		}},
		{"capacity full parks a pool or the node for 30 s", func(t *testing.T, h *harness) {
			h.setup(1)
			h.claimWarm(1, kA)
			k := kA
			h.do(CapacityFull{Meta: h.meta(), Key: &k}, event.TypePoolParked)
			if info := h.s.Info(); !info.Pools[0].AtCapacity || info.AtCapacity || len(RefillsNeeded(h.s)) != 0 {
				t.Fatalf("info %+v", info)
			}
			h.do(CapacityFull{Meta: h.meta(), Key: &k}) // same instant: nothing to extend
			h.do(CapacityFull{Meta: h.meta()}, event.TypePoolParked)
			if !h.s.Info().AtCapacity {
				t.Fatal("node not at capacity")
			}
			if at, _ := h.s.NextTimer(); at != h.now+CapacityParkNS {
				t.Fatalf("next timer %d", at)
			}
			h.advance(CapacityParkNS)
			h.do(Tick{Meta: h.meta()}, event.TypePoolUnparked, event.TypePoolUnparked)
			if h.s.Info().AtCapacity || h.s.Info().Pools[0].Parked || len(RefillsNeeded(h.s)) != 1 {
				t.Fatalf("still parked: %+v", h.s.Info())
			}
		}},
		{"hibernate and wake keep the VM id; both idempotent", func(t *testing.T, h *harness) {
			h.setup(1)
			c := h.claimWarm(1, kA)
			evs := h.do(Hibernate{Meta: h.meta(), Claim: c.ID}, event.TypeHibernateRequested)
			if p := payload[event.HibernateRequested](t, evs, 0); p.Reason != "user" || p.VM != c.VM {
				t.Fatalf("%+v", p)
			}
			h.do(Hibernate{Meta: h.meta(), Claim: c.ID}) // hibernating: no-op
			in := h.intentFor(c.VM, kA).(HibernateVM)
			if in.Claim != c.ID || in.RunDir != "i1/"+c.VM {
				t.Fatalf("intent %+v", in)
			}
			h.do(HibernateDone{Meta: h.res(in), VM: c.VM, SnapshotDir: "snap/1"}, event.TypeHibernated)
			if cl, v := h.claim(c.ID), h.vm(c.VM); cl.Status != ClaimHibernated || v.Status != VMHibernated || v.SnapshotDir != "snap/1" {
				t.Fatalf("claim %+v VM %+v", cl, v)
			}
			h.do(Hibernate{Meta: h.meta(), Claim: c.ID}) // hibernated: no-op
			h.advance(second)
			evs = h.do(Wake{Meta: h.meta(), Claim: c.ID}, event.TypeWakeRequested)
			if payload[event.WakeRequested](t, evs, 0).SnapshotDir != "snap/1" {
				t.Fatal("wake without the snapshot dir")
			}
			h.do(Wake{Meta: h.meta(), Claim: c.ID}) // waking: no-op
			win := h.intentFor(c.VM, kA).(WakeVM)
			if win.SnapshotDir != "snap/1" || win.VM != c.VM {
				t.Fatalf("intent %+v", win)
			}
			h.do(WakeDone{Meta: h.res(win), VM: c.VM}, event.TypeWoken)
			if cl, v := h.claim(c.ID), h.vm(c.VM); cl.Status != ClaimRunning || v.Status != VMClaimed || cl.LastActivity != h.now {
				t.Fatalf("claim %+v VM %+v", cl, v)
			}
			h.do(Wake{Meta: h.meta(), Claim: c.ID}) // running: no-op
		}},
		{"failed hibernate rolls back; lost VM fails the claim", func(t *testing.T, h *harness) {
			h.setup(2)
			c := h.claimWarm(1, kA)
			h.do(Hibernate{Meta: h.meta(), Claim: c.ID}, event.TypeHibernateRequested)
			h.do(HibernateFailed{Meta: h.res(h.intentFor(c.VM, kA)), VM: c.VM, Error: "x"}, event.TypeHibernateFailed)
			if cl := h.claim(c.ID); cl.Status != ClaimRunning || h.vm(c.VM).Status != VMClaimed {
				t.Fatalf("claim %+v", cl)
			}
			h.do(Hibernate{Meta: h.meta(), Claim: c.ID}, event.TypeHibernateRequested)
			f := h.do(HibernateFailed{Meta: h.res(h.intentFor(c.VM, kA)), VM: c.VM, Error: "x", Lost: true},
				event.TypeHibernateFailed, event.TypeClaimFailed, event.TypeVMDestroyRequested)
			if payload[event.ClaimFailed](t, f, 1).Reason != "hibernate_failed" || h.claim(c.ID).Status != ClaimFailed {
				t.Fatal("claim not failed")
			}
		}},
		{"failed wake keeps the snapshot; lost snapshot fails the claim", func(t *testing.T, h *harness) {
			h.setup(1)
			c := h.claimWarm(1, kA)
			h.hibernate(c.ID)
			h.do(Wake{Meta: h.meta(), Claim: c.ID}, event.TypeWakeRequested)
			h.do(WakeFailed{Meta: h.res(h.intentFor(c.VM, kA)), VM: c.VM, Error: "x"}, event.TypeWakeFailed)
			if cl, v := h.claim(c.ID), h.vm(c.VM); cl.Status != ClaimHibernated || v.Status != VMHibernated || v.SnapshotDir != "snap/"+c.ID {
				t.Fatalf("claim %+v VM %+v", cl, v)
			}
			h.do(Wake{Meta: h.meta(), Claim: c.ID}, event.TypeWakeRequested)
			h.do(WakeFailed{Meta: h.res(h.intentFor(c.VM, kA)), VM: c.VM, Error: "x", Lost: true},
				event.TypeWakeFailed, event.TypeClaimFailed, event.TypeVMDestroyRequested)
			if in := h.intentFor(c.VM, kA).(DestroyVM); in.SnapshotDir != "snap/"+c.ID {
				t.Fatalf("destroy does not remove the snapshot: %+v", in)
			}
		}},
		{"release destroys the VM; second release is a no-op", func(t *testing.T, h *harness) {
			h.setup(1)
			c := h.claimWarm(1, kA)
			evs := h.do(Release{Meta: h.meta(), Claim: c.ID}, event.TypeClaimReleased, event.TypeVMDestroyRequested)
			if payload[event.VMDestroyRequested](t, evs, 1).Reason != "release" || h.claim(c.ID).Status != ClaimReleased {
				t.Fatal("not released")
			}
			h.do(Release{Meta: h.meta(), Claim: c.ID})
			in := h.intentFor(c.VM, kA).(DestroyVM)
			h.do(VMDestroyed{Meta: h.res(in), VM: c.VM}, event.TypeVMDestroyed)
			if _, ok := h.s.VM(c.VM); ok {
				t.Fatal("destroyed VM still in state")
			}
			if len(Intents(h.s)) != 0 {
				t.Fatalf("intents left: %+v", Intents(h.s))
			}
		}},
		{"release of a hibernated claim destroys VM and snapshot", func(t *testing.T, h *harness) {
			h.setup(1)
			c := h.claimWarm(1, kA)
			h.hibernate(c.ID)
			h.do(Release{Meta: h.meta(), Claim: c.ID}, event.TypeClaimReleased, event.TypeVMDestroyRequested)
			if in := h.intentFor(c.VM, kA).(DestroyVM); in.SnapshotDir != "snap/"+c.ID || in.RunDir != "i1/"+c.VM {
				t.Fatalf("intent %+v", in)
			}
		}},
		{"release while a side effect is in flight destroys the VM when it settles", func(t *testing.T, h *harness) {
			h.setup(2)
			// pending (on-demand clone in flight)
			h.claimWarm(1, kA)
			h.claimWarm(2, kA)
			evs := h.do(Claim{Meta: h.meta(), ID: claimID(3), Key: kA}, T, event.TypeVMCloneRequested)
			h.do(Release{Meta: h.meta(), Claim: claimID(3)}, event.TypeClaimReleased)
			h.do(VMCloned{Meta: h.res(h.intentFor(evs[1].AggID, kA)), VM: evs[1].AggID}, event.TypeVMCloned, event.TypeVMDestroyRequested)
			// hibernating
			c := h.claim(claimID(1))
			h.do(Hibernate{Meta: h.meta(), Claim: c.ID}, event.TypeHibernateRequested)
			h.do(Release{Meta: h.meta(), Claim: c.ID}, event.TypeClaimReleased)
			h.do(HibernateDone{Meta: h.res(h.intentFor(c.VM, kA)), VM: c.VM, SnapshotDir: "s"}, event.TypeHibernated, event.TypeVMDestroyRequested)
			// waking
			c = h.claim(claimID(2))
			h.hibernate(c.ID)
			h.do(Wake{Meta: h.meta(), Claim: c.ID}, event.TypeWakeRequested)
			h.do(Release{Meta: h.meta(), Claim: c.ID}, event.TypeClaimReleased)
			h.do(WakeFailed{Meta: h.res(h.intentFor(c.VM, kA)), VM: c.VM}, event.TypeWakeFailed, event.TypeVMDestroyRequested)
		}},
		{"renew moves the deadline and counts as activity", func(t *testing.T, h *harness) {
			h.setup(1)
			c := h.claimWarm(1, kA)
			h.advance(10 * second)
			evs := h.do(Renew{Meta: h.meta(), Claim: c.ID, TTLSeconds: 600}, event.TypeClaimRenewed)
			if p := payload[event.ClaimRenewed](t, evs, 0); p.DeadlineNS != h.now+600*second || p.TTLSeconds != 600 {
				t.Fatalf("%+v", p)
			}
			if cl := h.claim(c.ID); cl.Deadline != h.now+600*second || cl.LastActivity != h.now {
				t.Fatalf("claim %+v", cl)
			}
		}},
		{"touch postpones idle hibernation; stale touch is a no-op", func(t *testing.T, h *harness) {
			h.node()
			h.pools(PoolSpec{PoolKey: kA, Warm: 1, IdleHibernateSeconds: 60})
			h.goldenReady(kA)
			h.fill(kA)
			c := h.claimWarm(1, kA)
			h.advance(30 * second)
			h.do(Touch{Meta: h.meta(), Claim: c.ID}, event.TypeClaimTouched)
			h.do(Touch{Meta: h.meta(), Claim: c.ID}) // same instant
			h.advance(59 * second)
			h.do(Tick{Meta: h.meta()})
			h.advance(second)
			evs := h.do(Tick{Meta: h.meta()}, event.TypeHibernateRequested)
			if payload[event.HibernateRequested](t, evs, 0).Reason != "idle" {
				t.Fatal("not an idle hibernate")
			}
			h.do(Touch{Meta: h.meta(), Claim: c.ID}) // not running: no-op
		}},
		{"failed idle hibernate waits another idle period", func(t *testing.T, h *harness) {
			h.node()
			h.pools(PoolSpec{PoolKey: kA, Warm: 1, IdleHibernateSeconds: 60})
			h.goldenReady(kA)
			h.fill(kA)
			c := h.claimWarm(1, kA)
			h.advance(60 * second)
			h.do(Tick{Meta: h.meta()}, event.TypeHibernateRequested)
			h.do(HibernateFailed{Meta: h.res(h.intentFor(c.VM, kA)), VM: c.VM, Error: "x"}, event.TypeHibernateFailed)
			h.do(Tick{Meta: h.meta()})
			if at, _ := h.s.NextTimer(); at != h.now+60*second {
				t.Fatalf("idle timer at %d, want %d", at, h.now+60*second)
			}
		}},
		{"changing a pool's idle setting re-arms its claims", func(t *testing.T, h *harness) {
			h.setup(1)
			c := h.claimWarm(1, kA)
			h.advance(10 * second)
			h.do(ConfigurePools{Meta: h.meta(), Pools: []PoolSpec{{PoolKey: kA, Warm: 1, IdleHibernateSeconds: 5}}}, event.TypePoolsConfigured)
			h.do(Tick{Meta: h.meta()}, event.TypeHibernateRequested) // last activity was 10 s ago
			if h.claim(c.ID).Status != ClaimHibernating {
				t.Fatal("not hibernating")
			}
		}},
		{"lease expiry reaps running and hibernated claims; expiry beats idle", func(t *testing.T, h *harness) {
			h.node()
			h.pools(PoolSpec{PoolKey: kA, Warm: 2, IdleHibernateSeconds: 10})
			h.goldenReady(kA)
			h.fill(kA)
			h.do(Claim{Meta: h.meta(), ID: claimID(1), Key: kA, TTLSeconds: 20}, T)
			h.do(Claim{Meta: h.meta(), ID: claimID(2), Key: kA, TTLSeconds: 5}, T)
			h.hibernate(claimID(2))
			h.advance(20 * second)
			evs := h.do(Tick{Meta: h.meta()}, event.TypeClaimExpired, event.TypeVMDestroyRequested, event.TypeClaimExpired, event.TypeVMDestroyRequested)
			if evs[0].AggID != claimID(2) || evs[2].AggID != claimID(1) {
				t.Fatalf("expiry order %s %s: earliest deadline first", evs[0].AggID, evs[2].AggID)
			}
			for _, id := range []string{claimID(1), claimID(2)} {
				if c := h.claim(id); c.Status != ClaimExpired || c.Reason != "expired" {
					t.Fatalf("claim %+v", c)
				}
			}
		}},
		{"expiry of a hibernating claim destroys the VM after the hibernate", func(t *testing.T, h *harness) {
			h.setup(1)
			h.do(Claim{Meta: h.meta(), ID: claimID(1), Key: kA, TTLSeconds: 5}, T)
			vm := h.claim(claimID(1)).VM
			h.do(Hibernate{Meta: h.meta(), Claim: claimID(1)}, event.TypeHibernateRequested)
			h.advance(5 * second)
			h.do(Tick{Meta: h.meta()}, event.TypeClaimExpired)
			h.do(HibernateFailed{Meta: h.res(h.intentFor(vm, kA)), VM: vm}, event.TypeHibernateFailed, event.TypeVMDestroyRequested)
		}},
		{"ended claims are forgotten after the retention period", func(t *testing.T, h *harness) {
			h.setup(1)
			c := h.claimWarm(1, kA)
			h.do(Release{Meta: h.meta(), Claim: c.ID}, event.TypeClaimReleased, event.TypeVMDestroyRequested)
			h.advance(ClaimRetentionNS)
			h.do(VMDestroyed{Meta: h.res(h.intentFor(c.VM, kA)), VM: c.VM}, event.TypeVMDestroyed)
			if _, ok := h.s.Claim(c.ID); ok {
				t.Fatal("claim retained past retention")
			}
			h.rejects(Release{Meta: h.meta(), Claim: c.ID}, NotFound)
		}},
		{"failed golden is retried after 30 s", func(t *testing.T, h *harness) {
			h.node()
			h.pools(PoolSpec{PoolKey: kA, Warm: 1})
			evs := h.do(GoldenFailed{Meta: h.res(h.intentFor("", kA)), Key: kA, Error: "boot"}, event.TypeGoldenFailed)
			if payload[event.GoldenFailed](t, evs, 0).RetryAtNS != h.now+GoldenRetryNS {
				t.Fatal("retry time")
			}
			if g, _ := h.s.Golden(kA); g.Status != GoldenBroken || g.Error != "boot" || len(Intents(h.s)) != 0 {
				t.Fatalf("golden %+v", g)
			}
			h.advance(GoldenRetryNS - 1)
			h.do(Tick{Meta: h.meta()})
			h.advance(1)
			evs = h.do(Tick{Meta: h.meta()}, event.TypeGoldenBuildRequested)
			if payload[event.GoldenBuildRequested](t, evs, 0).Reason != "retry" {
				t.Fatal("not a retry")
			}
			h.goldenReady(kA)
		}},
		{"PUT pools drains omitted pools: warm VMs destroyed, claimed left alone", func(t *testing.T, h *harness) {
			h.setup(3)
			c := h.claimWarm(1, kA)
			p, _ := h.s.Pool(kA)
			evs := h.do(ConfigurePools{Meta: h.meta(), Pools: []PoolSpec{{PoolKey: kB, Warm: 1}}},
				event.TypePoolsConfigured, event.TypeVMDestroyRequested, event.TypeVMDestroyRequested, event.TypeGoldenBuildRequested)
			if evs[1].AggID != p.WarmVMs()[0] || payload[event.VMDestroyRequested](t, evs, 1).Reason != "drain" {
				t.Fatalf("drain events %v", evTypes(evs))
			}
			info := h.s.Info()
			if !info.Pools[0].Draining || info.Pools[0].Warm != 0 || info.Pools[0].Target != 0 {
				t.Fatalf("info %+v", info.Pools[0])
			}
			if h.vm(c.VM).Status != VMClaimed || h.claim(c.ID).Status != ClaimRunning {
				t.Fatal("claimed VM touched by the drain")
			}
			// A claim of the removed pool's key is served as the old daemon
			// served a key it no longer pools: from the golden the key
			// still has (clone tier), never from the drain's warm VMs.
			evs = h.do(Claim{Meta: h.meta(), ID: claimID(2), Key: kA}, event.TypeClaimCreated, event.TypeVMCloneRequested)
			if cc := payload[event.ClaimCreated](t, evs, 0); cc.Tier != TierClone.String() || payload[event.VMCloneRequested](t, evs, 1).Cold {
				t.Fatalf("claim of a draining pool's key: %+v", cc)
			}
			if pi := h.s.Info().Pools[0]; !pi.Draining || pi.Target != 0 || pi.Live != 2 {
				t.Fatalf("draining pool after the claim %+v", pi)
			}
			c2 := h.claim(claimID(2))
			h.do(VMCloneFailed{Meta: h.res(h.intentFor(c2.VM, kA)), VM: c2.VM, Error: "no space"}, event.TypeVMCloneFailed, event.TypeClaimFailed)
			// The pool goes away with its last VM.
			for _, vm := range p.WarmVMs()[:2] {
				h.do(VMDestroyed{Meta: h.res(h.intentFor(vm, kA)), VM: vm}, event.TypeVMDestroyed)
			}
			h.do(Release{Meta: h.meta(), Claim: c.ID}, event.TypeClaimReleased, event.TypeVMDestroyRequested)
			h.do(VMDestroyed{Meta: h.res(h.intentFor(c.VM, kA)), VM: c.VM}, event.TypeVMDestroyed)
			if _, ok := h.s.Pool(kA); ok {
				t.Fatal("empty drained pool kept")
			}
			// Once the record is gone nothing owns the golden: it is
			// retired and collected (the store never keeps a drained
			// pool's golden), and a claim of the key is one of a key
			// without a pool, served cold.
			if _, ok := h.s.Golden(kA); ok {
				t.Fatal("a dropped pool's golden is kept")
			}
			if col := collects(h.s); len(col) != 1 {
				t.Fatalf("collections after the drain: %+v", col)
			}
			evs = h.do(Claim{Meta: h.meta(), ID: claimID(3), Key: kA}, event.TypeClaimCreated, event.TypeVMCloneRequested)
			if payload[event.ClaimCreated](t, evs, 0).Tier != TierCold.String() {
				t.Fatal("claim of a dropped pool's key is served from a retired golden")
			}
		}},
		{"a claim of a key without a pool is a cold claim; its failure ends it and drops the record", func(t *testing.T, h *harness) {
			h.setup(1)
			kN := PoolKey{Template: "nope", Net: "none", Size: "small"}
			evs := h.do(Claim{Meta: h.meta(), ID: claimID(1), Key: kN}, event.TypeClaimCreated, event.TypeVMCloneRequested)
			if cc := payload[event.ClaimCreated](t, evs, 0); cc.Tier != TierCold.String() || !payload[event.VMCloneRequested](t, evs, 1).Cold {
				t.Fatalf("claim of an unknown key: %+v", cc)
			}
			p, ok := h.s.Pool(kN)
			if !ok || !p.Draining || p.Spec != (PoolSpec{PoolKey: kN}) || len(RefillsNeeded(h.s)) != 0 {
				t.Fatalf("record of the unknown key: %+v %v", p, ok)
			}
			if _, ok := h.s.Golden(kN); ok {
				t.Fatal("a golden is built for a key no pool has")
			}
			// A second claim of the key while the first is pending: cold too.
			h.do(Claim{Meta: h.meta(), ID: claimID(2), Key: kN}, event.TypeClaimCreated, event.TypeVMCloneRequested)
			c1, c2 := h.claim(claimID(1)), h.claim(claimID(2))
			h.do(VMCloneFailed{Meta: h.res(h.intentFor(c1.VM, kN)), VM: c1.VM, Error: "no template nope"}, event.TypeVMCloneFailed, event.TypeClaimFailed)
			if c := h.claim(c1.ID); c.Status != ClaimFailed || c.Reason != "cold_boot_failed" {
				t.Fatalf("failed cold claim %+v", c)
			}
			if _, ok := h.s.Pool(kN); !ok {
				t.Fatal("record dropped while a claim of the key is pending")
			}
			h.do(VMCloned{Meta: h.res(h.intentFor(c2.VM, kN)), VM: c2.VM}, event.TypeVMCloned, event.TypeClaimServed)
			h.do(Release{Meta: h.meta(), Claim: c2.ID}, event.TypeClaimReleased, event.TypeVMDestroyRequested)
			h.do(VMDestroyed{Meta: h.res(h.intentFor(c2.VM, kN)), VM: c2.VM}, event.TypeVMDestroyed)
			if _, ok := h.s.Pool(kN); ok {
				t.Fatal("record of the unknown key kept after its last claim and VM")
			}
			if info := h.s.Info(); len(info.Pools) != 1 || info.Pools[0].Key != kA {
				t.Fatalf("pools after %+v", info.Pools)
			}
		}},
		{"configuring the key of a claim without a pool turns its record into the pool", func(t *testing.T, h *harness) {
			h.node()
			kN := PoolKey{Template: "nope", Net: "none", Size: "small"}
			h.do(Claim{Meta: h.meta(), ID: claimID(1), Key: kN}, event.TypeClaimCreated, event.TypeVMCloneRequested)
			h.do(ConfigurePools{Meta: h.meta(), Pools: []PoolSpec{{PoolKey: kN, Warm: 1}}}, event.TypePoolsConfigured, event.TypeGoldenBuildRequested)
			if p, _ := h.s.Pool(kN); p.Draining || p.Spec.Warm != 1 || h.s.Info().Pools[0].Live != 1 {
				t.Fatalf("pool %+v", p)
			}
		}},
		{"a refill clone finishing in a drained pool is destroyed", func(t *testing.T, h *harness) {
			h.node()
			h.pools(PoolSpec{PoolKey: kA, Warm: 1})
			h.goldenReady(kA)
			evs := h.do(Refill{Meta: h.meta()}, event.TypeVMCloneRequested)
			h.do(ConfigurePools{Meta: h.meta(), Pools: []PoolSpec{}}, event.TypePoolsConfigured)
			f := h.do(VMCloned{Meta: h.res(h.intentFor(evs[0].AggID, kA)), VM: evs[0].AggID}, event.TypeVMCloned, event.TypeVMDestroyRequested)
			if payload[event.VMDestroyRequested](t, f, 1).Reason != "drain" {
				t.Fatal("wrong reason")
			}
		}},
		{"re-adding a draining pool reactivates it", func(t *testing.T, h *harness) {
			h.setup(1)
			c := h.claimWarm(1, kA)
			h.do(ConfigurePools{Meta: h.meta(), Pools: []PoolSpec{}}, event.TypePoolsConfigured)
			h.do(ConfigurePools{Meta: h.meta(), Pools: []PoolSpec{{PoolKey: kA, Warm: 1}}}, event.TypePoolsConfigured)
			if p, _ := h.s.Pool(kA); p.Draining || !slices.Equal(RefillsNeeded(h.s), []PoolKey{kA}) {
				t.Fatalf("pool %+v", p)
			}
			_ = c
		}},
		{"lowering warm_max trims the oldest warm VMs; late refills are trimmed too", func(t *testing.T, h *harness) {
			h.setup(4)
			h.claimWarm(1, kA)
			h.claimWarm(2, kA)
			p, _ := h.s.Pool(kA)
			old := p.WarmVMs()
			evs := h.do(Refill{Meta: h.meta()}, event.TypeVMCloneRequested, event.TypeVMCloneRequested) // 2 warm + 2 in flight
			f := h.do(ConfigurePools{Meta: h.meta(), Pools: []PoolSpec{{PoolKey: kA, Warm: 1, WarmMax: 1}}},
				event.TypePoolsConfigured, event.TypeVMDestroyRequested, event.TypeVMDestroyRequested)
			if f[1].AggID != old[0] || f[2].AggID != old[1] || payload[event.VMDestroyRequested](t, f, 1).Reason != "trim" {
				t.Fatalf("trimmed %s %s, want the oldest %v", f[1].AggID, f[2].AggID, old)
			}
			// In-flight clones are not cancelled: the first to finish is
			// over warm_max and trimmed, the second stays warm.
			h.do(VMCloned{Meta: h.res(h.intentFor(evs[0].AggID, kA)), VM: evs[0].AggID}, event.TypeVMCloned, event.TypeVMDestroyRequested)
			h.do(VMCloned{Meta: h.res(h.intentFor(evs[1].AggID, kA)), VM: evs[1].AggID}, event.TypeVMCloned)
			if info := h.s.Info().Pools[0]; info.Warm != 1 || info.Refilling != 0 {
				t.Fatalf("info %+v", info)
			}
		}},
		{"VMM exits: warm VM replaced, claimed VM fails its claim, destroying ignored", func(t *testing.T, h *harness) {
			h.setup(2)
			p, _ := h.s.Pool(kA)
			warm := p.WarmVMs()[0]
			c := h.claimWarm(1, kA)
			h.do(VMExited{Meta: h.meta(), VM: warm, Detail: "signal: killed"}, event.TypeVMExited, event.TypeVMDestroyRequested)
			if info := h.s.Info().Pools[0]; info.Warm != 0 || !slices.Equal(RefillsNeeded(h.s), []PoolKey{kA}) {
				t.Fatalf("info %+v", info)
			}
			h.do(VMExited{Meta: h.meta(), VM: warm}) // already destroying
			evs := h.do(VMExited{Meta: h.meta(), VM: c.VM}, event.TypeVMExited, event.TypeClaimFailed, event.TypeVMDestroyRequested)
			if payload[event.ClaimFailed](t, evs, 1).Reason != "vm_exited" {
				t.Fatal("wrong reason")
			}
		}},
		{"limits configured, then idempotent", func(t *testing.T, h *harness) {
			evs := h.do(ConfigureLimits{Meta: h.meta(), MaxClaims: 5, DefaultTenantCap: 2, TenantCaps: map[string]int{"b": 3, "a": 1}}, event.TypeLimitsConfigured)
			if p := payload[event.LimitsConfigured](t, evs, 0); len(p.TenantCaps) != 2 || p.TenantCaps[0].Tenant != "a" {
				t.Fatalf("caps not sorted: %+v", p)
			}
			h.do(ConfigureLimits{Meta: h.meta(), MaxClaims: 5, DefaultTenantCap: 2, TenantCaps: map[string]int{"a": 1, "b": 3}})
			l := h.s.Limits()
			if l.CapFor("a") != 1 || l.CapFor("zz") != 2 || l.CapFor("") != 0 {
				t.Fatalf("limits %+v", l)
			}
		}},
		{"stale and duplicate executor results are refused", func(t *testing.T, h *harness) {
			h.node()
			h.pools(PoolSpec{PoolKey: kA, Warm: 1})
			gin := h.intentFor("", kA)
			h.goldenReady(kA)
			h.rejects(GoldenBuilt{Meta: h.res(gin), Key: kA, SnapshotDir: "d"}, InvalidTransition)
			evs := h.do(Refill{Meta: h.meta()}, event.TypeVMCloneRequested)
			in := h.intentFor(evs[0].AggID, kA)
			h.rejects(VMCloned{Meta: h.meta(), VM: evs[0].AggID}, InvalidTransition) // wrong cause
			h.do(VMCloned{Meta: h.res(in), VM: evs[0].AggID}, event.TypeVMCloned)
			h.rejects(VMCloned{Meta: h.res(in), VM: evs[0].AggID}, InvalidTransition) // already warm
			h.rejects(VMDestroyed{Meta: h.res(in), VM: evs[0].AggID}, InvalidTransition)
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { c.run(t, newHarness(t)) })
	}
}

// Every rejection code, from every command that can produce it.
func TestRejections(t *testing.T) {
	h := newHarness(t)
	h.setup(1)
	h.pools(PoolSpec{PoolKey: kA, Warm: 1}, PoolSpec{PoolKey: kB})
	running := h.claimWarm(1, kA).ID
	h.do(Claim{Meta: h.meta(), ID: claimID(2), Key: kA}, event.TypeClaimCreated, event.TypeVMCloneRequested)
	pending := claimID(2)
	released := h.claimWarm3(h)
	unknownKey := PoolKey{Template: "nope", Net: "none", Size: "small"}
	big := map[string]string{}
	for i := range MaxMetadataKeys + 1 {
		big[claimID(i)] = "v"
	}
	long := string(make([]byte, MaxClaimRef+1))
	cases := []struct {
		name string
		cmd  Command
		code Code
	}{
		{"no op id", Tick{Meta: Meta{Now: h.now}}, Invalid},
		{"no time", Tick{Meta: Meta{Op: event.OpIDFromUint(1, 1)}}, Invalid},
		{"nil command", nil, Invalid},
		{"bad node id", ConfigureNode{Meta: h.meta(), Node: "a b", Instance: "i"}, Invalid},
		{"bad instance id", ConfigureNode{Meta: h.meta(), Node: "a", Instance: ""}, Invalid},
		{"pools: bad template", ConfigurePools{Meta: h.meta(), Pools: []PoolSpec{{PoolKey: PoolKey{Template: "-x", Net: "none", Size: "small"}}}}, Invalid},
		{"pools: bad net", ConfigurePools{Meta: h.meta(), Pools: []PoolSpec{{PoolKey: PoolKey{Template: "x", Net: "all", Size: "small"}}}}, Invalid},
		{"pools: bad size", ConfigurePools{Meta: h.meta(), Pools: []PoolSpec{{PoolKey: PoolKey{Template: "x", Net: "none", Size: "huge"}}}}, Invalid},
		{"pools: listed twice", ConfigurePools{Meta: h.meta(), Pools: []PoolSpec{{PoolKey: kA}, {PoolKey: kA}}}, Invalid},
		{"pools: negative warm", ConfigurePools{Meta: h.meta(), Pools: []PoolSpec{{PoolKey: kA, Warm: -1}}}, Invalid},
		{"pools: warm over max", ConfigurePools{Meta: h.meta(), Pools: []PoolSpec{{PoolKey: kA, Warm: MaxWarm + 1}}}, Invalid},
		{"pools: warm_max below warm", ConfigurePools{Meta: h.meta(), Pools: []PoolSpec{{PoolKey: kA, Warm: 3, WarmMax: 2}}}, Invalid},
		{"pools: negative idle", ConfigurePools{Meta: h.meta(), Pools: []PoolSpec{{PoolKey: kA, IdleHibernateSeconds: -1}}}, Invalid},
		{"pools: too many", ConfigurePools{Meta: h.meta(), Pools: make([]PoolSpec, MaxPools+1)}, Invalid},
		{"pools: too many warm in all", ConfigurePools{Meta: h.meta(), Pools: manyPools(11, MaxWarm)}, Invalid},
		{"limits: negative", ConfigureLimits{Meta: h.meta(), MaxClaims: -1}, Invalid},
		{"limits: empty tenant", ConfigureLimits{Meta: h.meta(), TenantCaps: map[string]int{"": 1}}, Invalid},
		{"limits: negative cap", ConfigureLimits{Meta: h.meta(), TenantCaps: map[string]int{"a": -1}}, Invalid},
		{"claim: bad id", Claim{Meta: h.meta(), ID: "sb_XYZ", Key: kA}, Invalid},
		{"claim: uppercase hex", Claim{Meta: h.meta(), ID: "sb_00000000000000AA", Key: kA}, Invalid},
		{"claim: id in use", Claim{Meta: h.meta(), ID: running, Key: kA}, Invalid},
		{"claim: bad key", Claim{Meta: h.meta(), ID: claimID(90), Key: PoolKey{Template: "x", Net: "none", Size: "tiny"}}, Invalid},
		{"claim: negative ttl", Claim{Meta: h.meta(), ID: claimID(90), Key: kA, TTLSeconds: -1}, Invalid},
		{"claim: ttl over 24 h", Claim{Meta: h.meta(), ID: claimID(90), Key: kA, TTLSeconds: MaxTTLSeconds + 1}, Invalid},
		{"claim: serve timeout", Claim{Meta: h.meta(), ID: claimID(90), Key: kA, ServeTimeoutSeconds: -1}, Invalid},
		{"claim: claim_ref too long", Claim{Meta: h.meta(), ID: claimID(90), Key: kA, ClaimRef: long}, Invalid},
		{"claim: too much metadata", Claim{Meta: h.meta(), ID: claimID(90), Key: kA, Metadata: big}, Invalid},
		{"claim: empty metadata key", Claim{Meta: h.meta(), ID: claimID(90), Key: kA, Metadata: map[string]string{"": "v"}}, Invalid},
		{"claim: unknown pool, bad template", Claim{Meta: h.meta(), ID: claimID(90), Key: PoolKey{Template: "no such!", Net: "none", Size: "small"}}, Invalid},
		{"claim: unknown pool, bad size", Claim{Meta: h.meta(), ID: claimID(90), Key: PoolKey{Template: "nope", Net: "none", Size: "tiny"}}, Invalid},
		{"refill: unknown pool", Refill{Meta: h.meta(), Key: unknownKey}, UnknownPool},
		{"capacity: unknown pool", CapacityFull{Meta: h.meta(), Key: &unknownKey}, UnknownPool},
		{"hibernate: unknown", Hibernate{Meta: h.meta(), Claim: claimID(99)}, NotFound},
		{"hibernate: pending", Hibernate{Meta: h.meta(), Claim: pending}, InvalidTransition},
		{"hibernate: released", Hibernate{Meta: h.meta(), Claim: released}, InvalidTransition},
		{"wake: unknown", Wake{Meta: h.meta(), Claim: claimID(99)}, NotFound},
		{"wake: released", Wake{Meta: h.meta(), Claim: released}, InvalidTransition},
		{"release: unknown", Release{Meta: h.meta(), Claim: claimID(99)}, NotFound},
		{"renew: unknown", Renew{Meta: h.meta(), Claim: claimID(99)}, NotFound},
		{"renew: released", Renew{Meta: h.meta(), Claim: released}, InvalidTransition},
		{"renew: bad ttl", Renew{Meta: h.meta(), Claim: running, TTLSeconds: MaxTTLSeconds + 1}, Invalid},
		{"touch: unknown", Touch{Meta: h.meta(), Claim: claimID(99)}, NotFound},
		{"golden built: unknown key", GoldenBuilt{Meta: h.meta(), Key: unknownKey, SnapshotDir: "d"}, NotFound},
		{"golden built: not building", GoldenBuilt{Meta: h.meta(), Key: kA, SnapshotDir: "d"}, InvalidTransition},
		{"golden failed: not building", GoldenFailed{Meta: h.meta(), Key: kA}, InvalidTransition},
		{"golden built: empty dir", GoldenBuilt{Meta: h.res(h.intentFor("", kB)), Key: kB}, Invalid},
		{"vm cloned: unknown", VMCloned{Meta: h.meta(), VM: "vm-x"}, NotFound},
		{"vm cloned: not cloning", VMCloned{Meta: h.meta(), VM: h.claim(running).VM}, InvalidTransition},
		{"vm clone failed: unknown", VMCloneFailed{Meta: h.meta(), VM: "vm-x"}, NotFound},
		{"hibernate done: not hibernating", HibernateDone{Meta: h.meta(), VM: h.claim(running).VM, SnapshotDir: "s"}, InvalidTransition},
		{"hibernate failed: unknown", HibernateFailed{Meta: h.meta(), VM: "vm-x"}, NotFound},
		{"wake done: not waking", WakeDone{Meta: h.meta(), VM: h.claim(running).VM}, InvalidTransition},
		{"wake failed: unknown", WakeFailed{Meta: h.meta(), VM: "vm-x"}, NotFound},
		{"vm destroyed: not destroying", VMDestroyed{Meta: h.meta(), VM: h.claim(running).VM}, InvalidTransition},
		{"vm exited: unknown", VMExited{Meta: h.meta(), VM: "vm-x"}, NotFound},
		{"vm exited: cloning", VMExited{Meta: h.meta(), VM: h.claim(pending).VM}, InvalidTransition},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := h.rejects(c.cmd, c.code)
			if r.Msg == "" || r.Code.HTTPStatus() < 400 {
				t.Fatalf("rejection %+v", r)
			}
		})
	}
	t.Run("limits", func(t *testing.T) {
		h := newHarness(t)
		h.setup(4)
		h.do(ConfigureLimits{Meta: h.meta(), MaxClaims: 3, DefaultTenantCap: 1, TenantCaps: map[string]int{"big": 2}}, event.TypeLimitsConfigured)
		h.do(Claim{Meta: h.meta(), ID: claimID(1), Key: kA, Tenant: "a"}, event.TypeClaimCreated)
		h.rejects(Claim{Meta: h.meta(), ID: claimID(2), Key: kA, Tenant: "a"}, TooMany)
		h.do(Claim{Meta: h.meta(), ID: claimID(3), Key: kA, Tenant: "big"}, event.TypeClaimCreated)
		h.do(Claim{Meta: h.meta(), ID: claimID(4), Key: kA, Tenant: "big"}, event.TypeClaimCreated)
		r := h.rejects(Claim{Meta: h.meta(), ID: claimID(5), Key: kA}, TooMany) // max_claims
		if r.Code.HTTPStatus() != 429 {
			t.Fatal("not 429")
		}
		h.do(Release{Meta: h.meta(), Claim: claimID(1)}, event.TypeClaimReleased, event.TypeVMDestroyRequested)
		h.do(Claim{Meta: h.meta(), ID: claimID(6), Key: kA, Tenant: "a"}, event.TypeClaimCreated)
	})
	t.Run("node not configured", func(t *testing.T) {
		h := newHarness(t)
		h.pools(PoolSpec{PoolKey: kA, Warm: 1})
		h.rejects(Claim{Meta: h.meta(), ID: claimID(1), Key: kA}, Invalid)
	})
}

// claimWarm3 makes a released claim on kA (refilling first).
func (h *harness) claimWarm3(*harness) string {
	h.fill(kA)
	c := h.claimWarm(3, kA)
	h.do(Release{Meta: h.meta(), Claim: c.ID}, event.TypeClaimReleased, event.TypeVMDestroyRequested)
	return c.ID
}

func TestRejectionStatusAndSentinels(t *testing.T) {
	want := map[Code]int{Invalid: 400, UnknownPool: 400, NotFound: 404, InvalidTransition: 409, Draining: 409, TooMany: 429}
	for c, st := range want {
		if c.HTTPStatus() != st {
			t.Errorf("%s -> %d, want %d", c, c.HTTPStatus(), st)
		}
	}
	err := reject(NotFound, "x")
	if !errors.Is(err, ErrNotFound) || errors.Is(err, ErrTooMany) || err.Error() != "not_found: x" {
		t.Fatalf("sentinels: %v", err)
	}
}

// A large deficit is requested in batches of MaxRefillBatch.
func TestRefillBatches(t *testing.T) {
	h := newHarness(t)
	h.node()
	h.pools(PoolSpec{PoolKey: kA, Warm: MaxRefillBatch + 10})
	h.goldenReady(kA)
	evs, err := Decide(h.s, Refill{Meta: h.meta()})
	if err != nil || len(evs) != MaxRefillBatch {
		t.Fatalf("%d events, %v", len(evs), err)
	}
	for i := range evs {
		if err := Apply(h.s, &evs[i]); err != nil {
			t.Fatal(err)
		}
	}
	if !slices.Equal(RefillsNeeded(h.s), []PoolKey{kA}) {
		t.Fatal("pool still short is not listed")
	}
	evs, _ = Decide(h.s, Refill{Meta: h.meta(), Key: kA})
	if len(evs) != 10 {
		t.Fatalf("second batch %d", len(evs))
	}
}

func manyPools(n, warm int) []PoolSpec {
	var out []PoolSpec
	for i := range n {
		out = append(out, PoolSpec{PoolKey: PoolKey{Template: fmt.Sprint("t", i), Net: "none", Size: "small"}, Warm: warm})
	}
	return out
}
