package fsm

import (
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"strings"
	"testing"

	"github.com/sbxlog/sbxlog/eventlog/event"
)

// tokenHash is the hex SHA-256 of token, as the API records it.
func tokenHash(token string) string {
	s := sha256.Sum256([]byte(token))
	return hex.EncodeToString(s[:])
}

func tenantNames(s *State) []string {
	var out []string
	for _, t := range s.Tenants() {
		out = append(out, t.Name)
	}
	return out
}

func TestTenantCommands(t *testing.T) {
	cases := []struct {
		name string
		run  func(t *testing.T, h *harness)
	}{
		{"put creates, changes, keeps the token, then is idempotent", func(t *testing.T, h *harness) {
			evs := h.do(PutTenant{Meta: h.meta(), Tenant: TenantSpec{Name: "acme", TokenSHA256: tokenHash("a"), MaxClaims: 2}}, event.TypeTenantPut)
			if p := payload[event.TenantPut](t, evs, 0); p.Name != "acme" || p.TokenSHA256 != tokenHash("a") || p.MaxClaims != 2 || p.Config || evs[0].AggID != "acme" {
				t.Fatalf("event %+v agg %q", p, evs[0].AggID)
			}
			// No token: the stored one is kept; caps and class take the
			// values sent.
			h.do(PutEgressClass{Meta: h.meta(), Class: EgressClassSpec{Name: "desk"}}, event.TypeEgressClassPut)
			h.do(PutTenant{Meta: h.meta(), Tenant: TenantSpec{Name: "acme", EgressClass: "desk"}}, event.TypeTenantPut)
			tr, _ := h.s.Tenant("acme")
			if tr.TokenSHA256 != tokenHash("a") || tr.MaxClaims != 0 || tr.EgressClass != "desk" {
				t.Fatalf("record %+v", tr)
			}
			h.do(PutTenant{Meta: h.meta(), Tenant: TenantSpec{Name: "acme", EgressClass: "desk"}})
			sum, _ := ParseTokenHash(tokenHash("a"))
			if got, ok := h.s.TenantByHash(sum); !ok || got.Name != "acme" || !h.s.TenantsOwnedByAPI() {
				t.Fatalf("by hash: %+v %v; api %v", got, ok, h.s.TenantsOwnedByAPI())
			}
			// Rotating the token drops the old hash.
			h.do(PutTenant{Meta: h.meta(), Tenant: TenantSpec{Name: "acme", TokenSHA256: tokenHash("b")}}, event.TypeTenantPut)
			if _, ok := h.s.TenantByHash(sum); ok {
				t.Fatal("the old token still resolves")
			}
		}},
		{"an egress class must exist when the API names it, the config's tenants excepted", func(t *testing.T, h *harness) {
			h.do(PutEgressClass{Meta: h.meta(), Class: EgressClassSpec{Name: "desk"}}, event.TypeEgressClassPut)
			h.do(RemoveEgressClass{Meta: h.meta(), Name: "desk"}, event.TypeEgressClassRemoved)
			spec := TenantSpec{Name: "acme", TokenSHA256: tokenHash("a"), EgressClass: "desk"}
			h.rejects(PutTenant{Meta: h.meta(), Tenant: spec}, Invalid)
			h.rejects(SetTenants{Meta: h.meta(), Tenants: []TenantSpec{spec}}, Invalid)
			h.do(SetTenants{Meta: h.meta(), Tenants: []TenantSpec{spec}, FromConfig: true}, event.TypeTenantPut)
			if tr, _ := h.s.Tenant("acme"); tr.EgressClass != "desk" {
				t.Fatalf("config tenant %+v", tr)
			}
		}},
		{"remove, then unknown", func(t *testing.T, h *harness) {
			h.do(PutTenant{Meta: h.meta(), Tenant: TenantSpec{Name: "acme", TokenSHA256: tokenHash("a")}}, event.TypeTenantPut)
			h.do(RemoveTenant{Meta: h.meta(), Name: "acme"}, event.TypeTenantRemoved)
			if r := h.rejects(RemoveTenant{Meta: h.meta(), Name: "acme"}, NotFound); r.Msg != "unknown tenant" {
				t.Fatalf("message %q", r.Msg)
			}
			if len(h.s.Tenants()) != 0 {
				t.Fatal("tenant left")
			}
		}},
		{"set replaces the set: removals first, then puts, by name", func(t *testing.T, h *harness) {
			h.do(SetTenants{Meta: h.meta(), Tenants: []TenantSpec{
				{Name: "zed", TokenSHA256: tokenHash("z")}, {Name: "acme", TokenSHA256: tokenHash("a")}, {Name: "old", TokenSHA256: tokenHash("o")},
			}}, event.TypeTenantPut, event.TypeTenantPut, event.TypeTenantPut)
			// acme unchanged (no token: kept), old removed, zed and acme
			// swap nothing, new added.
			evs := h.do(SetTenants{Meta: h.meta(), Tenants: []TenantSpec{
				{Name: "zed", TokenSHA256: tokenHash("z"), MaxClaims: 4}, {Name: "acme"}, {Name: "new", TokenSHA256: tokenHash("o")},
			}}, event.TypeTenantRemoved, event.TypeTenantPut, event.TypeTenantPut)
			if evs[0].AggID != "old" || evs[1].AggID != "new" || evs[2].AggID != "zed" {
				t.Fatalf("order %s %s %s", evs[0].AggID, evs[1].AggID, evs[2].AggID)
			}
			if got := tenantNames(h.s); !slices.Equal(got, []string{"acme", "new", "zed"}) {
				t.Fatalf("tenants %v", got)
			}
			// The same set again records nothing.
			h.do(SetTenants{Meta: h.meta(), Tenants: []TenantSpec{{Name: "acme"}, {Name: "new"}, {Name: "zed", MaxClaims: 4}}})
		}},
		{"two tenants swap tokens in one set", func(t *testing.T, h *harness) {
			h.do(SetTenants{Meta: h.meta(), Tenants: []TenantSpec{{Name: "x", TokenSHA256: tokenHash("1")}, {Name: "y", TokenSHA256: tokenHash("2")}}},
				event.TypeTenantPut, event.TypeTenantPut)
			h.do(SetTenants{Meta: h.meta(), Tenants: []TenantSpec{{Name: "x", TokenSHA256: tokenHash("2")}, {Name: "y", TokenSHA256: tokenHash("1")}}},
				event.TypeTenantPut, event.TypeTenantPut)
			s1, _ := ParseTokenHash(tokenHash("1"))
			if tr, _ := h.s.TenantByHash(s1); tr.Name != "y" {
				t.Fatalf("token 1 resolves to %q", tr.Name)
			}
		}},
		{"the config's set applies until the API changes the set", func(t *testing.T, h *harness) {
			cfg := []TenantSpec{{Name: "acme", TokenSHA256: tokenHash("a")}}
			evs := h.do(SetTenants{Meta: h.meta(), Tenants: cfg, FromConfig: true}, event.TypeTenantPut)
			if !payload[event.TenantPut](t, evs, 0).Config || h.s.TenantsOwnedByAPI() {
				t.Fatal("a config put marks the API as owner")
			}
			// An edited config applies again.
			cfg = append(cfg, TenantSpec{Name: "beta", TokenSHA256: tokenHash("b")})
			h.do(SetTenants{Meta: h.meta(), Tenants: cfg, FromConfig: true}, event.TypeTenantPut)
			h.do(RemoveTenant{Meta: h.meta(), Name: "beta"}, event.TypeTenantRemoved)
			if !h.s.TenantsOwnedByAPI() {
				t.Fatal("an API removal does not make the API the owner")
			}
			// From now on the config's set is ignored.
			h.do(SetTenants{Meta: h.meta(), Tenants: cfg, FromConfig: true})
			h.do(SetTenants{Meta: h.meta(), FromConfig: true})
			if got := tenantNames(h.s); !slices.Equal(got, []string{"acme"}) {
				t.Fatalf("tenants %v", got)
			}
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { c.run(t, newHarness(t)) })
	}
}

func TestTenantRejections(t *testing.T) {
	h := newHarness(t)
	h.do(PutTenant{Meta: h.meta(), Tenant: TenantSpec{Name: "acme", TokenSHA256: tokenHash("a")}}, event.TypeTenantPut)
	cases := []struct {
		name string
		cmd  Command
		code Code
		msg  string
	}{
		{"new tenant without a token", PutTenant{Meta: h.meta(), Tenant: TenantSpec{Name: "beta"}}, Invalid, `invalid tenant: tenant "beta" needs a token`},
		{"bad name", PutTenant{Meta: h.meta(), Tenant: TenantSpec{Name: "-x", TokenSHA256: tokenHash("x")}}, Invalid, "invalid tenant: name"},
		{"empty name", PutTenant{Meta: h.meta(), Tenant: TenantSpec{TokenSHA256: tokenHash("x")}}, Invalid, "invalid tenant: name"},
		{"upper-case hash", PutTenant{Meta: h.meta(), Tenant: TenantSpec{Name: "beta", TokenSHA256: strings.ToUpper(tokenHash("x"))}}, Invalid, "64 lowercase hex"},
		{"short hash", PutTenant{Meta: h.meta(), Tenant: TenantSpec{Name: "beta", TokenSHA256: "abcd"}}, Invalid, "64 lowercase hex"},
		{"negative cap", PutTenant{Meta: h.meta(), Tenant: TenantSpec{Name: "beta", TokenSHA256: tokenHash("x"), MaxClaims: -1}}, Invalid, "negative"},
		{"bad egress class", PutTenant{Meta: h.meta(), Tenant: TenantSpec{Name: "beta", TokenSHA256: tokenHash("x"), EgressClass: "a b"}}, Invalid, "egress class"},
		{"unknown egress class", PutTenant{Meta: h.meta(), Tenant: TenantSpec{Name: "beta", TokenSHA256: tokenHash("x"), EgressClass: "desk"}}, Invalid, `tenant "beta" names unknown egress class "desk"`},
		{"set: unknown egress class", SetTenants{Meta: h.meta(), Tenants: []TenantSpec{{Name: "acme", EgressClass: "desk"}}}, Invalid, `tenant "acme" names unknown egress class "desk"`},
		{"token of another tenant", PutTenant{Meta: h.meta(), Tenant: TenantSpec{Name: "beta", TokenSHA256: tokenHash("a")}}, Invalid, `token reused by tenant "acme"`},
		{"set: name twice", SetTenants{Meta: h.meta(), Tenants: []TenantSpec{{Name: "acme"}, {Name: "acme"}}}, Invalid, "listed twice"},
		{"set: shared token", SetTenants{Meta: h.meta(), Tenants: []TenantSpec{{Name: "acme"}, {Name: "beta", TokenSHA256: tokenHash("a")}}}, Invalid, "token reused"},
		{"set: new without token", SetTenants{Meta: h.meta(), Tenants: []TenantSpec{{Name: "beta"}}}, Invalid, "needs a token"},
		{"remove unknown", RemoveTenant{Meta: h.meta(), Name: "nobody"}, NotFound, "unknown tenant"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if r := h.rejects(c.cmd, c.code); !strings.Contains(r.Msg, c.msg) {
				t.Fatalf("message %q, want %q in it", r.Msg, c.msg)
			}
		})
	}
	if got := tenantNames(h.s); !slices.Equal(got, []string{"acme"}) {
		t.Fatalf("rejections changed the set: %v", got)
	}
}

// A tenant's cap is its record's once it is in the table; the limits' caps
// (LimitsConfigured, from before tenants were state) cap the others.
func TestTenantCaps(t *testing.T) {
	h := newHarness(t)
	h.setup(6)
	h.do(ConfigureLimits{Meta: h.meta(), DefaultTenantCap: 5, TenantCaps: map[string]int{"acme": 1, "legacy": 1}}, event.TypeLimitsConfigured)
	h.do(PutTenant{Meta: h.meta(), Tenant: TenantSpec{Name: "acme", TokenSHA256: tokenHash("a"), MaxClaims: 2}}, event.TypeTenantPut)
	h.do(PutTenant{Meta: h.meta(), Tenant: TenantSpec{Name: "free", TokenSHA256: tokenHash("f")}}, event.TypeTenantPut)
	if h.s.TenantCap("acme") != 2 || h.s.TenantCap("legacy") != 1 || h.s.TenantCap("free") != 5 || h.s.TenantCap("") != 0 {
		t.Fatalf("caps acme %d legacy %d free %d root %d", h.s.TenantCap("acme"), h.s.TenantCap("legacy"), h.s.TenantCap("free"), h.s.TenantCap(""))
	}
	h.do(Claim{Meta: h.meta(), ID: claimID(1), Key: kA, Tenant: "acme"}, event.TypeClaimCreated)
	h.do(Claim{Meta: h.meta(), ID: claimID(2), Key: kA, Tenant: "acme"}, event.TypeClaimCreated)
	if r := h.rejects(Claim{Meta: h.meta(), ID: claimID(3), Key: kA, Tenant: "acme"}, TooMany); !strings.Contains(r.Msg, "cap of 2") {
		t.Fatalf("message %q", r.Msg)
	}
	// Lowering the cap below the live count refuses new claims and
	// evicts none.
	h.do(PutTenant{Meta: h.meta(), Tenant: TenantSpec{Name: "acme", MaxClaims: 1}}, event.TypeTenantPut)
	h.rejects(Claim{Meta: h.meta(), ID: claimID(3), Key: kA, Tenant: "acme"}, TooMany)
	if h.s.TenantLive("acme") != 2 {
		t.Fatal("claims evicted")
	}
	// A removed tenant keeps its claims; they are listed as its.
	h.do(RemoveTenant{Meta: h.meta(), Name: "acme"}, event.TypeTenantRemoved)
	if got := h.s.TenantsWithClaims(); !slices.Equal(got, []string{"acme"}) || h.s.TenantLive("acme") != 2 {
		t.Fatalf("tenants with claims %v", got)
	}
}

func TestDrain(t *testing.T) {
	h := newHarness(t)
	h.setup(3)
	c := h.claimWarm(1, kA)
	warm := h.s.pools[kA].WarmVMs()
	if len(warm) != 2 {
		t.Fatalf("warm %v", warm)
	}
	evs := h.do(Drain{Meta: h.meta()}, event.TypeNodeDrained, event.TypeVMDestroyRequested, event.TypeVMDestroyRequested)
	for _, ev := range evs[1:] {
		if p := payload[event.VMDestroyRequested](t, []event.Event{ev}, 0); p.Reason != "drain" {
			t.Fatalf("reason %q", p.Reason)
		}
	}
	if !h.s.Draining() || len(RefillsNeeded(h.s)) != 0 || NeedsRefill(h.s) {
		t.Fatalf("draining %v, refills %v", h.s.Draining(), RefillsNeeded(h.s))
	}
	if in := h.s.Info(); in.Pools[0].Target != 0 || in.Pools[0].Warm != 0 {
		t.Fatalf("info while draining %+v", in.Pools[0])
	}
	h.do(Drain{Meta: h.meta()}) // idempotent
	r := h.rejects(Claim{Meta: h.meta(), ID: claimID(2), Key: kA}, TooMany)
	if r.Msg != DrainingMsg || !strings.Contains(r.Msg, "sbxctl uncordon") || r.Code.HTTPStatus() != 429 {
		t.Fatalf("rejection %+v", r)
	}
	// Live claims run on: hibernate, wake, renew, release.
	h.hibernate(c.ID)
	h.do(Wake{Meta: h.meta(), Claim: c.ID}, event.TypeWakeRequested)
	h.do(WakeDone{Meta: h.res(h.intentFor(c.VM, kA)), VM: c.VM}, event.TypeWoken)
	h.do(Renew{Meta: h.meta(), Claim: c.ID}, event.TypeClaimRenewed)
	for _, vm := range warm {
		h.do(VMDestroyed{Meta: h.res(h.intentFor(vm, kA)), VM: vm}, event.TypeVMDestroyed)
	}
	// A refill clone in flight when the drain began is destroyed as it
	// finishes: the decision that requested it came before the drain.
	h.do(Uncordon{Meta: h.meta()}, event.TypeNodeUncordoned)
	h.do(Uncordon{Meta: h.meta()}) // idempotent
	refill := h.do(Refill{Meta: h.meta(), Key: kA}, event.TypeVMCloneRequested, event.TypeVMCloneRequested, event.TypeVMCloneRequested)
	h.do(Drain{Meta: h.meta()}, event.TypeNodeDrained)
	vm := refill[0].AggID
	evs = h.do(VMCloned{Meta: h.res(h.intentFor(vm, kA)), VM: vm}, event.TypeVMCloned, event.TypeVMDestroyRequested)
	if payload[event.VMDestroyRequested](t, evs, 1).Reason != "drain" {
		t.Fatal("the finished refill clone is not destroyed for the drain")
	}
	// Uncordoned, the pool refills and claims are taken again.
	h.do(Uncordon{Meta: h.meta()}, event.TypeNodeUncordoned)
	for _, ev := range refill[1:] {
		h.do(VMCloned{Meta: h.res(h.intentFor(ev.AggID, kA)), VM: ev.AggID}, event.TypeVMCloned)
	}
	if !NeedsRefill(h.s) {
		t.Fatal("an uncordoned node does not refill")
	}
	h.do(Claim{Meta: h.meta(), ID: claimID(3), Key: kA}, event.TypeClaimCreated)
}
