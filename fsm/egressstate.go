package fsm

import (
	"cmp"
	"slices"

	"github.com/sbxlog/sbxlog/eventlog/event"
	"github.com/sbxlog/sbxlog/fsm/egress"
)

// Guarded egress is state, changed at runtime and applied to a sandbox's
// next connection (the proxy looks its policy up per connection):
//
//   - a pool's policy (ConfigurePools' Egress, recorded as EgressPoolSet
//     after the PoolsConfigured that names the pool); a draining pool
//     keeps its policy for its live claims until its record goes;
//   - egress classes, named policies a tenant points at (PutEgressClass,
//     RemoveEgressClass, SetEgressClasses; owned by the config's classes
//     until the API first changes them, as tenants are);
//   - per claim, pinned when the claim is made (ClaimCreated): the
//     tenant's class at that moment, egress false, whether the key had a
//     pool; and its env (SetClaimEnv), whose values are sealed by the
//     caller: the state never sees a secret in the clear.
//
// A claim's effective policy is Egress: egress.Resolve over those facts.
// A tenant may name a class that does not exist (it gets no policy); the
// API refuses to set one, and RemoveEgressClass refuses to remove a class
// a tenant names. Egress usage (RecordEgressUsage) is recorded, one event
// per sandbox and interval, and changes no state.

// PolicyUnpooled is ClaimCreated's policy_layer for a claim whose key had
// no configured pool (empty: it had one).
const PolicyUnpooled = "unpooled"

// MaxEgressClasses bounds the class set.
const MaxEgressClasses = 1000

// ErrUnknownEgressClassMsg is RemoveEgressClass's rejection of a name not
// in the set.
const ErrUnknownEgressClassMsg = "unknown egress class"

// EgressClassSpec is a class as an operator sets it.
type EgressClassSpec struct {
	Name   string
	Policy egress.Policy
}

// EgressClassRec is a class's record; its policy is read-only.
type EgressClassRec struct {
	Name   string
	Policy egress.Policy
}

// PutEgressClass creates or replaces an egress class (PUT
// /v1/egress/classes/{name}); the tenants naming it get the new policy on
// their sandboxes' next connection.
type PutEgressClass struct {
	Meta
	Class EgressClassSpec
}

// RemoveEgressClass removes an egress class (DELETE
// /v1/egress/classes/{name}). An unknown name is NotFound; a class a
// tenant names is an InvalidTransition (change the tenant first).
type RemoveEgressClass struct {
	Meta
	Name string
}

// SetEgressClasses replaces the whole class set; FromConfig marks the
// config's classes proposed at start, ignored once the API has changed
// the set. A whole set may drop a class a tenant names (that tenant's
// sandboxes get no policy), as a config may.
type SetEgressClasses struct {
	Meta
	Classes    []EgressClassSpec
	FromConfig bool
}

// SetClaimEnv changes a live claim's env (PUT and PATCH
// /v1/sandboxes/{id}/env): with Replace the env becomes Set; otherwise
// the entries of Set replace or add theirs and the names in Remove go.
// Values are sealed by the caller (the API); the entries are checked
// against the env limits (egress.ValidEnv) after the change.
type SetClaimEnv struct {
	Meta
	Claim   string
	Replace bool
	Set     []egress.EnvEntry
	Remove  []string
}

// EgressUsage is one sandbox's egress over [FromNS, ToNS) as the proxy
// aggregated it; Final marks its last record (its proxy closed).
type EgressUsage struct {
	Claim           string
	FromNS, ToNS    int64
	Tx, Rx          int64
	Allowed, Denied int64
	Final           bool
}

// RecordEgressUsage records egress usage, one event per sandbox (those
// with nothing to record are skipped). It changes no state: the usage
// journal reads the events.
type RecordEgressUsage struct {
	Meta
	Usage []EgressUsage
}

// MaxUsageBatch bounds one RecordEgressUsage.
const MaxUsageBatch = 4096

// EgressClass returns class name's record.
func (s *State) EgressClass(name string) (EgressClassRec, bool) {
	c, ok := s.egressClasses[name]
	if !ok {
		return EgressClassRec{}, false
	}
	return *c, true
}

// EgressClasses returns every class, sorted by name.
func (s *State) EgressClasses() []EgressClassRec {
	out := make([]EgressClassRec, 0, len(s.egressClasses))
	for _, n := range sortedKeys(s.egressClasses) {
		out = append(out, *s.egressClasses[n])
	}
	return out
}

// EgressClassesOwnedByAPI reports whether the API has changed the class
// set, so the config's classes no longer apply.
func (s *State) EgressClassesOwnedByAPI() bool { return s.classesAPI }

// PoolEgress returns pool k's policy (nil: none, or no such pool). The
// policy is read-only.
func (s *State) PoolEgress(k PoolKey) *egress.Policy {
	if p := s.pools[k]; p != nil {
		return p.Egress
	}
	return nil
}

// Egress returns claim id's effective policy (egress.Resolve over what
// the claim pinned and the policies those name now); false for a claim
// with none, an ended claim and an unknown id. O(1); the policies it
// points at are never changed in place.
func (s *State) Egress(id string) (egress.Effective, bool) {
	c := s.claims[id]
	if c == nil || !c.Status.Live() {
		return egress.Effective{}, false
	}
	return s.egressOf(c)
}

// EgressFor returns the effective policy a claim of key by tenant would
// get now (with noEgress: none), as Claim would pin it: for checking a
// claim's credentials before it is proposed.
func (s *State) EgressFor(tenant string, key PoolKey, noEgress bool) (egress.Effective, bool) {
	c := &ClaimRec{Key: key, Tenant: tenant, NoEgress: noEgress}
	if t := s.tenants[tenant]; t != nil && tenant != "" {
		c.EgressClass = t.EgressClass
	}
	if p := s.pools[key]; p == nil || p.Draining {
		c.Unpooled = true
	}
	return s.egressOf(c)
}

func (s *State) egressOf(c *ClaimRec) (egress.Effective, bool) {
	in := egress.Claim{NoEgress: c.NoEgress, Tenant: c.Tenant, Unpooled: c.Unpooled, Pool: s.PoolEgress(c.Key)}
	if cl := s.egressClasses[c.EgressClass]; cl != nil && c.EgressClass != "" {
		in.Class = &cl.Policy
	}
	return egress.Resolve(in)
}

// ClaimOfVM returns the live claim VM vm serves.
func (s *State) ClaimOfVM(vm string) (ClaimRec, bool) {
	v := s.vms[vm]
	if v == nil || v.Claim == "" {
		return ClaimRec{}, false
	}
	c := s.claims[v.Claim]
	if c == nil || c.VM != vm || !c.Status.Live() {
		return ClaimRec{}, false
	}
	return *c, true
}

// normPolicy normalizes and validates a policy of scope; what names the
// policy prefixes the error.
func normPolicy(p egress.Policy, scope egress.Scope, what string) (egress.Policy, error) {
	n := egress.Normalize(p)
	if err := egress.Validate(n, scope); err != nil {
		return n, reject(Invalid, "%s: %v", what, err)
	}
	return n, nil
}

func (s *State) classSpec(spec EgressClassSpec) (EgressClassRec, error) {
	if !nameRE.MatchString(spec.Name) {
		return EgressClassRec{}, reject(Invalid, "invalid egress class: name %q must match %s", spec.Name, nameRE)
	}
	p, err := normPolicy(spec.Policy, egress.ScopeClass, "egress class \""+spec.Name+"\"")
	return EgressClassRec{Name: spec.Name, Policy: p}, err
}

func (d *decider) putClass(r EgressClassRec, fromConfig bool) {
	if cur := d.s.egressClasses[r.Name]; cur != nil && egress.Equal(&cur.Policy, &r.Policy) {
		return
	}
	d.emit(event.EgressClassPut{Name: r.Name, Policy: r.Policy, Config: fromConfig}, r.Name)
}

// namedBy returns a tenant that names class, if any (the first by name).
func (s *State) namedBy(class string) (string, bool) {
	for _, n := range sortedKeys(s.tenants) {
		if s.tenants[n].EgressClass == class {
			return n, true
		}
	}
	return "", false
}

func (c PutEgressClass) decide(d *decider) error {
	r, err := d.s.classSpec(c.Class)
	if err != nil {
		return err
	}
	if d.s.egressClasses[r.Name] == nil && len(d.s.egressClasses) >= MaxEgressClasses {
		return reject(Invalid, "invalid egress class: %d classes, at most %d", len(d.s.egressClasses)+1, MaxEgressClasses)
	}
	d.putClass(r, false)
	return nil
}

func (c RemoveEgressClass) decide(d *decider) error {
	if d.s.egressClasses[c.Name] == nil {
		return reject(NotFound, ErrUnknownEgressClassMsg)
	}
	if t, named := d.s.namedBy(c.Name); named {
		return reject(InvalidTransition, "egress class %q is named by tenant %q: change the tenant's egress_class first", c.Name, t)
	}
	d.emit(event.EgressClassRemoved{Name: c.Name}, c.Name)
	return nil
}

func (c SetEgressClasses) decide(d *decider) error {
	if c.FromConfig && d.s.classesAPI {
		return nil
	}
	if len(c.Classes) > MaxEgressClasses {
		return reject(Invalid, "invalid egress class: %d classes, at most %d", len(c.Classes), MaxEgressClasses)
	}
	recs := make([]EgressClassRec, 0, len(c.Classes))
	byName := make(map[string]bool, len(c.Classes))
	for _, spec := range c.Classes {
		if byName[spec.Name] {
			return reject(Invalid, "invalid egress class: duplicate egress class %q", spec.Name)
		}
		byName[spec.Name] = true
		r, err := d.s.classSpec(spec)
		if err != nil {
			return err
		}
		recs = append(recs, r)
	}
	slices.SortFunc(recs, func(a, b EgressClassRec) int { return cmp.Compare(a.Name, b.Name) })
	for _, name := range sortedKeys(d.s.egressClasses) {
		if !byName[name] {
			d.emit(event.EgressClassRemoved{Name: name, Config: c.FromConfig}, name)
		}
	}
	for _, r := range recs {
		d.putClass(r, c.FromConfig)
	}
	return nil
}

// poolEgress validates ConfigurePools' policies: each names a pool of
// the set.
func poolEgress(specs []PoolSpec, pols map[PoolKey]*egress.Policy) (map[PoolKey]*egress.Policy, error) {
	if len(pols) == 0 {
		return nil, nil
	}
	out := make(map[PoolKey]*egress.Policy, len(pols))
	for _, k := range sortedPoolKeys(pols) {
		if !slices.ContainsFunc(specs, func(sp PoolSpec) bool { return sp.PoolKey == k }) {
			return nil, reject(Invalid, "egress policy for pool %s, which the pool set does not have", k)
		}
		if pols[k] == nil {
			continue
		}
		p, err := normPolicy(*pols[k], egress.ScopePool, "pool \""+k.String()+"\" egress")
		if err != nil {
			return nil, err
		}
		out[k] = &p
	}
	return out, nil
}

// envOf checks and sorts a claim's env as given in a command.
func envOf(env []egress.EnvEntry) ([]egress.EnvEntry, error) {
	if len(env) == 0 {
		return nil, nil
	}
	out := slices.Clone(env)
	slices.SortStableFunc(out, func(a, b egress.EnvEntry) int { return cmp.Compare(a.Name, b.Name) })
	for i := range out {
		if out[i].Inject != nil {
			in := *out[i].Inject
			in.Hosts = slices.Clone(in.Hosts)
			out[i].Inject = &in
		}
	}
	if err := egress.ValidEnv(out); err != nil {
		return nil, reject(Invalid, "invalid env: %v", err)
	}
	return out, nil
}

// mergeEnv applies a change to env (sorted, valid) and returns the new
// env, a new slice.
func mergeEnv(env []egress.EnvEntry, replace bool, set []egress.EnvEntry, remove []string) []egress.EnvEntry {
	if replace {
		return slices.Clone(set)
	}
	out := make([]egress.EnvEntry, 0, len(env)+len(set))
	for _, e := range env {
		if !slices.Contains(remove, e.Name) && !slices.ContainsFunc(set, func(n egress.EnvEntry) bool { return n.Name == e.Name }) {
			out = append(out, e)
		}
	}
	out = append(out, set...)
	slices.SortFunc(out, func(a, b egress.EnvEntry) int { return cmp.Compare(a.Name, b.Name) })
	if len(out) == 0 {
		return nil
	}
	return out
}

func (c SetClaimEnv) decide(d *decider) error {
	cl := d.s.claims[c.Claim]
	if cl == nil || !cl.Status.Live() {
		return reject(NotFound, "unknown sandbox")
	}
	set, err := envOf(c.Set)
	if err != nil {
		return err
	}
	var remove []string
	if !c.Replace && len(c.Remove) > 0 {
		remove = slices.Clone(c.Remove)
		slices.Sort(remove)
		remove = slices.Compact(remove)
		for _, n := range remove {
			if !egress.EnvNameRE.MatchString(n) {
				return reject(Invalid, "invalid env: env name %q must match %s", n, egress.EnvNameRE)
			}
			if slices.ContainsFunc(set, func(e egress.EnvEntry) bool { return e.Name == n }) {
				return reject(Invalid, "invalid env: env %s both set and removed", n)
			}
		}
	}
	merged := mergeEnv(cl.Env, c.Replace, set, remove)
	if err := egress.ValidEnv(merged); err != nil {
		return reject(Invalid, "invalid env: %v", err)
	}
	if slices.EqualFunc(merged, cl.Env, envEqual) {
		return nil
	}
	d.emit(event.ClaimEnvChanged{Claim: c.Claim, Replace: c.Replace, Set: set, Remove: remove}, c.Claim)
	return nil
}

func envEqual(a, b egress.EnvEntry) bool {
	if a.Name != b.Name || a.Sealed != b.Sealed || a.Size != b.Size || a.HostOnly != b.HostOnly || (a.Inject == nil) != (b.Inject == nil) {
		return false
	}
	if a.Inject == nil {
		return true
	}
	x, y := a.Inject, b.Inject
	return slices.Equal(x.Hosts, y.Hosts) && x.Header == y.Header && x.Query == y.Query && x.Body == y.Body && x.Placeholder == y.Placeholder
}

func (c RecordEgressUsage) decide(d *decider) error {
	if len(c.Usage) > MaxUsageBatch {
		return reject(Invalid, "%d usage records, at most %d", len(c.Usage), MaxUsageBatch)
	}
	for _, u := range c.Usage {
		switch {
		case !ValidClaimID(u.Claim):
			return reject(Invalid, "invalid claim id %q", u.Claim)
		case u.Tx < 0 || u.Rx < 0 || u.Allowed < 0 || u.Denied < 0:
			return reject(Invalid, "usage of %s: negative counters", u.Claim)
		case u.ToNS < u.FromNS:
			return reject(Invalid, "usage of %s: interval ends before it starts", u.Claim)
		}
	}
	for _, u := range c.Usage {
		if u.Tx == 0 && u.Rx == 0 && u.Allowed == 0 && u.Denied == 0 && !u.Final {
			continue
		}
		ev := event.EgressUsage{Claim: u.Claim, FromNS: u.FromNS, ToNS: u.ToNS, Tx: u.Tx, Rx: u.Rx, Allowed: u.Allowed, Denied: u.Denied, Final: u.Final}
		if cl := d.s.claims[u.Claim]; cl != nil {
			k := cl.Key
			ev.Key, ev.Tenant = &k, cl.Tenant
		}
		d.emit(ev, u.Claim)
	}
	return nil
}

// --- apply -------------------------------------------------------------------

func (a *applier) egressPoolSet(p event.EgressPoolSet) error {
	pool := a.s.pools[p.Key]
	if pool == nil {
		return inconsistent("egress policy for unknown pool %s", p.Key)
	}
	pool.Egress = egress.Clone(p.Policy)
	return nil
}

func (a *applier) egressClassPut(p event.EgressClassPut) error {
	if !nameRE.MatchString(p.Name) {
		return inconsistent("egress class %q: invalid name", p.Name)
	}
	a.s.egressClasses[p.Name] = &EgressClassRec{Name: p.Name, Policy: egress.Normalize(p.Policy)}
	if !p.Config {
		a.s.classesAPI = true
	}
	return nil
}

func (a *applier) egressClassRemoved(p event.EgressClassRemoved) error {
	if a.s.egressClasses[p.Name] == nil {
		return inconsistent("removal of unknown egress class %q", p.Name)
	}
	delete(a.s.egressClasses, p.Name)
	if !p.Config {
		a.s.classesAPI = true
	}
	return nil
}

func (a *applier) claimEnvChanged(p event.ClaimEnvChanged) error {
	c, err := a.liveClaim(p.Claim)
	if err != nil {
		return err
	}
	c.Env = mergeEnv(c.Env, p.Replace, p.Set, p.Remove)
	return nil
}

// --- check -------------------------------------------------------------------

// checkEgress verifies the egress records: valid policies, classes under
// their names, claims' env within the limits and none on an ended claim.
func (s *State) checkEgress(fail func(format string, args ...any)) {
	for _, k := range sortedPoolKeys(s.pools) {
		if p := s.pools[k].Egress; p != nil {
			if err := egress.Validate(*p, egress.ScopePool); err != nil {
				fail("pool %s egress: %v", k, err)
			}
		}
	}
	if len(s.egressClasses) > MaxEgressClasses {
		fail("%d egress classes", len(s.egressClasses))
	}
	for _, n := range sortedKeys(s.egressClasses) {
		c := s.egressClasses[n]
		if c.Name != n || !nameRE.MatchString(n) {
			fail("egress class %q: record %q", n, c.Name)
		}
		if err := egress.Validate(c.Policy, egress.ScopeClass); err != nil {
			fail("egress class %q: %v", n, err)
		}
	}
	for id, c := range s.claims { //fsm:unordered verification only; errors.Join order is not state
		if len(c.Env) > 0 && !c.Status.Live() {
			fail("ended claim %s keeps an env", id)
		}
		if err := egress.ValidEnv(c.Env); err != nil {
			fail("claim %s: %v", id, err)
		}
	}
}
