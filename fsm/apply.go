package fsm

import (
	"fmt"
	"maps"

	"github.com/sbxlog/sbxlog/eventlog/event"
)

// Apply folds ev into s in place. It reads only the event's type, version,
// aggregate, op id, time and payload (never Seq or Node), so applying an event
// before or after the log sequenced it gives the same state. On error (an
// undecodable payload, or an event that does not fit the state: *ApplyError
// wrapping ErrInconsistent) s is unchanged.
//
// After the event, claims that ended more than ClaimRetentionNS before the
// event's time are forgotten.
func Apply(s *State, ev *event.Event) error {
	p, err := ev.Decode()
	if err != nil {
		return &ApplyError{Seq: ev.Seq, Type: ev.Type.String(), Err: err}
	}
	return ApplyDecoded(s, ev, p)
}

// ApplyDecoded is Apply for an event whose payload is already decoded: p
// must equal what ev.Decode() returns, as DecidePayloads' payloads do
// (every payload fsm builds survives its codec unchanged; the randomized
// test checks that for every event it decides). The engine uses it so a
// command's payloads are encoded once and never decoded on the live path;
// replay decodes them, and replay equivalence pins that both agree.
func ApplyDecoded(s *State, ev *event.Event, p event.Payload) error {
	if p == nil || p.EventType() != ev.Type {
		return &ApplyError{Seq: ev.Seq, Type: ev.Type.String(), Err: fmt.Errorf("payload %T does not belong to a %s event", p, ev.Type)}
	}
	a := applier{s: s, ev: ev, seq: s.applied + 1}
	s.applyOp, s.applySeq = ev.OpID, a.seq
	if err := a.apply(p); err != nil {
		return &ApplyError{Seq: ev.Seq, Type: ev.Type.String(), Err: err}
	}
	s.applied++
	s.purgeDue(ev.Time)
	return nil
}

type applier struct {
	s   *State
	ev  *event.Event
	seq uint64
}

func (a *applier) intentOp() event.OpID { return IntentOp(a.ev.OpID, a.ev.Type, a.ev.AggID) }

func (s *State) purgeDue(now int64) {
	for _, t := range s.purge.due(now) {
		if c := s.claims[t.key.id]; c != nil && !c.Status.Live() {
			s.dropClaim(c)
		}
	}
}

func (a *applier) vm(id string, want ...VMStatus) (*VMRec, error) {
	v := a.s.vms[id]
	if v == nil {
		return nil, inconsistent("no VM %s", id)
	}
	for _, w := range want {
		if v.Status == w {
			return v, nil
		}
	}
	return nil, inconsistent("VM %s is %s, want %v", id, v.Status, want)
}

func (a *applier) claim(id string, want ...ClaimStatus) (*ClaimRec, error) {
	c := a.s.claims[id]
	if c == nil {
		return nil, inconsistent("no claim %s", id)
	}
	for _, w := range want {
		if c.Status == w {
			return c, nil
		}
	}
	return nil, inconsistent("claim %s is %s, want %v", id, c.Status, want)
}

func (a *applier) liveClaim(id string) (*ClaimRec, error) {
	return a.claim(id, ClaimPending, ClaimRunning, ClaimHibernating, ClaimHibernated, ClaimWaking)
}

// claimIf returns v's claim when it is in status want and still holds v;
// results for a VM whose claim ended leave the claim alone.
func (a *applier) claimIf(v *VMRec, want ClaimStatus) *ClaimRec {
	c := a.s.claims[v.Claim]
	if c == nil || c.Status != want || c.VM != v.ID {
		return nil
	}
	return c
}

func (a *applier) apply(p event.Payload) error {
	s, now := a.s, a.ev.Time
	switch p := p.(type) {
	case event.NodeConfigured:
		if p.Node == "" || p.Instance == "" {
			return inconsistent("empty node or instance id")
		}
		s.node, s.instance = p.Node, p.Instance

	case event.PoolsConfigured:
		return a.poolsConfigured(p)

	case event.LimitsConfigured:
		caps := make(map[string]int, len(p.TenantCaps))
		for _, tc := range p.TenantCaps {
			caps[tc.Tenant] = tc.Cap
		}
		if len(caps) == 0 {
			caps = nil
		}
		s.limits = Limits{MaxClaims: p.MaxClaims, DefaultTenantCap: p.DefaultTenantCap, TenantCaps: caps}

	case event.GoldenBuildRequested:
		g := s.goldens[p.Key]
		// A ready golden is rebuilt (RebuildGolden): its dir stays its own
		// until the new one is built.
		if g != nil && (g.Status == GoldenBuilding || g.Status == GoldenReady && p.Reason != "rebuild") {
			return inconsistent("golden %s is %s", p.Key, g.Status)
		}
		if g == nil {
			g = &GoldenRec{Key: p.Key}
			s.goldens[p.Key] = g
		}
		g.Status, g.Op, g.ReqSeq, g.Error, g.RetryAt = GoldenBuilding, a.intentOp(), a.seq, "", 0
		s.pendingGoldens[p.Key] = struct{}{}
		s.syncGoldenTimer(p.Key)
		s.syncRefill(p.Key)

	case event.GoldenBuilt:
		g, err := a.building(p.Key)
		if err != nil {
			return err
		}
		old := g.SnapshotDir
		g.Status, g.Op, g.SnapshotDir = GoldenReady, event.ZeroOpID, p.SnapshotDir
		delete(s.pendingGoldens, p.Key)
		if old != p.SnapshotDir {
			s.retire(old, "golden "+p.Key.String())
		}
		s.syncRefill(p.Key)
		s.syncGoldenOwner(p.Key)

	case event.GoldenFailed:
		g, err := a.building(p.Key)
		if err != nil {
			return err
		}
		g.Status, g.Op, g.Error, g.RetryAt = GoldenBroken, event.ZeroOpID, p.Error, p.RetryAtNS
		delete(s.pendingGoldens, p.Key)
		s.syncGoldenTimer(p.Key)
		s.syncGoldenOwner(p.Key)

	case event.VMCloneRequested:
		if _, dup := s.vms[p.VM]; dup || p.VM == "" {
			return inconsistent("VM id %q already in use", p.VM)
		}
		pool := s.pools[p.Key]
		if pool == nil {
			return inconsistent("VM %s for unknown pool %s", p.VM, p.Key)
		}
		// The record shares the pool's key, the node's ids and its claim's
		// strings instead of keeping its own copies: with 100k VMs that is
		// hundreds of thousands fewer objects for the GC.
		v := &VMRec{ID: p.VM, Key: pool.Spec.PoolKey, Node: s.intern(p.Node, s.node), Instance: s.intern(p.Instance, s.instance),
			RunDir: p.RunDir, Status: VMCloning, Claim: p.Claim, Cold: p.Cold, Op: a.intentOp(), ReqSeq: a.seq, Created: now}
		if c := s.claims[p.Claim]; c != nil && c.VM == p.VM {
			v.ID, v.Claim = c.VM, c.ID
		}
		if err := a.cloneSource(v, p.Checkpoint); err != nil {
			return err
		}
		s.addVM(v)
		// A clone maps its golden's memory for its VMM's life.
		if g := s.goldens[p.Key]; g != nil && g.Status == GoldenReady && !p.Cold {
			s.mapVM(v, g.SnapshotDir)
		}

	case event.VMCloned:
		v, err := a.vm(p.VM, VMCloning)
		if err != nil {
			return err
		}
		s.cloneSettled(v)
		v.Op = event.ZeroOpID
		if v.Claim != "" {
			s.setVMStatus(v, VMClaimed)
			return nil
		}
		s.setVMStatus(v, VMWarm)
		if pool := s.pools[v.Key]; pool != nil {
			s.pushWarm(pool, v)
		}

	case event.VMCloneFailed:
		v, err := a.vm(p.VM, VMCloning)
		if err != nil {
			return err
		}
		s.cloneSettled(v)
		s.dropVM(v)

	case event.VMDestroyRequested:
		v, err := a.vm(p.VM, VMWarm, VMClaimed, VMHibernated, VMArchived)
		if err != nil {
			return err
		}
		if v.Status == VMWarm {
			if pool := s.pools[v.Key]; pool != nil {
				s.removeWarm(pool, v.ID)
			}
		}
		v.Op, v.ReqSeq = a.intentOp(), a.seq
		s.setVMStatus(v, VMDestroying)

	case event.VMDestroyed:
		v, err := a.vm(p.VM, VMDestroying)
		if err != nil {
			return err
		}
		s.dropVM(v)

	case event.VMExited:
		if _, err := a.vm(p.VM, VMWarm, VMClaimed, VMCloning, VMHibernating, VMHibernated, VMWaking, VMDestroying, VMRestarting, VMArchiving, VMArchived, VMUnarchiving); err != nil {
			return err
		}

	case event.VMRestartRequested:
		v, err := a.vm(p.VM, VMClaimed)
		if err != nil {
			return err
		}
		if c := a.claimIf(v, ClaimRunning); c == nil || c.ID != p.Claim {
			return inconsistent("restart of VM %s for claim %s, which it does not serve running", p.VM, p.Claim)
		}
		// A new slice each time: records handed out by VM() share it.
		keep := v.Restarts[max(0, len(v.Restarts)-(MaxRestartHistory-1)):]
		v.Restarts = append(append(make([]int64, 0, len(keep)+1), keep...), now)
		v.Op, v.ReqSeq = a.intentOp(), a.seq
		s.setVMStatus(v, VMRestarting)
		// Its VMM died: the restart boots cold from its own disk.
		s.unmapVM(v)
		// An archiving expiry waits for the VM to be claimed again.
		s.syncClaimTimers(s.claims[p.Claim])

	case event.VMRestarted:
		v, err := a.vm(p.VM, VMRestarting)
		if err != nil {
			return err
		}
		v.Op = event.ZeroOpID
		s.setVMStatus(v, VMClaimed)
		if c := a.claimIf(v, ClaimRunning); c != nil {
			// The restart is activity: the idle timer starts over.
			c.LastActivity = max(c.LastActivity, now)
			s.syncClaimTimers(c)
		}

	case event.VMRestartFailed:
		v, err := a.vm(p.VM, VMRestarting)
		if err != nil {
			return err
		}
		v.Op = event.ZeroOpID
		s.setVMStatus(v, VMClaimed)

	case event.ClaimCreated:
		return a.claimCreated(p)

	case event.ClaimServed:
		c, err := a.claim(p.Claim, ClaimPending)
		if err != nil {
			return err
		}
		if v := s.vms[c.VM]; v == nil || v.Status != VMClaimed || v.Claim != c.ID {
			return inconsistent("claim %s served by VM %s that is not claimed by it", c.ID, c.VM)
		}
		c.LastActivity = now
		s.setClaimStatus(c, ClaimRunning, now)
		a.startVolumes(c)

	case event.ClaimFailed:
		c, err := a.liveClaim(p.Claim)
		if err != nil {
			return err
		}
		c.Reason = p.Reason
		s.setClaimStatus(c, ClaimFailed, now)

	case event.ClaimRenewed:
		c, err := a.liveClaim(p.Claim)
		if err != nil {
			return err
		}
		c.TTLSeconds, c.Deadline = p.TTLSeconds, p.DeadlineNS
		if p.OnExpire != "" {
			c.OnExpireArchive = p.OnExpire == event.OnExpireArchive
		}
		if c.Status == ClaimRunning {
			c.LastActivity = max(c.LastActivity, now)
		}
		s.syncClaimTimers(c)

	case event.ClaimTouched:
		c, err := a.claim(p.Claim, ClaimRunning)
		if err != nil {
			return err
		}
		c.LastActivity = max(c.LastActivity, now)
		s.syncClaimTimers(c)

	case event.ClaimReleased:
		c, err := a.liveClaim(p.Claim)
		if err != nil {
			return err
		}
		c.Reason = "released"
		s.setClaimStatus(c, ClaimReleased, now)

	case event.ClaimExpired:
		c, err := a.liveClaim(p.Claim)
		if err != nil {
			return err
		}
		c.Reason = "expired"
		s.setClaimStatus(c, ClaimExpired, now)

	case event.HibernateRequested:
		c, err := a.claim(p.Claim, ClaimRunning)
		if err != nil {
			return err
		}
		v, err := a.vm(c.VM, VMClaimed)
		if err != nil {
			return err
		}
		v.Op, v.ReqSeq = a.intentOp(), a.seq
		s.setVMStatus(v, VMHibernating)
		s.setClaimStatus(c, ClaimHibernating, now)

	case event.Hibernated:
		v, err := a.vm(p.VM, VMHibernating)
		if err != nil {
			return err
		}
		v.Op, v.SnapshotDir = event.ZeroOpID, p.SnapshotDir
		s.setVMStatus(v, VMHibernated)
		s.unmapVM(v) // its VMM is stopped
		if c := a.claimIf(v, ClaimHibernating); c != nil {
			s.setClaimStatus(c, ClaimHibernated, now)
		}

	case event.HibernateFailed:
		v, err := a.vm(p.VM, VMHibernating)
		if err != nil {
			return err
		}
		v.Op = event.ZeroOpID
		s.setVMStatus(v, VMClaimed)
		if c := a.claimIf(v, ClaimHibernating); c != nil {
			// The idle timer restarts from now, so a failing idle
			// hibernate is retried after another idle period, not at
			// every Tick; a failing hibernate at an archiving expiry
			// after ArchiveRetryNS.
			c.LastActivity = max(c.LastActivity, now)
			if c.Deadline <= now {
				c.ArchiveRetryAt = now + ArchiveRetryNS
			}
			s.setClaimStatus(c, ClaimRunning, now)
		}

	case event.WakeRequested:
		c, err := a.claim(p.Claim, ClaimHibernated)
		if err != nil {
			return err
		}
		v, err := a.vm(c.VM, VMHibernated)
		if err != nil {
			return err
		}
		v.Op, v.ReqSeq = a.intentOp(), a.seq
		s.setVMStatus(v, VMWaking)
		s.setClaimStatus(c, ClaimWaking, now)

	case event.Woken:
		v, err := a.vm(p.VM, VMWaking)
		if err != nil {
			return err
		}
		v.Op = event.ZeroOpID
		s.setVMStatus(v, VMClaimed)
		if c := a.claimIf(v, ClaimWaking); c != nil {
			c.LastActivity = max(c.LastActivity, now)
			if c.OnExpireArchive && c.Deadline <= now {
				// Woken between an archiving expiry's hibernate and its
				// archive: a fresh lease, as a wake from the archive.
				c.Deadline = now + c.TTLSeconds*second
			}
			s.setClaimStatus(c, ClaimRunning, now)
		}

	case event.WakeFailed:
		v, err := a.vm(p.VM, VMWaking)
		if err != nil {
			return err
		}
		v.Op = event.ZeroOpID
		s.setVMStatus(v, VMHibernated)
		if c := a.claimIf(v, ClaimWaking); c != nil {
			s.setClaimStatus(c, ClaimHibernated, now)
		}

	case event.PoolParked:
		if p.Key == nil {
			s.nodeParkUntil, s.nodeParkReason = p.UntilNS, p.Reason
			s.timers.set(timerKey{kind: tPark, id: "*"}, p.UntilNS)
			s.syncAllRefills()
			return nil
		}
		pool := s.pools[*p.Key]
		if pool == nil {
			return inconsistent("park of unknown pool %s", *p.Key)
		}
		pool.ParkedUntil, pool.ParkReason = p.UntilNS, p.Reason
		s.timers.set(poolTimer(tPark, *p.Key), p.UntilNS)
		s.syncRefill(*p.Key)

	case event.PoolUnparked:
		if p.Key == nil {
			s.nodeParkUntil, s.nodeParkReason = 0, ""
			s.timers.remove(timerKey{kind: tPark, id: "*"})
			s.syncAllRefills()
			return nil
		}
		if pool := s.pools[*p.Key]; pool != nil {
			pool.ParkedUntil, pool.ParkReason = 0, ""
			s.syncRefill(*p.Key)
		}
		s.timers.remove(poolTimer(tPark, *p.Key))

	case event.TenantPut:
		return a.tenantPut(p)

	case event.TenantRemoved:
		return a.tenantRemoved(p)

	case event.NodeDrained:
		return a.setDraining(true)

	case event.EgressPoolSet:
		return a.egressPoolSet(p)

	case event.EgressClassPut:
		return a.egressClassPut(p)

	case event.EgressClassRemoved:
		return a.egressClassRemoved(p)

	case event.ClaimEnvChanged:
		return a.claimEnvChanged(p)

	case event.EgressUsage:
		// Usage is the journal's; the state does not change.

	case event.NodeUncordoned:
		return a.setDraining(false)

	case event.RelayOpened:
		return a.relayOpened(p)

	case event.RelayClosed:
		return a.relayClosed(p)

	case event.CheckpointRequested:
		return a.checkpointRequested(p)

	case event.CheckpointTaken:
		return a.checkpointTaken(p)

	case event.CheckpointFailed:
		return a.checkpointFailed(p)

	case event.CheckpointDeleteRequested:
		return a.checkpointDeleteRequested(p)

	case event.CheckpointDeleted:
		return a.checkpointDeleted(p)
	case event.PromoteRequested:
		return a.promoteRequested(p)

	case event.Promoted:
		return a.promoted(p)

	case event.PromoteFailed:
		return a.promoteFailed(p)

	case event.TemplateDeleted:
		return a.templateDeleted(p)

	case event.TemplateLabelsSet:
		return a.templateLabelsSet(p)

	case event.SnapshotCollected:
		return a.snapshotCollected(p)
	case event.VolumesConfigured:
		return a.volumesConfigured(p)
	case event.VolumeAttachRequested:
		return a.volumeAttachRequested(p)
	case event.VolumeAttached:
		return a.volumeSettled(p.Claim, p.Volume, VolumeAttaching, true, VolumeAttached)
	case event.VolumeAttachFailed:
		return a.volumeSettled(p.Claim, p.Volume, VolumeAttaching, false, 0)
	case event.VolumeDetachRequested:
		return a.volumeDetachRequested(p)
	case event.VolumeDetached:
		return a.volumeSettled(p.Claim, p.Volume, VolumeDetaching, false, 0)
	case event.VolumeDetachFailed:
		return a.volumeSettled(p.Claim, p.Volume, VolumeDetaching, true, VolumeAttached)

	default:
		if ok, err := a.applyArchive(p); ok {
			return err
		}
		if ok, err := a.applyCheckpointImport(p); ok {
			return err
		}
		return inconsistent("no state transition for %T", p)
	}
	return nil
}

// intern returns known when v equals it, so equal strings share memory.
func (s *State) intern(v, known string) string {
	if v == known {
		return known
	}
	return v
}

func (a *applier) building(k PoolKey) (*GoldenRec, error) {
	g := a.s.goldens[k]
	if g == nil || g.Status != GoldenBuilding {
		return nil, inconsistent("golden %s is not building", k)
	}
	return g, nil
}

func (a *applier) poolsConfigured(p event.PoolsConfigured) error {
	s := a.s
	keep := make(map[PoolKey]PoolSpec, len(p.Pools))
	for _, sp := range p.Pools {
		if _, dup := keep[sp.PoolKey]; dup {
			return inconsistent("pool %s listed twice", sp.PoolKey)
		}
		keep[sp.PoolKey] = sp
	}
	idleChanged := map[PoolKey]bool{}
	for k, pool := range s.pools { //fsm:unordered each pool is updated on its own
		if _, ok := keep[k]; !ok && !pool.Draining {
			pool.Draining = true
		}
	}
	for _, sp := range p.Pools {
		pool := s.pools[sp.PoolKey]
		if pool == nil {
			s.pools[sp.PoolKey] = &PoolRec{Spec: sp}
			continue
		}
		if pool.Spec.IdleHibernateSeconds != sp.IdleHibernateSeconds || pool.Spec.ArchiveAfterSeconds != sp.ArchiveAfterSeconds {
			idleChanged[sp.PoolKey] = true
		}
		pool.Spec, pool.Draining = sp, false
	}
	if len(idleChanged) > 0 {
		// O(claims), but only when an idle setting changes.
		for _, c := range s.claims { //fsm:unordered each claim's timers are set on their own
			if idleChanged[c.Key] {
				s.syncClaimTimers(c)
			}
		}
	}
	for _, k := range sortedPoolKeys(s.pools) {
		s.syncRefill(k)
		s.syncGoldenTimer(k)
		s.maybeDropPool(k)
	}
	return nil
}

func (a *applier) claimCreated(p event.ClaimCreated) error {
	s, now := a.s, a.ev.Time
	if _, dup := s.claims[p.Claim]; dup || p.Claim == "" {
		return inconsistent("claim id %q already in use", p.Claim)
	}
	tier, ok := parseTier(p.Tier)
	if !ok {
		return inconsistent("claim %s: unknown tier %q", p.Claim, p.Tier)
	}
	pool := s.pools[p.Key]
	if pool == nil {
		if tier == TierWarm {
			return inconsistent("warm claim %s on unknown pool %s", p.Claim, p.Key)
		}
		// A claim of a key no pool has: a draining record holds its
		// counters and its VM, and goes with the last of them.
		pool = &PoolRec{Spec: PoolSpec{PoolKey: p.Key}, Draining: true}
		s.pools[p.Key] = pool
	}
	c := &ClaimRec{ID: p.Claim, Key: pool.Spec.PoolKey, VM: p.VM, Tenant: p.Tenant, ClaimRef: p.ClaimRef, Metadata: maps.Clone(p.Metadata),
		Tier: tier, Status: ClaimPending, TTLSeconds: p.TTLSeconds, Deadline: p.DeadlineNS, ServeBy: p.ServeByNS,
		TokenGen: p.TokenGen, Created: now,
		EgressClass: p.EgressClass, NoEgress: p.NoEgress, Unpooled: p.PolicyLayer == PolicyUnpooled, Env: p.Env,
		OnExpireArchive: p.OnExpire == event.OnExpireArchive}
	if len(c.Metadata) == 0 {
		c.Metadata = nil
	}
	if tier == TierWarm {
		n := len(pool.warm)
		if n == 0 || pool.warm[n-1] != p.VM {
			return inconsistent("claim %s: VM %s is not the newest warm VM of %s", p.Claim, p.VM, p.Key)
		}
		v, err := a.vm(p.VM, VMWarm)
		if err != nil {
			return err
		}
		pool.warm = pool.warm[:n-1]
		v.Claim, c.VM = c.ID, v.ID
		s.setVMStatus(v, VMClaimed)
		c.Status, c.LastActivity = ClaimRunning, now
	} else if _, used := s.vms[p.VM]; used {
		return inconsistent("claim %s: new VM id %s already in use", p.Claim, p.VM)
	}
	if err := a.forkChild(c, p.Fork); err != nil {
		return err
	}
	c.FromCheckpoint = p.FromCheckpoint
	s.addClaim(c)
	s.setClaimVolumes(c, claimVolumesOf(p.Volumes))
	if c.Status == ClaimRunning {
		a.startVolumes(c)
	}
	return nil
}
