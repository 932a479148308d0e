package fsm

import (
	"errors"
	"fmt"
	"slices"
)

// Check verifies the state's invariants and that every index Apply maintains
// incrementally equals what the records imply. It costs O(state) and is meant
// for tests, `sbxctl replay --check` and debugging, not for every request.
//
// Invariants: a VM serves at most one live claim, and each live claim's VM
// is in the matching status (pending/cloning, running/claimed or restarting,
// hibernating, hibernated, waking); warm VMs are exactly the warm stacks'
// members and belong to no claim, no draining pool and no draining node;
// every VM's pool exists; a draining pool with no VMs and no live claims is
// gone; the tenant index maps each tenant's token hash to it, one hash per
// tenant.
func (s *State) Check() error {
	var errs []error
	fail := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }

	var claimCount [numClaimStatus]int
	var vmCount [numVMStatus]int
	live := 0
	restartingRunning := 0 // running claims whose VM is restarting
	// Running and hibernated claims whose VM is being checkpointed, or
	// promoted.
	var checkpointing, promoting [numClaimStatus]int
	tenantLive := map[string]int{}
	poolVMs, poolRefill, poolLive := map[PoolKey]int{}, map[PoolKey]int{}, map[PoolKey]int{}
	// Expected timers are checked in place against the heap's index, and
	// counted; the counts must then equal the heaps' sizes.
	nTimers, nPurge := 0, 0
	checkTimer := func(h *timerHeap, k timerKey, at int64) {
		t, ok := h.index[k]
		if !ok || t.at != at || t.idx >= len(h.items) || h.items[t.idx] != t {
			fail("timer %v: armed %v, want at %d", k, ok, at)
		}
	}

	for id, v := range s.vms { //fsm:unordered verification only; errors.Join order is not state
		vmCount[v.Status]++
		poolVMs[v.Key]++
		if isRefill(v) {
			poolRefill[v.Key]++
		}
		_, pending := s.pendingVMs[id]
		if pending != hasIntent(v.Status) {
			fail("VM %s (%s): pending index says %v", id, v.Status, pending)
		}
		if s.pools[v.Key] == nil {
			fail("VM %s: pool %s does not exist", id, v.Key)
		}
		switch v.Status {
		case VMWarm:
			if v.Claim != "" {
				fail("warm VM %s belongs to claim %s", id, v.Claim)
			}
			if s.draining {
				fail("warm VM %s while the node drains", id)
			}
			if p := s.pools[v.Key]; p != nil && p.Draining {
				fail("warm VM %s in draining pool %s", id, v.Key)
			}
		}
		if hasIntent(v.Status) == (v.Op == [16]byte{}) {
			fail("VM %s (%s): op %s", id, v.Status, v.Op)
		}
		if len(v.Restarts) > MaxRestartHistory || !slices.IsSorted(v.Restarts) {
			fail("VM %s: restart history %v", id, v.Restarts)
		}
	}
	if len(s.pendingVMs) != s.vmCountWithIntent() {
		fail("pending VM index has %d entries, %d VMs have intents", len(s.pendingVMs), s.vmCountWithIntent())
	}

	for id, c := range s.claims { //fsm:unordered verification only
		claimCount[c.Status]++
		for _, k := range claimTimerKinds {
			if at, on := s.claimTimer(c, k); on {
				checkTimer(&s.timers, timerKey{kind: k, id: id}, at)
				nTimers++
			}
		}
		if !c.Status.Live() {
			checkTimer(&s.purge, timerKey{kind: tPurge, id: id}, c.Ended+ClaimRetentionNS)
			nPurge++
			continue
		}
		live++
		tenantLive[c.Tenant]++
		poolLive[c.Key]++
		// v.Claim names one claim, so requiring v.Claim == id for every
		// live claim also proves no VM serves two.
		want := claimVMStatus[c.Status]
		v := s.vms[c.VM]
		if v != nil && c.Status == ClaimRunning && v.Status == VMRestarting {
			// A running claim's VM may be restarting after its VMM died.
			want = VMRestarting
			restartingRunning++
		}
		if v != nil && (c.Status == ClaimRunning || c.Status == ClaimHibernated) && v.Status == VMCheckpointing {
			want = VMCheckpointing
			checkpointing[c.Status]++
		}
		if v != nil && (c.Status == ClaimRunning || c.Status == ClaimHibernated) && v.Status == VMPromoting {
			want = VMPromoting
			promoting[c.Status]++
		}
		if v == nil && s.forkChildWaiting(c) {
			// A fork's child gets its VM once the fork's checkpoint is taken.
			continue
		}
		if v == nil || v.Status != want || v.Claim != id {
			fail("claim %s (%s): VM %s is not %s for it", id, c.Status, c.VM, want)
		}
	}
	// Each running (hibernated) claim's VM was checked to be claimed
	// (hibernated) with v.Claim naming it, which maps those claims one to
	// one into such VMs; equal counts make it onto, so no claimed or
	// hibernated VM is without its claim.
	if claimCount[ClaimRunning] != vmCount[VMClaimed]+restartingRunning+checkpointing[ClaimRunning]+promoting[ClaimRunning] ||
		claimCount[ClaimHibernated] != vmCount[VMHibernated]+checkpointing[ClaimHibernated]+promoting[ClaimHibernated] {
		fail("%d running claims for %d claimed VMs (and %d restarting, %d checkpointing, %d promoting), %d hibernated claims for %d hibernated VMs (and %d checkpointing, %d promoting)",
			claimCount[ClaimRunning], vmCount[VMClaimed], restartingRunning, checkpointing[ClaimRunning], promoting[ClaimRunning],
			claimCount[ClaimHibernated], vmCount[VMHibernated], checkpointing[ClaimHibernated], promoting[ClaimHibernated])
	}
	if claimCount != s.claimCount || live != s.live {
		fail("claim counters %v/%d, records say %v/%d", s.claimCount, s.live, claimCount, live)
	}
	if vmCount != s.vmCount {
		fail("VM counters %v, records say %v", s.vmCount, vmCount)
	}
	if len(tenantLive) != len(s.tenantLive) {
		fail("tenant counters %v, records say %v", s.tenantLive, tenantLive)
	}
	for _, t := range sortedKeys(tenantLive) {
		if s.tenantLive[t] != tenantLive[t] {
			fail("tenant %q: %d live, records say %d", t, s.tenantLive[t], tenantLive[t])
		}
	}

	onStack := map[string]bool{}
	for _, k := range sortedPoolKeys(s.pools) {
		p := s.pools[k]
		if p.vms != poolVMs[k] || p.refilling != poolRefill[k] || p.live != poolLive[k] {
			fail("pool %s: counters vms %d refilling %d live %d, records say %d %d %d", k, p.vms, p.refilling, p.live, poolVMs[k], poolRefill[k], poolLive[k])
		}
		if p.Draining && p.vms == 0 && p.live == 0 {
			fail("empty draining pool %s was not dropped", k)
		}
		for _, id := range p.warm {
			if v := s.vms[id]; v == nil || v.Status != VMWarm || v.Key != k || onStack[id] {
				fail("pool %s: warm stack entry %s is not a warm VM of the pool", k, id)
			}
			onStack[id] = true
		}
		_, need := s.needRefill[k]
		_, can := s.canRefill(k)
		if want := can && refillDeficit(p) > 0; need != want {
			fail("pool %s: refill index %v, want %v", k, need, want)
		}
		if p.ParkedUntil != 0 {
			checkTimer(&s.timers, poolTimer(tPark, k), p.ParkedUntil)
			nTimers++
		}
		if at, on := s.goldenTimer(k); on {
			checkTimer(&s.timers, poolTimer(tGolden, k), at)
			nTimers++
		}
	}
	if len(onStack) != vmCount[VMWarm] {
		fail("%d warm VMs, %d on warm stacks", vmCount[VMWarm], len(onStack))
	}
	if len(s.needRefill) > len(s.pools) {
		fail("refill index names %d pools, %d exist", len(s.needRefill), len(s.pools))
	}
	for _, k := range sortedPoolKeys(s.goldens) {
		g := s.goldens[k]
		if _, ok := s.pendingGoldens[k]; ok != (g.Status == GoldenBuilding) {
			fail("golden %s (%s): pending index says %v", k, g.Status, ok)
		}
	}
	if len(s.pendingGoldens) > len(s.goldens) {
		fail("pending golden index has unknown keys")
	}
	if s.nodeParkUntil != 0 {
		checkTimer(&s.timers, timerKey{kind: tPark, id: "*"}, s.nodeParkUntil)
		nTimers++
	}
	checkHeap := func(name string, h *timerHeap, want int) {
		if len(h.items) != want || len(h.index) != want {
			fail("%s: %d armed (%d indexed), records imply %d", name, len(h.items), len(h.index), want)
		}
		// Every expected timer was found through the index at its
		// position; with equal counts, no entry is stray.
		for i, t := range h.items {
			if t.idx != i {
				fail("%s: entry %d mis-indexed", name, i)
			}
			if i > 0 && timerLess(t, h.items[(i-1)/2]) {
				fail("%s: heap order broken at %d", name, i)
			}
		}
	}
	s.checkTenants(fail)
	s.checkRelays(fail)
	s.checkEgress(fail)
	nTimers += s.checkCheckpoints(fail, checkTimer)
	s.checkStore(fail)
	checkHeap("timers", &s.timers, nTimers)
	checkHeap("purge", &s.purge, nPurge)
	s.checkVolumes(fail)
	return errors.Join(errs...)
}

// claimVMStatus is the status a live claim's VM must be in.
var claimVMStatus = [numClaimStatus]VMStatus{ClaimPending: VMCloning, ClaimRunning: VMClaimed, ClaimHibernating: VMHibernating,
	ClaimHibernated: VMHibernated, ClaimWaking: VMWaking}

func (s *State) vmCountWithIntent() int {
	n := 0
	for st := range numVMStatus {
		if hasIntent(st) {
			n += s.vmCount[st]
		}
	}
	return n
}
