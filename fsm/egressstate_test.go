package fsm

import (
	"fmt"
	"strings"
	"testing"

	"github.com/sbxlog/sbxlog/eventlog/event"
	"github.com/sbxlog/sbxlog/fsm/egress"
)

func policy(socks bool, rules ...egress.Rule) *egress.Policy {
	p := egress.Normalize(egress.Policy{Allow: rules, Socks5: socks})
	return &p
}

func entry(name string, hostOnly bool) egress.EnvEntry {
	return egress.EnvEntry{Name: name, Sealed: "k1:" + name, Size: len(name), HostOnly: hostOnly}
}

func TestEgressClasses(t *testing.T) {
	h := newHarness(t)
	desk := egress.Policy{Allow: []egress.Rule{{Host: "API.github.com", Methods: []string{"get"}}}}
	evs := h.do(PutEgressClass{Meta: h.meta(), Class: EgressClassSpec{Name: "desk", Policy: desk}}, event.TypeEgressClassPut)
	if p := payload[event.EgressClassPut](t, evs, 0); p.Policy.Allow[0].Host != "api.github.com" || p.Policy.Allow[0].Methods[0] != "GET" || p.Config || evs[0].AggID != "desk" {
		t.Fatalf("put %+v (agg %s): not normalized", p, evs[0].AggID)
	}
	h.do(PutEgressClass{Meta: h.meta(), Class: EgressClassSpec{Name: "desk", Policy: desk}})
	if c, ok := h.s.EgressClass("desk"); !ok || c.Policy.Allow[0].Host != "api.github.com" || !h.s.EgressClassesOwnedByAPI() {
		t.Fatalf("class %+v %v", c, ok)
	}
	for _, tc := range []struct {
		cmd  Command
		code Code
		msg  string
	}{
		{PutEgressClass{Meta: h.meta(), Class: EgressClassSpec{Name: "a b"}}, Invalid, "invalid egress class: name"},
		{PutEgressClass{Meta: h.meta(), Class: EgressClassSpec{Name: "x", Policy: egress.Policy{Allow: []egress.Rule{{Host: "a", Intercept: egress.InterceptAlways}}}}},
			Invalid, `egress class "x": allow[0]: intercept may only be set on a pool rule`},
		{PutEgressClass{Meta: h.meta(), Class: EgressClassSpec{Name: "x", Policy: egress.Policy{Allow: []egress.Rule{{Host: ""}}}}}, Invalid, "host must not be empty"},
		{RemoveEgressClass{Meta: h.meta(), Name: "nope"}, NotFound, ErrUnknownEgressClassMsg},
		{SetEgressClasses{Meta: h.meta(), Classes: []EgressClassSpec{{Name: "a"}, {Name: "a"}}}, Invalid, "duplicate egress class"},
	} {
		if r := h.rejects(tc.cmd, tc.code); !strings.Contains(r.Msg, tc.msg) {
			t.Errorf("%T: %q, want %q", tc.cmd, r.Msg, tc.msg)
		}
	}
	// A class a tenant names is not removed one at a time.
	h.do(PutTenant{Meta: h.meta(), Tenant: TenantSpec{Name: "acme", TokenSHA256: tokenHash("acme"), EgressClass: "desk"}}, event.TypeTenantPut)
	if r := h.rejects(RemoveEgressClass{Meta: h.meta(), Name: "desk"}, InvalidTransition); !strings.Contains(r.Msg, `named by tenant "acme"`) {
		t.Fatal(r.Msg)
	}
	h.do(PutTenant{Meta: h.meta(), Tenant: TenantSpec{Name: "acme"}}, event.TypeTenantPut)
	h.do(RemoveEgressClass{Meta: h.meta(), Name: "desk"}, event.TypeEgressClassRemoved)
	if _, ok := h.s.EgressClass("desk"); ok {
		t.Fatal("class kept")
	}
}

// The config's classes apply until the API changes the set, as tenants.
func TestEgressClassesFromConfig(t *testing.T) {
	h := newHarness(t)
	cfg := SetEgressClasses{Meta: h.meta(), FromConfig: true, Classes: []EgressClassSpec{{Name: "b"}, {Name: "a", Policy: *policy(false, egress.Rule{Host: "*"})}}}
	evs := h.do(cfg, event.TypeEgressClassPut, event.TypeEgressClassPut)
	if evs[0].AggID != "a" || !payload[event.EgressClassPut](t, evs, 0).Config || h.s.EgressClassesOwnedByAPI() {
		t.Fatal("config classes: not sorted, not marked, or owned by the API")
	}
	cfg.Meta = h.meta()
	h.do(cfg)
	h.do(SetEgressClasses{Meta: h.meta(), FromConfig: true, Classes: []EgressClassSpec{{Name: "c"}}},
		event.TypeEgressClassRemoved, event.TypeEgressClassRemoved, event.TypeEgressClassPut)
	h.do(SetEgressClasses{Meta: h.meta(), Classes: []EgressClassSpec{{Name: "d"}}}, event.TypeEgressClassRemoved, event.TypeEgressClassPut)
	if !h.s.EgressClassesOwnedByAPI() {
		t.Fatal("API set does not take ownership")
	}
	h.do(SetEgressClasses{Meta: h.meta(), FromConfig: true, Classes: []EgressClassSpec{{Name: "c"}}})
	if got := h.s.EgressClasses(); len(got) != 1 || got[0].Name != "d" {
		t.Fatalf("classes %+v", got)
	}
}

func TestPoolEgress(t *testing.T) {
	h := newHarness(t)
	h.node()
	pol := policy(true, egress.Rule{Host: "*.github.com", Secret: "gh"}, egress.Rule{Host: "*"})
	specs := []PoolSpec{{PoolKey: kA, Warm: 1}, {PoolKey: kB}}
	evs := h.do(ConfigurePools{Meta: h.meta(), Pools: specs, Egress: map[PoolKey]*egress.Policy{kA: pol}},
		event.TypePoolsConfigured, event.TypeEgressPoolSet, event.TypeGoldenBuildRequested, event.TypeGoldenBuildRequested)
	if p := payload[event.EgressPoolSet](t, evs, 1); p.Key != kA || !egress.Equal(p.Policy, pol) || evs[1].AggID != kA.String() {
		t.Fatalf("egress_pool_set %+v", p)
	}
	if !egress.Equal(h.s.PoolEgress(kA), pol) || h.s.PoolEgress(kB) != nil {
		t.Fatal("policies not in state")
	}
	// The same set again decides nothing; a policy alone changes alone.
	h.do(ConfigurePools{Meta: h.meta(), Pools: specs, Egress: map[PoolKey]*egress.Policy{kA: pol}})
	pol2 := policy(false, egress.Rule{Host: "api.github.com"})
	h.do(ConfigurePools{Meta: h.meta(), Pools: specs, Egress: map[PoolKey]*egress.Policy{kA: pol, kB: pol2}}, event.TypeEgressPoolSet)
	evs = h.do(ConfigurePools{Meta: h.meta(), Pools: specs, Egress: map[PoolKey]*egress.Policy{kB: pol2}}, event.TypeEgressPoolSet)
	if p := payload[event.EgressPoolSet](t, evs, 0); p.Key != kA || p.Policy != nil || h.s.PoolEgress(kA) != nil {
		t.Fatalf("removal %+v", p)
	}
	// A pool left out drains and keeps its policy for its claims.
	h.do(Claim{Meta: h.meta(), ID: claimID(1), Key: kB}, event.TypeClaimCreated, event.TypeVMCloneRequested)
	h.do(ConfigurePools{Meta: h.meta(), Pools: specs[:1]}, event.TypePoolsConfigured)
	if !egress.Equal(h.s.PoolEgress(kB), pol2) {
		t.Fatal("a draining pool lost its policy")
	}
	for _, tc := range []struct {
		egress map[PoolKey]*egress.Policy
		msg    string
	}{
		{map[PoolKey]*egress.Policy{kB: pol}, "which the pool set does not have"},
		{map[PoolKey]*egress.Policy{kA: policy(true, egress.Rule{Host: "a", Methods: []string{"GET"}})}, `pool "base/none/small" egress: socks5 needs a rule that admits CONNECT`},
		{map[PoolKey]*egress.Policy{kA: policy(false, egress.Rule{Host: "*", Intercept: egress.InterceptInject, Secret: "x"})}, "must not carry a secret"},
	} {
		if r := h.rejects(ConfigurePools{Meta: h.meta(), Pools: specs[:1], Egress: tc.egress}, Invalid); !strings.Contains(r.Msg, tc.msg) {
			t.Errorf("%q, want %q", r.Msg, tc.msg)
		}
	}
}

// A claim's policy: pinned facts at claim, policies as they are now.
func TestClaimEgressResolution(t *testing.T) {
	h := newHarness(t)
	h.node()
	pool := policy(false, egress.Rule{Host: "*"})
	desk := policy(false, egress.Rule{Host: "api.github.com"})
	h.do(PutEgressClass{Meta: h.meta(), Class: EgressClassSpec{Name: "desk", Policy: *desk}}, event.TypeEgressClassPut)
	h.do(PutEgressClass{Meta: h.meta(), Class: EgressClassSpec{Name: "ops", Policy: *policy(false, egress.Rule{Host: "*.ops.net"})}}, event.TypeEgressClassPut)
	h.do(PutTenant{Meta: h.meta(), Tenant: TenantSpec{Name: "acme", TokenSHA256: tokenHash("acme"), EgressClass: "desk"}}, event.TypeTenantPut)
	h.do(PutTenant{Meta: h.meta(), Tenant: TenantSpec{Name: "solo", TokenSHA256: tokenHash("solo")}}, event.TypeTenantPut)
	h.pools(PoolSpec{PoolKey: kA, Warm: 3})
	h.do(ConfigurePools{Meta: h.meta(), Pools: []PoolSpec{{PoolKey: kA, Warm: 3}}, Egress: map[PoolKey]*egress.Policy{kA: pool}}, event.TypeEgressPoolSet)
	h.goldenReady(kA)
	h.fill(kA)

	claim := func(n int, tenant string, key PoolKey, noEgress bool, want ...event.Type) ClaimRec {
		t.Helper()
		h.do(Claim{Meta: h.meta(), ID: claimID(n), Key: key, Tenant: tenant, NoEgress: noEgress}, want...)
		return h.claim(claimID(n))
	}
	root := claim(1, "", kA, false, event.TypeClaimCreated)
	acme := claim(2, "acme", kA, false, event.TypeClaimCreated)
	solo := claim(3, "solo", kA, false, event.TypeClaimCreated)
	off := claim(4, "acme", kA, true, event.TypeClaimCreated, event.TypeVMCloneRequested)
	if acme.EgressClass != "desk" || root.EgressClass != "" || !off.NoEgress || acme.Unpooled {
		t.Fatalf("pinned: %+v %+v %+v", acme, root, off)
	}
	unknown := PoolKey{Template: "other", Net: "none", Size: "small"}
	cold := claim(5, "acme", unknown, false, event.TypeClaimCreated, event.TypeVMCloneRequested)
	rootCold := claim(6, "", unknown, false, event.TypeClaimCreated, event.TypeVMCloneRequested)
	if !cold.Unpooled {
		t.Fatal("a claim of a key without a pool is not unpooled")
	}
	check := func(id string, wantBase, wantTenant *egress.Policy, wantOK bool) {
		t.Helper()
		e, ok := h.s.Egress(id)
		if ok != wantOK || !egress.Equal(e.Base, wantBase) || !egress.Equal(e.Tenant, wantTenant) {
			t.Fatalf("%s: Egress = %+v %v", id, e, ok)
		}
	}
	check(root.ID, pool, nil, true)
	check(acme.ID, pool, desk, true)
	check(solo.ID, nil, nil, false)
	check(off.ID, nil, nil, false)
	check(cold.ID, desk, nil, true)
	check(rootCold.ID, nil, nil, false)
	check("sb_ffffffffffffffff", nil, nil, false)

	// A class's new policy applies to its sandboxes at once; the tenant's
	// new class only to its next claims.
	desk2 := policy(false, egress.Rule{Host: "*.github.com"})
	h.do(PutEgressClass{Meta: h.meta(), Class: EgressClassSpec{Name: "desk", Policy: *desk2}}, event.TypeEgressClassPut)
	check(acme.ID, pool, desk2, true)
	h.do(PutTenant{Meta: h.meta(), Tenant: TenantSpec{Name: "acme", EgressClass: "ops"}}, event.TypeTenantPut)
	check(acme.ID, pool, desk2, true)
	// The pool's new policy too, and its removal leaves the claims none.
	pool2 := policy(false, egress.Rule{Host: "*.github.com"})
	h.do(ConfigurePools{Meta: h.meta(), Pools: []PoolSpec{{PoolKey: kA, Warm: 3}}, Egress: map[PoolKey]*egress.Policy{kA: pool2}}, event.TypeEgressPoolSet)
	check(root.ID, pool2, nil, true)
	h.do(ConfigurePools{Meta: h.meta(), Pools: []PoolSpec{{PoolKey: kA, Warm: 3}}}, event.TypeEgressPoolSet)
	check(root.ID, nil, nil, false)

	if c, ok := h.s.ClaimOfVM(root.VM); !ok || c.ID != root.ID {
		t.Fatalf("ClaimOfVM = %+v %v", c, ok)
	}
	h.do(Release{Meta: h.meta(), Claim: root.ID}, event.TypeClaimReleased, event.TypeVMDestroyRequested)
	if _, ok := h.s.ClaimOfVM(root.VM); ok {
		t.Fatal("ClaimOfVM answers for a released claim")
	}
	check(root.ID, nil, nil, false)
}

func TestClaimEnv(t *testing.T) {
	h := newHarness(t)
	h.setup(2)
	inj := egress.EnvEntry{Name: "GW_KEY", Sealed: "k1:gw", Size: 40, HostOnly: true, Inject: &egress.EnvInject{Hosts: []string{"gw.example.com"}, Header: "X-Api-Key"}}
	evs := h.do(Claim{Meta: h.meta(), ID: claimID(1), Key: kA, Env: []egress.EnvEntry{entry("MODE", false), inj}}, event.TypeClaimCreated)
	if p := payload[event.ClaimCreated](t, evs, 0); len(p.Env) != 2 || p.Env[0].Name != "GW_KEY" {
		t.Fatalf("claim env not sorted: %+v", p.Env)
	}
	names := func() string {
		var b []string
		for _, e := range h.claim(claimID(1)).Env {
			b = append(b, e.Name)
		}
		return strings.Join(b, ",")
	}
	if names() != "GW_KEY,MODE" {
		t.Fatal(names())
	}
	h.do(SetClaimEnv{Meta: h.meta(), Claim: claimID(1), Set: []egress.EnvEntry{entry("A", false)}, Remove: []string{"GW_KEY"}}, event.TypeClaimEnvChanged)
	if names() != "A,MODE" {
		t.Fatal(names())
	}
	// The same value again changes nothing; a new sealing of it does.
	h.do(SetClaimEnv{Meta: h.meta(), Claim: claimID(1), Set: []egress.EnvEntry{entry("A", false)}})
	h.do(SetClaimEnv{Meta: h.meta(), Claim: claimID(1), Set: []egress.EnvEntry{{Name: "A", Sealed: "k1:other", Size: 1}}}, event.TypeClaimEnvChanged)
	h.do(SetClaimEnv{Meta: h.meta(), Claim: claimID(1), Remove: []string{"NOT_THERE"}})
	h.do(SetClaimEnv{Meta: h.meta(), Claim: claimID(1), Replace: true, Set: []egress.EnvEntry{entry("Z", true)}}, event.TypeClaimEnvChanged)
	if names() != "Z" {
		t.Fatal(names())
	}
	many := make([]egress.EnvEntry, egress.MaxEnvEntries)
	for i := range many {
		many[i] = entry(fmt.Sprintf("E%02d", i), false)
	}
	for _, tc := range []struct {
		cmd  SetClaimEnv
		code Code
		msg  string
	}{
		{SetClaimEnv{Claim: "sb_ffffffffffffffff", Set: many[:1]}, NotFound, "unknown sandbox"},
		{SetClaimEnv{Claim: claimID(1), Set: many}, Invalid, "65 entries, at most 64"}, // merged with Z
		{SetClaimEnv{Claim: claimID(1), Set: []egress.EnvEntry{entry("1X", false)}}, Invalid, "must match"},
		{SetClaimEnv{Claim: claimID(1), Set: []egress.EnvEntry{entry("A", false), entry("A", true)}}, Invalid, "twice"},
		{SetClaimEnv{Claim: claimID(1), Set: []egress.EnvEntry{entry("A", false)}, Remove: []string{"A"}}, Invalid, "both set and removed"},
		{SetClaimEnv{Claim: claimID(1), Remove: []string{"a-b"}}, Invalid, "must match"},
		{SetClaimEnv{Claim: claimID(1), Set: []egress.EnvEntry{{Name: "I", Sealed: "k:x", Inject: inj.Inject}}}, Invalid, "inject needs guest: false"},
	} {
		tc.cmd.Meta = h.meta()
		if r := h.rejects(tc.cmd, tc.code); !strings.Contains(r.Msg, tc.msg) {
			t.Errorf("%+v: %q, want %q", tc.cmd, r.Msg, tc.msg)
		}
	}
	r := h.rejects(Claim{Meta: h.meta(), ID: claimID(2), Key: kA, Env: []egress.EnvEntry{entry("A", false), entry("A", false)}}, Invalid)
	if !strings.HasPrefix(r.Msg, "invalid env:") {
		t.Fatal(r.Msg)
	}
	// The env goes with the claim.
	h.hibernate(claimID(1))
	h.do(SetClaimEnv{Meta: h.meta(), Claim: claimID(1), Set: []egress.EnvEntry{entry("H", true)}}, event.TypeClaimEnvChanged)
	vm := h.claim(claimID(1)).VM
	h.do(Release{Meta: h.meta(), Claim: claimID(1)}, event.TypeClaimReleased, event.TypeVMDestroyRequested)
	_ = vm
	if env := h.claim(claimID(1)).Env; env != nil {
		t.Fatalf("ended claim keeps its env %+v", env)
	}
	h.rejects(SetClaimEnv{Meta: h.meta(), Claim: claimID(1), Set: many[:1]}, NotFound)
}

func TestRecordEgressUsage(t *testing.T) {
	h := newHarness(t)
	h.setup(1)
	c := h.claimWarm(1, kA)
	before, err := Decode(Encode(h.s))
	if err != nil {
		t.Fatal(err)
	}
	evs := h.do(RecordEgressUsage{Meta: h.meta(), Usage: []EgressUsage{
		{Claim: c.ID, FromNS: 1, ToNS: 2, Tx: 10, Rx: 20, Allowed: 3, Denied: 1},
		{Claim: claimID(9), FromNS: 1, ToNS: 2},              // nothing: skipped
		{Claim: claimID(8), FromNS: 1, ToNS: 2, Final: true}, // unknown to the state: no key
	}}, event.TypeEgressUsage, event.TypeEgressUsage)
	u := payload[event.EgressUsage](t, evs, 0)
	if u.Key == nil || *u.Key != kA || u.Tx != 10 || u.Rx != 20 || u.Allowed != 3 || u.Denied != 1 || evs[0].AggID != c.ID {
		t.Fatalf("usage %+v", u)
	}
	if u := payload[event.EgressUsage](t, evs, 1); u.Key != nil || !u.Final {
		t.Fatalf("usage of an unknown claim %+v", u)
	}
	// Only the applied count moved.
	before.applied = h.s.applied
	if Hash(before) != Hash(h.s) {
		t.Fatal("usage changed the state")
	}
	for _, bad := range []EgressUsage{{Claim: "x"}, {Claim: c.ID, Tx: -1}, {Claim: c.ID, FromNS: 2, ToNS: 1}} {
		h.rejects(RecordEgressUsage{Meta: h.meta(), Usage: []EgressUsage{bad}}, Invalid)
	}
}
