package fsm

import (
	"bytes"
	"fmt"
	"reflect"
	"slices"

	"github.com/sbxlog/sbxlog/eventlog/event"
	"github.com/sbxlog/sbxlog/fsm/egress"
)

// Decide checks cmd against s and returns the events recording its outcome,
// all carrying cmd's op id, cause and time. A command the state does not
// allow returns a *Rejection and no events; a command already satisfied
// returns neither. Decide never changes s. Any other error is a bug (an
// event that would not encode), never a property of the input.
func Decide(s *State, cmd Command) ([]event.Event, error) {
	evs, _, err := DecidePayloads(s, cmd)
	return evs, err
}

// DecidePayloads is Decide that also returns each event's payload as Decide
// built it (ps[i] is evs[i]'s), so a proposer can apply the events with
// ApplyDecoded instead of decoding what was just encoded.
func DecidePayloads(s *State, cmd Command) (evs []event.Event, ps []event.Payload, err error) {
	if cmd == nil {
		return nil, nil, reject(Invalid, "no command")
	}
	m := cmd.meta()
	if m.Op == event.ZeroOpID {
		return nil, nil, reject(Invalid, "command without an op id")
	}
	if m.Now <= 0 {
		return nil, nil, reject(Invalid, "command without a time")
	}
	if !ownCommand(cmd) {
		return nil, nil, reject(Invalid, "unknown command %T", cmd)
	}
	d := &decider{s: s, m: m}
	err = cmd.decide(d)
	if err == nil {
		err = d.err
	}
	if err != nil {
		return nil, nil, err
	}
	return d.evs, d.ps, nil
}

// fsmPkg is this package's import path.
var fsmPkg = reflect.TypeFor[Meta]().PkgPath()

// ownCommand reports whether cmd's type is one of this package's commands
// (T or *T). Command is sealed, but a type elsewhere that embeds a command
// struct would inherit its decide method; it is refused rather than decided
// as the command it wraps, which it may not mean to be.
func ownCommand(cmd Command) bool {
	t := reflect.TypeOf(cmd)
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return t.PkgPath() == fsmPkg
}

// decider is the state of one decision: each command's decide method checks
// the command against s and emits its events here.
type decider struct {
	s   *State
	m   Meta
	evs []event.Event
	ps  []event.Payload // evs[i]'s payload, as built
	err error           // an event that failed to encode (a bug)
	// vmN counts the VM ids derived so far; handed lists them when a
	// decision hands out more than one.
	vmN    int
	handed map[string]bool
}

func (d *decider) emit(p event.Payload, aggID string) {
	if d.err != nil {
		return
	}
	ev, err := event.New(p, aggID, d.m.Op, d.m.Cause, d.m.Now)
	if err != nil {
		d.err = fmt.Errorf("fsm: build %s event: %w", p.EventType(), err)
		return
	}
	if bytes.Contains(ev.Payload, escapedReplacement) {
		// The codec replaced invalid UTF-8 (an error text cut mid-rune, a
		// file name) by an escaped U+FFFD: the payload as built differs
		// from the one the log holds, so hand out the decoded one. Rare;
		// everything else round-trips as built.
		if p, err = ev.Decode(); err != nil {
			d.err = fmt.Errorf("fsm: %s event does not decode: %w", ev.Type, err)
			return
		}
	}
	d.evs = append(d.evs, ev)
	d.ps = append(d.ps, p)
}

// escapedReplacement is how encoding/json writes the U+FFFD it puts in
// place of invalid UTF-8 (a literal U+FFFD it writes raw).
var escapedReplacement = []byte(`\ufffd`)

// newVMID returns the next VM id derived from the command's op id that no VM
// in state and no earlier id of this decision uses.
func (d *decider) newVMID() string {
	for {
		id := VMID(d.m.Op, d.vmN)
		d.vmN++
		if _, used := d.s.vms[id]; used || d.handed[id] {
			continue
		}
		if d.handed == nil {
			d.handed = map[string]bool{}
		}
		d.handed[id] = true
		return id
	}
}

// cloneRequest requests VM vm of key k for claim ("" for a refill): cloned
// from checkpoint ck when set, else from k's golden, or cold-booted when
// cold.
func (d *decider) cloneRequest(vm string, k PoolKey, claim string, cold bool, ck string) {
	d.emit(event.VMCloneRequested{VM: vm, Key: k, Node: d.s.node, Instance: d.s.instance,
		RunDir: runDir(d.s.instance, vm), Claim: claim, Cold: cold, Checkpoint: ck}, vm)
}

func (d *decider) destroy(vm, reason string) {
	d.emit(event.VMDestroyRequested{VM: vm, Reason: reason}, vm)
}

// destroySettled asks for vm's destruction if no side effect is in flight on
// it; otherwise the result of that side effect destroys it (see the result
// handlers: a VM whose claim ended is destroyed when it settles).
func (d *decider) destroySettled(vm, reason string) {
	v := d.s.vms[vm]
	if v != nil && (v.Status == VMClaimed || v.Status == VMHibernated || v.Status == VMWarm || v.Status == VMArchived) {
		d.destroy(vm, reason)
	}
}

func (d *decider) needInstance() error {
	if d.s.instance == "" {
		return reject(Invalid, "node not configured: ConfigureNode must come before VMs are created")
	}
	return nil
}

// --- configuration -----------------------------------------------------------

func (c ConfigureNode) decide(d *decider) error {
	if !nameRE.MatchString(c.Node) {
		return reject(Invalid, "invalid node id %q", c.Node)
	}
	if !nameRE.MatchString(c.Instance) {
		return reject(Invalid, "invalid instance id %q", c.Instance)
	}
	if c.Node == d.s.node && c.Instance == d.s.instance {
		return nil
	}
	d.emit(event.NodeConfigured{Node: c.Node, Instance: c.Instance}, event.NodeAggID)
	return nil
}

func sortSpecs(specs []PoolSpec) {
	slices.SortFunc(specs, func(a, b PoolSpec) int { return a.PoolKey.Compare(b.PoolKey) })
}

func (c ConfigurePools) decide(d *decider) error {
	specs, err := normSpecs(c.Pools)
	if err != nil {
		return err
	}
	pols, err := poolEgress(specs, c.Egress)
	if err != nil {
		return err
	}
	s := d.s
	active := 0
	for _, p := range s.pools { //fsm:unordered counting
		if !p.Draining {
			active++
		}
	}
	changed := active != len(specs)
	var policies []event.EgressPoolSet
	for _, sp := range specs {
		p := s.pools[sp.PoolKey]
		if p == nil || p.Draining || p.Spec != sp {
			changed = true
		}
		var cur *egress.Policy
		if p != nil {
			cur = p.Egress
		}
		if !egress.Equal(cur, pols[sp.PoolKey]) {
			policies = append(policies, event.EgressPoolSet{Key: sp.PoolKey, Policy: pols[sp.PoolKey]})
		}
	}
	if changed {
		d.emit(event.PoolsConfigured{Pools: specs}, event.NodeAggID)
	}
	// After the PoolsConfigured that (re)creates the pools' records.
	for _, ps := range policies {
		d.emit(ps, ps.Key.String())
	}
	if !changed {
		return nil
	}
	keep := make(map[PoolKey]bool, len(specs))
	for _, sp := range specs {
		keep[sp.PoolKey] = true
	}
	for _, k := range sortedPoolKeys(s.pools) {
		if p := s.pools[k]; !p.Draining && !keep[k] {
			for _, vm := range p.warm {
				d.destroy(vm, "drain")
			}
		}
	}
	for _, sp := range specs {
		if p := s.pools[sp.PoolKey]; p != nil {
			excess := len(p.warm) + p.refilling - sp.WarmMax
			for _, vm := range p.warm[:max(0, min(excess, len(p.warm)))] {
				d.destroy(vm, "trim")
			}
		}
		switch g := s.goldens[sp.PoolKey]; {
		case g == nil:
			d.emit(event.GoldenBuildRequested{Key: sp.PoolKey, Reason: "new"}, sp.PoolKey.String())
		case g.Status == GoldenBroken && g.RetryAt <= d.m.Now:
			d.emit(event.GoldenBuildRequested{Key: sp.PoolKey, Reason: "retry"}, sp.PoolKey.String())
		}
	}
	return nil
}

func (c ConfigureLimits) decide(d *decider) error {
	if c.MaxClaims < 0 || c.DefaultTenantCap < 0 {
		return reject(Invalid, "limits must not be negative")
	}
	if len(c.TenantCaps) > 100_000 {
		return reject(Invalid, "%d tenant caps, at most 100000", len(c.TenantCaps))
	}
	caps := make([]event.TenantCap, 0, len(c.TenantCaps))
	for _, t := range sortedKeys(c.TenantCaps) {
		if t == "" || len(t) > MaxTenant {
			return reject(Invalid, "tenant name %q: 1 to %d bytes", t, MaxTenant)
		}
		if c.TenantCaps[t] < 0 {
			return reject(Invalid, "tenant %q: negative cap", t)
		}
		caps = append(caps, event.TenantCap{Tenant: t, Cap: c.TenantCaps[t]})
	}
	l := d.s.limits
	same := l.MaxClaims == c.MaxClaims && l.DefaultTenantCap == c.DefaultTenantCap && len(l.TenantCaps) == len(caps)
	for _, tc := range caps {
		if v, ok := l.TenantCaps[tc.Tenant]; !ok || v != tc.Cap {
			same = false
		}
	}
	if same {
		return nil
	}
	if len(caps) == 0 {
		caps = nil
	}
	d.emit(event.LimitsConfigured{MaxClaims: c.MaxClaims, DefaultTenantCap: c.DefaultTenantCap, TenantCaps: caps}, event.NodeAggID)
	return nil
}

// --- claims ------------------------------------------------------------------

// NoWarmMsg is the rejection of a WarmOnly claim that found no warm VM.
const NoWarmMsg = "no warm VM for the pool"

// serveSeconds is a pending claim's serve timeout: 0 means the default.
func serveSeconds(serve int64) (int64, error) {
	switch {
	case serve < 0 || serve > MaxServeTimeout:
		return 0, reject(Invalid, "serve timeout %d s out of [0, %d]", serve, MaxServeTimeout)
	case serve == 0:
		return DefaultServeTimeoutSeconds, nil
	}
	return serve, nil
}

// admit refuses n new claims of tenant the node cannot take now: it
// drains, or they would pass max_claims or the tenant's cap.
func (d *decider) admit(tenant string, n int) error {
	s := d.s
	if s.draining {
		return reject(TooMany, DrainingMsg)
	}
	if l := s.limits.MaxClaims; l > 0 && s.live+n > l {
		return reject(TooMany, "max_claims %d reached", l)
	}
	if l := s.TenantCap(tenant); l > 0 && s.tenantLive[tenant]+n > l {
		return reject(TooMany, "tenant %q is at its cap of %d claims", tenant, l)
	}
	return nil
}

func (c Claim) decide(d *decider) error {
	s := d.s
	if !ValidClaimID(c.ID) {
		return reject(Invalid, "invalid claim id %q: want sb_ and 16 lowercase hex digits", c.ID)
	}
	if _, used := s.claims[c.ID]; used {
		return reject(Invalid, "claim id %s is already in use", c.ID)
	}
	var ck *CheckpointRec
	if c.Checkpoint != "" {
		// A claim from a checkpoint: the checkpoint's key applies.
		var err error
		if ck, err = d.claimableCheckpoint(c.Checkpoint); err != nil {
			return err
		}
		c.Key = ck.Key
	}
	// A pool's key was validated when it was configured (or claimed); only
	// a key without a pool record needs the (regexp) check.
	p := s.pools[c.Key]
	if p == nil {
		if err := ValidKey(c.Key); err != nil {
			return err
		}
	}
	if err := checkText("tenant", c.Tenant, MaxTenant); err != nil {
		return err
	}
	if err := checkText("claim_ref", c.ClaimRef, MaxClaimRef); err != nil {
		return err
	}
	if err := checkMetadata(c.Metadata); err != nil {
		return err
	}
	ttl, err := ttlSeconds(c.TTLSeconds)
	if err != nil {
		return err
	}
	serve, err := serveSeconds(c.ServeTimeoutSeconds)
	if err != nil {
		return err
	}
	if err := d.admit(c.Tenant, 1); err != nil {
		return err
	}
	env, err := envOf(c.Env)
	if err != nil {
		return err
	}
	if err := validOnExpire(c.OnExpire); err != nil {
		return err
	}
	vols, err := c.claimVolumes(d)
	if err != nil {
		return err
	}
	gen := c.TokenGen
	if gen == 0 {
		gen = 1
	}
	deadline := d.m.Now + ttl*second
	ev := event.ClaimCreated{Claim: c.ID, Key: c.Key, Tenant: c.Tenant, ClaimRef: c.ClaimRef, Metadata: c.Metadata,
		TTLSeconds: ttl, DeadlineNS: deadline, ServeByNS: min(deadline, d.m.Now+serve*second), TokenGen: gen,
		NoEgress: c.NoEgress, Env: env, Volumes: vols}
	if c.OnExpire == event.OnExpireArchive {
		ev.OnExpire = c.OnExpire
	}
	if len(ev.Metadata) == 0 {
		ev.Metadata = nil
	}
	// The claim pins its egress: the tenant's class now (a later change
	// of the tenant's class is for its next claims) and whether the key
	// has a configured pool.
	if t := s.tenants[c.Tenant]; t != nil && c.Tenant != "" {
		ev.EgressClass = t.EgressClass
	}
	if p == nil || p.Draining {
		ev.PolicyLayer = PolicyUnpooled
	}
	// A key no configured pool has (never configured, or left out of the
	// last ConfigurePools and draining) is not refused: as the old daemon,
	// the claim is served from the key's golden if one is ready, else by a
	// cold boot of the template, which fails when there is no such
	// template. Apply keeps such claims under a draining pool record.
	if n := len(p.warmStack()); n > 0 && ck == nil {
		ev.Tier, ev.VM = TierWarm.String(), p.warm[n-1]
		d.emit(ev, c.ID)
		return nil
	}
	if c.WarmOnly {
		return reject(TooMany, NoWarmMsg)
	}
	if err := d.needInstance(); err != nil {
		return err
	}
	tier := TierCold
	if g := s.goldens[c.Key]; g != nil && g.Status == GoldenReady || ck != nil {
		tier = TierClone
	}
	ev.Tier, ev.VM = tier.String(), d.newVMID()
	if ck != nil {
		ev.FromCheckpoint = ck.ID
	}
	d.emit(ev, c.ID)
	d.cloneRequest(ev.VM, c.Key, c.ID, tier == TierCold, ev.FromCheckpoint)
	return nil
}

func (c Refill) decide(d *decider) error {
	s := d.s
	var keys []PoolKey
	if c.Key == (PoolKey{}) {
		keys = sortedPoolKeys(s.needRefill)
	} else {
		if s.pools[c.Key] == nil {
			return reject(UnknownPool, "no pool %s", c.Key)
		}
		if _, ok := s.needRefill[c.Key]; ok {
			keys = []PoolKey{c.Key}
		}
	}
	if len(keys) == 0 {
		return nil
	}
	if err := d.needInstance(); err != nil {
		return err
	}
	budget := MaxRefillBatch
	for _, k := range keys {
		for range min(refillDeficit(s.pools[k]), budget) {
			d.cloneRequest(d.newVMID(), k, "", false, "")
			budget--
		}
	}
	return nil
}

func (d *decider) liveClaim(id string) (*ClaimRec, error) {
	c := d.s.claims[id]
	if c == nil {
		return nil, reject(NotFound, "no sandbox %s", id)
	}
	return c, nil
}

// settledVM returns the VM of running or hibernated claim c when no side
// effect on the claim is in flight: its VM is claimed (running claim) or
// hibernated (hibernated claim) and no volume attach or detach runs.
// Everything that starts a side effect on a claim's VM (hibernate, idle or
// asked; checkpoint and fork; promote; volume changes; the archive, at an
// archiving expiry or by the pool's timer: archive.go) asks it, so none
// overlaps another (a snapshot never races a hot-plug).
func (s *State) settledVM(c *ClaimRec) (*VMRec, bool) {
	v := s.vms[c.VM]
	if c.Status != ClaimRunning && c.Status != ClaimHibernated || v == nil || v.Status != claimVMStatus[c.Status] || c.VolumeOpInFlight() {
		return nil, false
	}
	return v, true
}

// settled is settledVM for a command: a conflict saying what is in flight.
// The caller has checked that c is running or hibernated.
func (d *decider) settled(c *ClaimRec) (*VMRec, error) {
	if v, ok := d.s.settledVM(c); ok {
		return v, nil
	}
	if c.VolumeOpInFlight() {
		return nil, reject(InvalidTransition, "sandbox %s: a volume operation is in flight; retry", c.ID)
	}
	if v := d.s.vms[c.VM]; v != nil {
		return nil, reject(InvalidTransition, "sandbox %s is busy (its VM is %s)", c.ID, v.Status)
	}
	return nil, reject(InvalidTransition, "sandbox %s: its VM is gone", c.ID)
}

func (cmd Hibernate) decide(d *decider) error {
	id := cmd.Claim
	c, err := d.liveClaim(id)
	if err != nil {
		return err
	}
	switch c.Status {
	case ClaimHibernating, ClaimHibernated:
		return nil
	case ClaimRunning:
		if _, err := d.settled(c); err != nil {
			return err
		}
		d.closeRelays(id, "hibernate")
		d.emit(event.HibernateRequested{Claim: id, VM: c.VM, Reason: "user"}, id)
		return nil
	}
	return reject(InvalidTransition, "sandbox %s is %s, cannot hibernate", id, c.Status)
}

func (cmd Wake) decide(d *decider) error {
	id := cmd.Claim
	c, err := d.liveClaim(id)
	if err != nil {
		return err
	}
	switch c.Status {
	case ClaimRunning, ClaimWaking, ClaimPending:
		return nil
	case ClaimHibernated:
		v := d.s.vms[c.VM]
		if v != nil {
			if handled, err := d.wakeArchive(c, v); handled {
				return err
			}
		}
		if v == nil || v.Status != VMHibernated {
			return reject(InvalidTransition, "sandbox %s: its VM is not hibernated", id)
		}
		d.emit(event.WakeRequested{Claim: id, VM: c.VM, SnapshotDir: v.SnapshotDir}, id)
		return nil
	}
	return reject(InvalidTransition, "sandbox %s is %s, cannot wake", id, c.Status)
}

func (cmd Release) decide(d *decider) error {
	id := cmd.Claim
	c, err := d.liveClaim(id)
	if err != nil {
		return err
	}
	if !c.Status.Live() {
		return nil
	}
	d.closeRelays(id, "released")
	d.emit(event.ClaimReleased{Claim: id, VM: c.VM}, id)
	d.destroySettled(c.VM, "release")
	return nil
}

func (r Renew) decide(d *decider) error {
	c, err := d.liveClaim(r.Claim)
	if err != nil {
		return err
	}
	if !c.Status.Live() {
		return reject(InvalidTransition, "sandbox %s is %s, cannot renew", r.Claim, c.Status)
	}
	if d.s.archivedClaim(c) {
		return reject(InvalidTransition, "sandbox %s is archived: wake it first", r.Claim)
	}
	if err := validOnExpire(r.OnExpire); err != nil {
		return err
	}
	ttl, err := ttlSeconds(r.TTLSeconds)
	if err != nil {
		return err
	}
	d.emit(event.ClaimRenewed{Claim: r.Claim, TTLSeconds: ttl, DeadlineNS: d.m.Now + ttl*second, OnExpire: r.OnExpire}, r.Claim)
	return nil
}

func (cmd Touch) decide(d *decider) error {
	id := cmd.Claim
	c, err := d.liveClaim(id)
	if err != nil {
		return err
	}
	if c.Status != ClaimRunning || d.m.Now <= c.LastActivity {
		return nil
	}
	d.emit(event.ClaimTouched{Claim: id}, id)
	return nil
}

// decide of a Tick fires due timers. Leases and serve deadlines go first, so
// that a claim both idle and expired is reaped rather than hibernated.
func (Tick) decide(d *decider) error {
	s := d.s
	due := s.timers.due(d.m.Now)
	if len(due) == 0 {
		return nil
	}
	var ended map[string]bool
	for _, t := range due {
		c := s.claims[t.key.id]
		switch {
		case c == nil || ended[c.ID]:
			continue
		case t.key.kind == tServe && c.Status == ClaimPending:
			d.emit(event.ClaimFailed{Claim: c.ID, VM: c.VM, Reason: "deadline", Error: "not served before its serve deadline"}, c.ID)
			if c.Fork != "" {
				// A fork's children live or fail together.
				if ended == nil {
					ended = map[string]bool{}
				}
				for _, id := range d.failFork(c.Fork, c.ID, "a sibling was not served before its serve deadline") {
					ended[id] = true
				}
			}
		case t.key.kind == tTTL && c.Status.Live() && c.Status != ClaimPending:
			if d.expireArchives(c) {
				// Not ended; no idle hibernate or archive of it below.
				break
			}
			d.closeRelays(c.ID, "expired")
			d.emit(event.ClaimExpired{Claim: c.ID, VM: c.VM}, c.ID)
			d.destroySettled(c.VM, "expire")
		default:
			continue
		}
		if ended == nil {
			ended = map[string]bool{}
		}
		ended[c.ID] = true
	}
	for _, t := range due {
		switch t.key.kind {
		case tIdle:
			c := s.claims[t.key.id]
			if c != nil && c.Status == ClaimRunning && !ended[c.ID] {
				if _, ok := s.settledVM(c); ok {
					d.emit(event.HibernateRequested{Claim: c.ID, VM: c.VM, Reason: "idle"}, c.ID)
				}
			}
		case tArchive:
			if c := s.claims[t.key.id]; c != nil && !ended[c.ID] {
				d.archiveDue(c)
			}
		case tGolden:
			k, err := event.ParsePoolKey(t.key.id)
			if err != nil {
				return fmt.Errorf("fsm: golden timer %q: %w", t.key.id, err)
			}
			if _, due := s.goldenTimer(k); due {
				d.emit(event.GoldenBuildRequested{Key: k, Reason: "retry"}, t.key.id)
			}
		case tPark:
			var k *PoolKey
			if t.key.id != "*" {
				pk, err := event.ParsePoolKey(t.key.id)
				if err != nil {
					return fmt.Errorf("fsm: park timer %q: %w", t.key.id, err)
				}
				k = &pk
			}
			d.emit(event.PoolUnparked{Key: k}, event.ParkAggID(k))
		case tCheckpoint:
			d.expireCheckpoint(t.key.id)
		}
	}
	return nil
}

// --- executor results --------------------------------------------------------

// inFlight returns VM id if it is in status want with the result's cause as
// its op in flight.
func (d *decider) inFlight(id string, want VMStatus) (*VMRec, error) {
	v := d.s.vms[id]
	if v == nil {
		return nil, reject(NotFound, "no VM %s", id)
	}
	if v.Status != want {
		return nil, reject(InvalidTransition, "VM %s is %s, not %s", id, v.Status, want)
	}
	if v.Op != d.m.Cause {
		return nil, reject(InvalidTransition, "VM %s: stale result (cause %s, op in flight %s)", id, d.m.Cause, v.Op)
	}
	return v, nil
}

func (d *decider) building(k PoolKey) (*GoldenRec, error) {
	g := d.s.goldens[k]
	if g == nil {
		return nil, reject(NotFound, "no golden %s", k)
	}
	if g.Status != GoldenBuilding || g.Op != d.m.Cause {
		return nil, reject(InvalidTransition, "golden %s is %s; stale result (cause %s)", k, g.Status, d.m.Cause)
	}
	return g, nil
}

func errText(s string) string {
	if len(s) > MaxErrorText {
		return s[:MaxErrorText]
	}
	return s
}

func checkDir(dir string) error {
	if dir == "" || len(dir) > maxSnapshotDirLen {
		return reject(Invalid, "snapshot dir: 1 to %d bytes", maxSnapshotDirLen)
	}
	return nil
}

func (c GoldenBuilt) decide(d *decider) error {
	if _, err := d.building(c.Key); err != nil {
		return err
	}
	if err := d.freshDir(c.SnapshotDir); err != nil {
		return err
	}
	d.emit(event.GoldenBuilt{Key: c.Key, SnapshotDir: c.SnapshotDir, Report: c.Report}, c.Key.String())
	return nil
}

func (c GoldenFailed) decide(d *decider) error {
	if _, err := d.building(c.Key); err != nil {
		return err
	}
	d.emit(event.GoldenFailed{Key: c.Key, Error: errText(c.Error), RetryAtNS: d.m.Now + GoldenRetryNS}, c.Key.String())
	return nil
}

// claimWaiting returns v's claim if it is live in status want and still
// holds v.
func (d *decider) claimWaiting(v *VMRec, want ClaimStatus) *ClaimRec {
	c := d.s.claims[v.Claim]
	if c == nil || c.Status != want || c.VM != v.ID {
		return nil
	}
	return c
}

func (c VMCloned) decide(d *decider) error {
	v, err := d.inFlight(c.VM, VMCloning)
	if err != nil {
		return err
	}
	d.emit(event.VMCloned{VM: v.ID, Report: c.Report}, v.ID)
	d.clonedFrom(v)
	if v.Claim != "" {
		if cl := d.claimWaiting(v, ClaimPending); cl != nil {
			d.emit(event.ClaimServed{Claim: cl.ID, VM: v.ID}, cl.ID)
		} else {
			d.destroy(v.ID, "claim_ended")
		}
		return nil
	}
	switch p := d.s.pools[v.Key]; {
	case p == nil || p.Draining || d.s.draining:
		d.destroy(v.ID, "drain")
	case len(p.warm)+p.refilling > p.Spec.WarmMax:
		d.destroy(v.ID, "trim")
	}
	return nil
}

func (c VMCloneFailed) decide(d *decider) error {
	v, err := d.inFlight(c.VM, VMCloning)
	if err != nil {
		return err
	}
	d.emit(event.VMCloneFailed{VM: v.ID, Error: errText(c.Error)}, v.ID)
	d.clonedFrom(v)
	if v.Claim != "" {
		if cl := d.claimWaiting(v, ClaimPending); cl != nil {
			reason := "clone_failed"
			if v.Cold {
				reason = "cold_boot_failed"
			}
			d.emit(event.ClaimFailed{Claim: cl.ID, VM: v.ID, Reason: reason, Error: errText(c.Error)}, cl.ID)
			if cl.Fork != "" {
				d.failFork(cl.Fork, cl.ID, "a sibling's clone failed: "+c.Error)
			}
		}
		return nil
	}
	if p := d.s.pools[v.Key]; p != nil && !p.Draining && p.ParkedUntil == 0 {
		k := v.Key
		d.emit(event.PoolParked{Key: &k, UntilNS: d.m.Now + CloneRetryNS, Reason: ParkCloneFailed}, k.String())
	}
	return nil
}

func (c HibernateDone) decide(d *decider) error {
	v, err := d.inFlight(c.VM, VMHibernating)
	if err != nil {
		return err
	}
	if err := d.freshDir(c.SnapshotDir); err != nil {
		return err
	}
	d.emit(event.Hibernated{Claim: v.Claim, VM: v.ID, SnapshotDir: c.SnapshotDir, Report: c.Report}, v.Claim)
	if d.claimWaiting(v, ClaimHibernating) == nil {
		d.destroy(v.ID, "claim_ended")
	}
	return nil
}

func (c HibernateFailed) decide(d *decider) error {
	v, err := d.inFlight(c.VM, VMHibernating)
	if err != nil {
		return err
	}
	d.emit(event.HibernateFailed{Claim: v.Claim, VM: v.ID, Error: errText(c.Error), Lost: c.Lost}, v.Claim)
	d.settleFailure(v, ClaimHibernating, c.Lost, "hibernate_failed", c.Error)
	return nil
}

func (c WakeDone) decide(d *decider) error {
	v, err := d.inFlight(c.VM, VMWaking)
	if err != nil {
		return err
	}
	d.emit(event.Woken{Claim: v.Claim, VM: v.ID, Report: c.Report}, v.Claim)
	if d.claimWaiting(v, ClaimWaking) == nil {
		d.destroy(v.ID, "claim_ended")
	}
	return nil
}

func (c WakeFailed) decide(d *decider) error {
	v, err := d.inFlight(c.VM, VMWaking)
	if err != nil {
		return err
	}
	d.emit(event.WakeFailed{Claim: v.Claim, VM: v.ID, Error: errText(c.Error), Lost: c.Lost}, v.Claim)
	d.settleFailure(v, ClaimWaking, c.Lost, "wake_failed", c.Error)
	return nil
}

// settleFailure follows the result of a side effect on a claim's VM (a
// failed hibernate or wake; a checkpoint's capture, a promote, either way)
// that left its claim in status want: a VM whose claim ended meanwhile is
// destroyed; a lost VM fails its claim, closing its relays (a running
// claim's stay open through a capture or promote), and is destroyed.
func (d *decider) settleFailure(v *VMRec, want ClaimStatus, lost bool, reason, msg string) {
	cl := d.claimWaiting(v, want)
	switch {
	case cl == nil:
		d.destroy(v.ID, "claim_ended")
	case lost:
		d.closeRelays(cl.ID, "failed")
		d.emit(event.ClaimFailed{Claim: cl.ID, VM: v.ID, Reason: reason, Error: errText(msg)}, cl.ID)
		d.destroy(v.ID, "failed")
	}
}

func (c VMDestroyed) decide(d *decider) error {
	v, err := d.inFlight(c.VM, VMDestroying)
	if err != nil {
		return err
	}
	d.emit(event.VMDestroyed{VM: v.ID, Report: c.Report}, v.ID)
	return nil
}

func (c VMExited) decide(d *decider) error {
	v := d.s.vms[c.VM]
	if v == nil {
		return reject(NotFound, "no VM %s", c.VM)
	}
	switch v.Status {
	case VMDestroying:
		return nil
	case VMWarm:
		d.emit(event.VMExited{VM: v.ID, Detail: errText(c.Detail)}, v.ID)
		d.destroy(v.ID, "exited")
	case VMClaimed:
		if c.Restart.Max < 0 || c.Restart.Max > MaxRestartHistory || c.Restart.WindowNS < 0 {
			return reject(Invalid, "restart policy %+v: max in [0, %d], window not negative", c.Restart, MaxRestartHistory)
		}
		d.emit(event.VMExited{VM: v.ID, Detail: errText(c.Detail)}, v.ID)
		cl := d.claimWaiting(v, ClaimRunning)
		if cl == nil {
			d.destroy(v.ID, "exited")
			return nil
		}
		// The guest's connections died with its VMM.
		d.closeRelays(cl.ID, "vm_exited")
		if n := recentRestarts(v, d.m.Now, c.Restart.WindowNS); n < c.Restart.Max {
			d.emit(event.VMRestartRequested{VM: v.ID, Claim: cl.ID, Reason: "exited", Attempt: n + 1}, v.ID)
			return nil
		}
		msg := c.Detail
		if c.Restart.Max > 0 {
			msg = fmt.Sprintf("%s (restarted %d times within %s)", c.Detail, c.Restart.Max, durationText(c.Restart.WindowNS))
		}
		d.emit(event.ClaimFailed{Claim: cl.ID, VM: v.ID, Reason: "vm_exited", Error: errText(msg)}, cl.ID)
		d.destroy(v.ID, "exited")
	default:
		return reject(InvalidTransition, "VM %s is %s: its executor reports the outcome", v.ID, v.Status)
	}
	return nil
}

// recentRestarts counts v's restarts requested within window before now.
func recentRestarts(v *VMRec, now, window int64) int {
	n := 0
	for _, t := range v.Restarts {
		if t > now-window {
			n++
		}
	}
	return n
}

// durationText renders ns as whole seconds, minutes or hours ("10m").
func durationText(ns int64) string {
	s := ns / second
	switch {
	case s >= 3600 && s%3600 == 0:
		return fmt.Sprintf("%dh", s/3600)
	case s >= 60 && s%60 == 0:
		return fmt.Sprintf("%dm", s/60)
	}
	return fmt.Sprintf("%ds", s)
}

func (c VMRestarted) decide(d *decider) error {
	v, err := d.inFlight(c.VM, VMRestarting)
	if err != nil {
		return err
	}
	d.emit(event.VMRestarted{VM: v.ID, Report: c.Report}, v.ID)
	if d.claimWaiting(v, ClaimRunning) == nil {
		d.destroy(v.ID, "claim_ended")
	}
	return nil
}

func (c VMRestartFailed) decide(d *decider) error {
	v, err := d.inFlight(c.VM, VMRestarting)
	if err != nil {
		return err
	}
	d.emit(event.VMRestartFailed{VM: v.ID, Error: errText(c.Error)}, v.ID)
	if cl := d.claimWaiting(v, ClaimRunning); cl != nil {
		d.emit(event.ClaimFailed{Claim: cl.ID, VM: v.ID, Reason: "restart_failed", Error: errText(c.Error)}, cl.ID)
		d.destroy(v.ID, "failed")
		return nil
	}
	d.destroy(v.ID, "claim_ended")
	return nil
}

func (c CapacityFull) decide(d *decider) error {
	until := d.m.Now + CapacityParkNS
	cur := d.s.nodeParkUntil
	if c.Key != nil {
		p := d.s.pools[*c.Key]
		if p == nil {
			return reject(UnknownPool, "no pool %s", *c.Key)
		}
		cur = p.ParkedUntil
	}
	if cur >= until {
		return nil
	}
	var k *PoolKey
	if c.Key != nil {
		kk := *c.Key
		k = &kk
	}
	d.emit(event.PoolParked{Key: k, UntilNS: until, Reason: ParkCapacity}, event.ParkAggID(k))
	return nil
}
