package fsm

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"

	"github.com/sbxlog/sbxlog/eventlog/event"
)

// Tenants are state: the set of tenant names, their tokens' SHA-256 and
// their caps is changed by commands (PUT and DELETE /v1/tenants..., and the
// config's tenants at start) and recorded as TenantPut and TenantRemoved
// events, so every replica and every restart authenticates the same
// tokens. The state never holds a token, only its hash.
//
// Ownership: the config's tenants (SetTenants with FromConfig) apply only
// while the API has never changed the set; the first API change makes the
// API the owner, and later config sets are no-ops (the old daemon's rule:
// the API-applied set wins once written).

// MaxTenants bounds the tenant set (the old daemon's 1 MiB PUT body holds
// about 8000).
const MaxTenants = 10_000

// tenantNameRE is the old daemon's name rule (the template rule).
var tenantNameRE = templateRE

// TenantSpec is a tenant as an operator sets it. TokenSHA256 is the
// lowercase hex SHA-256 of its token; empty keeps the stored one (a new
// tenant needs one). MaxClaims caps its live claims (0: no cap of its own,
// the limits' default applies); EgressClass names the egress class it uses
// (empty: none).
type TenantSpec struct {
	Name        string
	TokenSHA256 string
	MaxClaims   int
	EgressClass string
}

// TenantRec is a tenant's record.
type TenantRec struct {
	Name        string
	TokenSHA256 string
	MaxClaims   int
	EgressClass string

	sum [32]byte // TokenSHA256 decoded, the tenant index's key
}

// Sum returns the tenant's token hash as bytes.
func (t TenantRec) Sum() [32]byte { return t.sum }

// PutTenant creates or changes one tenant (PUT /v1/tenants/{name}).
type PutTenant struct {
	Meta
	Tenant TenantSpec
}

// RemoveTenant removes a tenant (DELETE /v1/tenants/{name}); its token
// stops authenticating, its live claims run on. An unknown name is a
// NotFound rejection whose message is "unknown tenant".
type RemoveTenant struct {
	Meta
	Name string
}

// SetTenants replaces the whole set (PUT /v1/tenants): tenants left out
// are removed. FromConfig marks the config's tenants proposed at start: they
// are ignored once the API has changed the set (TenantsOwnedByAPI).
type SetTenants struct {
	Meta
	Tenants    []TenantSpec
	FromConfig bool
	// Origin, when set, adopts another node's set (fleet-wide tenants):
	// its events carry the origin's version instead of this command's.
	Origin *event.TenantOrigin
}

// ErrUnknownTenantMsg is the message of RemoveTenant's rejection for a name
// not in the set: the old daemon's exact text, which its clients compare.
const ErrUnknownTenantMsg = "unknown tenant"

// ParseTokenHash decodes a tenant token's SHA-256 in its canonical form, 64
// lowercase hex digits.
func ParseTokenHash(h string) ([32]byte, bool) {
	var sum [32]byte
	if len(h) != 64 {
		return sum, false
	}
	for _, c := range []byte(h) {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return sum, false
		}
	}
	if _, err := hex.Decode(sum[:], []byte(h)); err != nil {
		return sum, false
	}
	return sum, true
}

// ValidTenantName reports whether name follows the old daemon's rule.
func ValidTenantName(name string) bool { return tenantNameRE.MatchString(name) }

// Tenant returns tenant name's record.
func (s *State) Tenant(name string) (TenantRec, bool) {
	t, ok := s.tenants[name]
	if !ok {
		return TenantRec{}, false
	}
	return *t, true
}

// TenantByHash returns the tenant whose token hashes to sum.
func (s *State) TenantByHash(sum [32]byte) (TenantRec, bool) {
	name, ok := s.tenantByHash[sum]
	if !ok {
		return TenantRec{}, false
	}
	return *s.tenants[name], true
}

// Tenants returns every tenant record, sorted by name.
func (s *State) Tenants() []TenantRec {
	out := make([]TenantRec, 0, len(s.tenants))
	for _, name := range sortedKeys(s.tenants) {
		out = append(out, *s.tenants[name])
	}
	return out
}

// TenantsWithClaims returns the names of the tenants that own live claims
// (tenants in the set and removed ones alike), sorted.
func (s *State) TenantsWithClaims() []string {
	names := sortedKeys(s.tenantLive)
	return slices.DeleteFunc(names, func(n string) bool { return n == "" })
}

// TenantsOwnedByAPI reports whether the API has changed the tenant set, so
// the config's tenants no longer apply.
func (s *State) TenantsOwnedByAPI() bool { return s.tenantsAPI }

// TenantCap returns tenant's cap on live claims (0 = none): its record's
// max_claims when it is in the set (0 there means the limits' default), and
// for a name not in the set the limits' (LimitsConfigured's tenant caps,
// written before tenants were state, then the default). The root tenant ""
// has no cap.
func (s *State) TenantCap(tenant string) int {
	if tenant == "" {
		return 0
	}
	if t := s.tenants[tenant]; t != nil {
		if t.MaxClaims > 0 {
			return t.MaxClaims
		}
		return s.limits.DefaultTenantCap
	}
	return s.limits.CapFor(tenant)
}

// tenantRec validates spec and merges it with the stored record: an empty
// token hash keeps the stored one.
func (s *State) tenantRec(spec TenantSpec) (TenantRec, error) {
	if !ValidTenantName(spec.Name) {
		return TenantRec{}, reject(Invalid, "invalid tenant: name %q must match %s", spec.Name, tenantNameRE)
	}
	if spec.MaxClaims < 0 {
		return TenantRec{}, reject(Invalid, "invalid tenant: tenant %q: max_claims %d is negative", spec.Name, spec.MaxClaims)
	}
	if spec.EgressClass != "" && !nameRE.MatchString(spec.EgressClass) {
		return TenantRec{}, reject(Invalid, "invalid tenant: tenant %q: egress class %q must match %s", spec.Name, spec.EgressClass, nameRE)
	}
	rec := TenantRec{Name: spec.Name, TokenSHA256: spec.TokenSHA256, MaxClaims: spec.MaxClaims, EgressClass: spec.EgressClass}
	if rec.TokenSHA256 == "" {
		cur := s.tenants[spec.Name]
		if cur == nil {
			return TenantRec{}, reject(Invalid, "invalid tenant: tenant %q needs a token", spec.Name)
		}
		rec.TokenSHA256 = cur.TokenSHA256
	}
	sum, ok := ParseTokenHash(rec.TokenSHA256)
	if !ok {
		return TenantRec{}, reject(Invalid, "invalid tenant: tenant %q: token_sha256 must be 64 lowercase hex digits", spec.Name)
	}
	rec.sum = sum
	return rec, nil
}

// classKnown refuses a tenant of the API that names an egress class the
// state does not hold: checked in the decision, so that no class removal
// commits between the check and the tenant (RemoveEgressClass refuses a
// class a tenant names). The config's tenants are not refused here: a node
// must start whatever its config names (its sandboxes get no policy).
func (s *State) classKnown(r TenantRec) error {
	if r.EgressClass != "" && s.egressClasses[r.EgressClass] == nil {
		return reject(Invalid, "invalid tenant: tenant %q names unknown egress class %q", r.Name, r.EgressClass)
	}
	return nil
}

func (d *decider) putTenant(r TenantRec, fromConfig bool, origin *event.TenantOrigin) {
	if cur := d.s.tenants[r.Name]; cur != nil && *cur == r {
		return
	}
	d.emit(event.TenantPut{Name: r.Name, TokenSHA256: r.TokenSHA256, MaxClaims: r.MaxClaims, EgressClass: r.EgressClass, Config: fromConfig, Origin: origin}, r.Name)
}

func (c PutTenant) decide(d *decider) error {
	r, err := d.s.tenantRec(c.Tenant)
	if err != nil {
		return err
	}
	if err := d.s.classKnown(r); err != nil {
		return err
	}
	if other, used := d.s.tenantByHash[r.sum]; used && other != r.Name {
		return reject(Invalid, "invalid tenant: tenant %q: token reused by tenant %q", r.Name, other)
	}
	if d.s.tenants[r.Name] == nil && len(d.s.tenants) >= MaxTenants {
		return reject(Invalid, "invalid tenant: %d tenants, at most %d", len(d.s.tenants)+1, MaxTenants)
	}
	d.putTenant(r, false, nil)
	return nil
}

func (c RemoveTenant) decide(d *decider) error {
	if d.s.tenants[c.Name] == nil {
		return reject(NotFound, ErrUnknownTenantMsg)
	}
	d.emit(event.TenantRemoved{Name: c.Name}, c.Name)
	return nil
}

// decide of a whole set records the removals first, then the tenants
// created or changed, each sorted by name; tenants left as they were
// record nothing.
func (c SetTenants) decide(d *decider) error {
	if c.FromConfig && d.s.tenantsAPI {
		return nil
	}
	if len(c.Tenants) > MaxTenants {
		return reject(Invalid, "invalid tenant: %d tenants, at most %d", len(c.Tenants), MaxTenants)
	}
	recs := make([]TenantRec, 0, len(c.Tenants))
	byName := make(map[string]bool, len(c.Tenants))
	byHash := make(map[[32]byte]string, len(c.Tenants))
	for _, spec := range c.Tenants {
		if byName[spec.Name] {
			return reject(Invalid, "invalid tenant: tenant %q listed twice", spec.Name)
		}
		byName[spec.Name] = true
		r, err := d.s.tenantRec(spec)
		if err != nil {
			return err
		}
		if !c.FromConfig {
			if err := d.s.classKnown(r); err != nil {
				return err
			}
		}
		if other, used := byHash[r.sum]; used {
			return reject(Invalid, "invalid tenant: tenant %q: token reused by tenant %q", r.Name, other)
		}
		byHash[r.sum] = r.Name
		recs = append(recs, r)
	}
	slices.SortFunc(recs, func(a, b TenantRec) int { return cmp.Compare(a.Name, b.Name) })
	for _, name := range sortedKeys(d.s.tenants) {
		if !byName[name] {
			d.emit(event.TenantRemoved{Name: name, Config: c.FromConfig, Origin: c.Origin}, name)
		}
	}
	for _, r := range recs {
		d.putTenant(r, c.FromConfig, c.Origin)
	}
	return nil
}

// tenantPut folds a TenantPut in. The index maps each hash to the tenant
// that took it last: within one whole-set batch two tenants may swap
// tokens, and Decide guarantees the set is consistent once the batch is
// applied.
func (a *applier) tenantPut(p event.TenantPut) error {
	s := a.s
	sum, ok := ParseTokenHash(p.TokenSHA256)
	if !ok || p.Name == "" || p.MaxClaims < 0 {
		return inconsistent("tenant %q: invalid record", p.Name)
	}
	if cur := s.tenants[p.Name]; cur != nil {
		if s.tenantByHash[cur.sum] == p.Name {
			delete(s.tenantByHash, cur.sum)
		}
	}
	s.tenants[p.Name] = &TenantRec{Name: p.Name, TokenSHA256: p.TokenSHA256, MaxClaims: p.MaxClaims, EgressClass: p.EgressClass, sum: sum}
	s.tenantByHash[sum] = p.Name
	if !p.Config {
		s.tenantsAPI = true
	}
	return nil
}

func (a *applier) tenantRemoved(p event.TenantRemoved) error {
	s := a.s
	cur := s.tenants[p.Name]
	if cur == nil {
		return inconsistent("removal of unknown tenant %q", p.Name)
	}
	if s.tenantByHash[cur.sum] == p.Name {
		delete(s.tenantByHash, cur.sum)
	}
	delete(s.tenants, p.Name)
	if !p.Config {
		s.tenantsAPI = true
	}
	return nil
}

// checkTenants verifies the tenant index against the records.
func (s *State) checkTenants(fail func(format string, args ...any)) {
	if len(s.tenants) > MaxTenants {
		fail("%d tenants, at most %d", len(s.tenants), MaxTenants)
	}
	for _, name := range sortedKeys(s.tenants) {
		t := s.tenants[name]
		sum, ok := ParseTokenHash(t.TokenSHA256)
		if t.Name != name || !ValidTenantName(name) || !ok || sum != t.sum || t.MaxClaims < 0 {
			fail("tenant %q: record %+v", name, *t)
		}
		if s.tenantByHash[t.sum] != name {
			fail("tenant %q: its token hash is indexed to %q", name, s.tenantByHash[t.sum])
		}
	}
	if len(s.tenantByHash) != len(s.tenants) {
		fail("tenant index has %d hashes for %d tenants", len(s.tenantByHash), len(s.tenants))
	}
}

// TenantDigest fingerprints a tenant set (names, token hashes, caps,
// classes; recs sorted by name as Tenants returns them): two nodes with
// equal digests hold the same set. GET /v1/tenants shows it and the fleet
// compares it across nodes.
func TenantDigest(recs []TenantRec) string {
	var set []byte
	for _, t := range recs {
		set = fmt.Appendf(set, "%q %s %d %q\n", t.Name, t.TokenSHA256, t.MaxClaims, t.EgressClass)
	}
	sum := sha256.Sum256(set)
	return hex.EncodeToString(sum[:])
}
