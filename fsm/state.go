package fsm

import (
	"slices"
	"strings"

	"github.com/sbxlog/sbxlog/eventlog/event"
)

// State is the state machine's state. The zero value is not usable; call New.
// It is not safe for concurrent use: the daemon serialises Decide and Apply.
type State struct {
	node, instance string
	limits         Limits
	nodeParkUntil  int64
	nodeParkReason string
	pools          map[PoolKey]*PoolRec
	goldens        map[PoolKey]*GoldenRec
	vms            map[string]*VMRec
	claims         map[string]*ClaimRec
	tenants        map[string]*TenantRec
	egressClasses  map[string]*EgressClassRec
	// tenantsAPI: the API has changed the tenant set (the config's
	// tenants no longer apply); classesAPI the same for egress classes;
	// draining: the node drains.
	tenantsAPI bool
	classesAPI bool
	draining   bool
	relays     map[string]*RelayRec // open relays by id
	// checkpoints by id (checkpoint.go).
	checkpoints map[string]*CheckpointRec
	// The store (store.go, templates.go): promoted templates, promotes in
	// flight by VM, retired snapshot dirs.
	templates map[PoolKey]*TemplateRec
	promotes  map[string]*PromoteRec
	retired   map[string]*RetiredRec
	volumes   map[string]*VolumeSpec // the volume catalog
	// applied counts events applied so far; it orders intents (ReqSeq).
	applied uint64

	// Indexes derived from the records above, rebuilt by Decode.
	timers         timerHeap // serve, TTL, idle, golden retry, park
	purge          timerHeap // forgetting ended claims
	pendingVMs     map[string]struct{}
	pendingGoldens map[PoolKey]struct{}
	pendingCks     map[string]struct{} // checkpoints being taken or deleted
	needRefill     map[PoolKey]struct{}
	claimCount     [numClaimStatus]int
	vmCount        [numVMStatus]int
	live           int
	tenantLive     map[string]int
	tenantByHash   map[[32]byte]string     // token hash -> tenant name
	relaysOf       map[string][]string     // claim -> its open relay ids, sorted
	mapped         map[string]int          // store dir -> VMs mapping it
	collectBy      map[event.OpID][]string // due collections by the op that made them due
	// applyOp and applySeq are the op and sequence of the event Apply is
	// folding in (transient): a collection made due stamps them.
	applyOp     event.OpID
	applySeq    uint64
	volHolds    map[string]volumeHold // volume -> the claims holding it
	pendingVols map[string]struct{}   // claims with a volume attach or detach in flight
}

// New returns an empty state.
func New() *State {
	return &State{
		pools:          map[PoolKey]*PoolRec{},
		goldens:        map[PoolKey]*GoldenRec{},
		vms:            map[string]*VMRec{},
		claims:         map[string]*ClaimRec{},
		relays:         map[string]*RelayRec{},
		relaysOf:       map[string][]string{},
		pendingVMs:     map[string]struct{}{},
		pendingGoldens: map[PoolKey]struct{}{},
		pendingCks:     map[string]struct{}{},
		checkpoints:    map[string]*CheckpointRec{},
		needRefill:     map[PoolKey]struct{}{},
		tenantLive:     map[string]int{},
		tenants:        map[string]*TenantRec{},
		tenantByHash:   map[[32]byte]string{},
		egressClasses:  map[string]*EgressClassRec{},
		templates:      map[PoolKey]*TemplateRec{},
		promotes:       map[string]*PromoteRec{},
		retired:        map[string]*RetiredRec{},
		mapped:         map[string]int{},
		collectBy:      map[event.OpID][]string{},
		volumes:        map[string]*VolumeSpec{},
		volHolds:       map[string]volumeHold{},
		pendingVols:    map[string]struct{}{},
	}
}

// Node returns the configured node id.
func (s *State) Node() string { return s.node }

// Instance returns the configured instance id.
func (s *State) Instance() string { return s.instance }

// Limits returns the claim limits.
func (s *State) Limits() Limits { return s.limits }

// Applied returns how many events have been applied.
func (s *State) Applied() uint64 { return s.applied }

// LiveClaims returns the number of live claims (what max_claims bounds).
func (s *State) LiveClaims() int { return s.live }

// TenantLive returns tenant's live claims.
func (s *State) TenantLive(tenant string) int { return s.tenantLive[tenant] }

// NextTimer returns when the earliest timer is due, so the caller can send a
// Tick then; false when no timer is armed.
func (s *State) NextTimer() (int64, bool) { return s.timers.nextAt() }

// Pool returns pool k's record.
func (s *State) Pool(k PoolKey) (PoolRec, bool) {
	p, ok := s.pools[k]
	if !ok {
		return PoolRec{}, false
	}
	return p.copy(), true
}

// copy returns p with its own warm stack, so a caller's copy does not change
// under it.
func (p *PoolRec) copy() PoolRec {
	cp := *p
	cp.warm = slices.Clone(p.warm)
	return cp
}

// Pools returns every pool record (draining ones included), sorted by key.
func (s *State) Pools() []PoolRec {
	out := make([]PoolRec, 0, len(s.pools))
	for _, k := range sortedPoolKeys(s.pools) {
		out = append(out, s.pools[k].copy())
	}
	return out
}

// Golden returns the golden record of k.
func (s *State) Golden(k PoolKey) (GoldenRec, bool) {
	g, ok := s.goldens[k]
	if !ok {
		return GoldenRec{}, false
	}
	return *g, true
}

// VM returns VM id's record. Gone and failed VMs are not in State.
func (s *State) VM(id string) (VMRec, bool) {
	v, ok := s.vms[id]
	if !ok {
		return VMRec{}, false
	}
	return *v, true
}

// VMIDs returns every VM id, sorted.
func (s *State) VMIDs() []string { return sortedKeys(s.vms) }

// Claim returns claim id's record. Ended claims stay for ClaimRetentionNS.
func (s *State) Claim(id string) (ClaimRec, bool) {
	c, ok := s.claims[id]
	if !ok {
		return ClaimRec{}, false
	}
	return *c, true
}

// ClaimIDs returns every claim id, sorted.
func (s *State) ClaimIDs() []string { return sortedKeys(s.claims) }

// Info is the summary behind GET /v1/info.
type Info struct {
	Pools []PoolInfo
	// Claims counts claims by status (index ClaimStatus; ended ones only
	// while retained); Live is the sum of the live ones.
	Claims [numClaimStatus]int
	Live   int
	// VMs counts VM records by status (index VMStatus).
	VMs [numVMStatus]int
	// AtCapacity: the whole node is parked at capacity.
	AtCapacity bool
}

// Count returns the number of claims with status st.
func (i *Info) Count(st ClaimStatus) int { return i.Claims[st] }

// CountVMs returns the number of VMs with status st.
func (i *Info) CountVMs(st VMStatus) int { return i.VMs[st] }

// PoolInfo is one pool's line of Info.
type PoolInfo struct {
	Key        PoolKey
	Warm       int // warm VMs ready to claim
	Refilling  int // refill clones in flight (they count toward Target)
	Target     int // the warm target (0 while the pool or the node drains)
	WarmMax    int
	Golden     GoldenStatus
	Draining   bool
	AtCapacity bool // refills parked because the pool or node is full
	Parked     bool // refills parked for any reason
	VMs        int  // VM records of the pool, any status
	Live       int  // live claims of the pool
}

// Info returns the per-pool and per-status counts. It costs O(pools).
func (s *State) Info() Info {
	in := Info{Claims: s.claimCount, VMs: s.vmCount, Live: s.live, AtCapacity: s.nodeParkUntil != 0 && s.nodeParkReason == ParkCapacity}
	for _, k := range sortedPoolKeys(s.pools) {
		p := s.pools[k]
		pi := PoolInfo{Key: k, Warm: len(p.warm), Refilling: p.refilling, Target: p.Spec.Warm, WarmMax: p.Spec.WarmMax,
			Draining: p.Draining, VMs: p.vms, Live: p.live,
			AtCapacity: in.AtCapacity || (p.ParkedUntil != 0 && p.ParkReason == ParkCapacity),
			Parked:     s.nodeParkUntil != 0 || p.ParkedUntil != 0}
		if p.Draining || s.draining {
			pi.Target = 0
		}
		if g, ok := s.goldens[k]; ok {
			pi.Golden = g.Status
		}
		in.Pools = append(in.Pools, pi)
	}
	return in
}

// --- index maintenance -------------------------------------------------------

func (s *State) addClaim(c *ClaimRec) {
	s.claims[c.ID] = c
	s.claimCount[c.Status]++
	if c.Status.Live() {
		s.liveDelta(c, 1)
	}
	s.syncClaimTimers(c)
}

// setClaimStatus moves c to st, keeping counters and timers in step. An
// ended claim gets its purge timer.
func (s *State) setClaimStatus(c *ClaimRec, st ClaimStatus, now int64) {
	if c.Status == st {
		return
	}
	wasLive := c.Status.Live()
	s.claimCount[c.Status]--
	c.Status = st
	s.claimCount[st]++
	if wasLive && !st.Live() {
		s.liveDelta(c, -1)
		c.Ended = now
		// The env (its sealed secrets) goes with the claim.
		c.Env = nil
		s.purge.set(timerKey{kind: tPurge, id: c.ID}, now+ClaimRetentionNS)
		s.syncClaimTimers(c)
		s.releaseVolumes(c)
		s.maybeDropPool(c.Key)
		return
	}
	s.syncClaimTimers(c)
}

func (s *State) liveDelta(c *ClaimRec, d int) {
	s.live += d
	if n := s.tenantLive[c.Tenant] + d; n == 0 {
		delete(s.tenantLive, c.Tenant)
	} else {
		s.tenantLive[c.Tenant] = n
	}
	if p := s.pools[c.Key]; p != nil {
		p.live += d
	}
}

func (s *State) dropClaim(c *ClaimRec) {
	s.claimCount[c.Status]--
	if c.Status.Live() {
		s.liveDelta(c, -1)
	}
	for _, k := range claimTimerKinds {
		s.timers.remove(timerKey{kind: k, id: c.ID})
	}
	s.purge.remove(timerKey{kind: tPurge, id: c.ID})
	s.setClaimVolumes(c, nil)
	delete(s.claims, c.ID)
}

// claimTimerKinds are the timers a claim may have armed.
var claimTimerKinds = [...]timerKind{tServe, tTTL, tIdle}

// claimTimer returns when c's timer of kind k should fire, and false when
// c's status arms no such timer. It is the single definition used by Apply,
// Decode and Check.
func (s *State) claimTimer(c *ClaimRec, k timerKind) (int64, bool) {
	switch k {
	case tServe:
		return c.ServeBy, c.Status == ClaimPending
	case tTTL:
		return c.Deadline, c.Status.Live() && c.Status != ClaimPending
	case tIdle:
		// An open relay holds the idle clock.
		if c.Status != ClaimRunning || s.hasRelays(c.ID) {
			return 0, false
		}
		if p := s.pools[c.Key]; p != nil && p.Spec.IdleHibernateSeconds > 0 {
			return c.LastActivity + p.Spec.IdleHibernateSeconds*second, true
		}
	}
	return 0, false
}

// syncClaimTimers arms exactly the timers c's status calls for.
func (s *State) syncClaimTimers(c *ClaimRec) {
	for _, k := range claimTimerKinds {
		at, on := s.claimTimer(c, k)
		s.armIf(timerKey{kind: k, id: c.ID}, on, at)
	}
}

func (s *State) armIf(k timerKey, on bool, at int64) {
	if on {
		s.timers.set(k, at)
	} else {
		s.timers.remove(k)
	}
}

func isRefill(v *VMRec) bool { return v.Status == VMCloning && v.Claim == "" }

func (s *State) addVM(v *VMRec) {
	s.vms[v.ID] = v
	s.vmCount[v.Status]++
	if hasIntent(v.Status) {
		s.pendingVMs[v.ID] = struct{}{}
	}
	if p := s.pools[v.Key]; p != nil {
		p.vms++
		if isRefill(v) {
			p.refilling++
		}
	}
	s.syncRefill(v.Key)
}

// setVMStatus moves v to st, keeping counters and the pending-intent index
// in step. Warm-stack membership is the caller's.
func (s *State) setVMStatus(v *VMRec, st VMStatus) {
	p := s.pools[v.Key]
	if p != nil && isRefill(v) {
		p.refilling--
	}
	s.vmCount[v.Status]--
	v.Status = st
	s.vmCount[st]++
	if hasIntent(st) {
		s.pendingVMs[v.ID] = struct{}{}
	} else {
		delete(s.pendingVMs, v.ID)
	}
	if p != nil && isRefill(v) {
		p.refilling++
	}
	s.syncRefill(v.Key)
}

func (s *State) dropVM(v *VMRec) {
	p := s.pools[v.Key]
	if p != nil {
		if isRefill(v) {
			p.refilling--
		}
		p.vms--
	}
	s.vmCount[v.Status]--
	delete(s.pendingVMs, v.ID)
	delete(s.vms, v.ID)
	s.unmapVM(v)
	if v.Claim != "" {
		s.releaseVolumes(s.claims[v.Claim])
	}
	s.syncRefill(v.Key)
	s.maybeDropPool(v.Key)
}

// maybeDropPool forgets a draining pool once its last VM is gone.
func (s *State) maybeDropPool(k PoolKey) {
	p := s.pools[k]
	if p == nil || !p.Draining || p.vms > 0 || p.live > 0 {
		return
	}
	delete(s.pools, k)
	delete(s.needRefill, k)
	s.timers.remove(poolTimer(tPark, k))
	s.syncGoldenTimer(k)
	s.syncGoldenOwner(k)
}

// refillDeficit is how many refill clones pool k lacks, ignoring parking
// and the golden.
func refillDeficit(p *PoolRec) int {
	if p.Draining {
		return 0
	}
	return p.Spec.Warm - len(p.warm) - p.refilling
}

func (s *State) canRefill(k PoolKey) (*PoolRec, bool) {
	p := s.pools[k]
	if p == nil || p.Draining || s.draining || p.ParkedUntil != 0 || s.nodeParkUntil != 0 {
		return p, false
	}
	g := s.goldens[k]
	return p, g != nil && g.Status == GoldenReady
}

func (s *State) syncRefill(k PoolKey) {
	p, ok := s.canRefill(k)
	if ok && refillDeficit(p) > 0 {
		s.needRefill[k] = struct{}{}
	} else {
		delete(s.needRefill, k)
	}
}

func (s *State) syncAllRefills() {
	for k := range s.pools { //fsm:unordered each key is updated independently
		s.syncRefill(k)
	}
}

// goldenTimer returns when the failed golden of k is retried, and false
// when no retry is due (not failed, or its pool is gone or draining).
func (s *State) goldenTimer(k PoolKey) (int64, bool) {
	g, p := s.goldens[k], s.pools[k]
	if g == nil || g.Status != GoldenBroken || p == nil || p.Draining {
		return 0, false
	}
	return g.RetryAt, true
}

// syncGoldenTimer arms the retry of a failed golden while its pool is active.
func (s *State) syncGoldenTimer(k PoolKey) {
	at, on := s.goldenTimer(k)
	s.armIf(poolTimer(tGolden, k), on, at)
}

// pushWarm puts v on top of its pool's LIFO stack.
func (s *State) pushWarm(p *PoolRec, v *VMRec) {
	p.warm = append(p.warm, v.ID)
	s.syncRefill(v.Key)
}

// removeWarm takes id out of p's stack wherever it is (O(warm)).
func (s *State) removeWarm(p *PoolRec, id string) bool {
	for i := len(p.warm) - 1; i >= 0; i-- {
		if p.warm[i] == id {
			p.warm = slices.Delete(p.warm, i, i+1)
			s.syncRefill(p.Spec.Key())
			return true
		}
	}
	return false
}

// runDir is a VM's run dir relative to the executors' runs root; the
// instance id leads it so ownership is visible on disk.
func runDir(instance, vm string) string {
	var b strings.Builder
	b.Grow(len(instance) + 1 + len(vm))
	b.WriteString(instance)
	b.WriteByte('/')
	b.WriteString(vm)
	return b.String()
}
