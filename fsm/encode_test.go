package fsm

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"testing"

	"github.com/sbxlog/sbxlog/eventlog/event"
	"github.com/sbxlog/sbxlog/fsm/egress"
)

// richState has a record of every kind: pools (one draining, one parked,
// one with an egress policy), goldens in each status, VMs in each live
// status (one restarting, with a restart history), claims in each status
// (with pinned egress and env), tenants (set over the API), egress
// classes, the node draining, and open relays of each kind.
// testdata/state_v6.bin is its encoding by the last StateFormatV6 build:
// before changing it, freeze this version as richStateV6 for that file.
func richState(t *testing.T) *harness {
	h := richStateV4(t)
	h.do(SetEgressClasses{Meta: h.meta(), FromConfig: true, Classes: []EgressClassSpec{
		{Name: "desk", Policy: *policy(false, egress.Rule{Host: "api.github.com", Methods: []string{"GET"}, Ports: []uint16{443, 8443}})},
		{Name: "open"},
	}}, event.TypeEgressClassPut, event.TypeEgressClassPut)
	h.do(PutEgressClass{Meta: h.meta(), Class: EgressClassSpec{Name: "ops", Policy: *policy(false, egress.Rule{Host: "*.ops.net"})}}, event.TypeEgressClassPut)
	pool := policy(true, egress.Rule{Host: "api.github.com", Secret: "gh", Intercept: egress.InterceptAlways}, egress.Rule{Host: "*", Intercept: egress.InterceptInject})
	h.do(ConfigurePools{Meta: h.meta(), Pools: []PoolSpec{{PoolKey: kA, Warm: 4, WarmMax: 6, IdleHibernateSeconds: 300}, {PoolKey: kB, Warm: 1}},
		Egress: map[PoolKey]*egress.Policy{kA: pool}}, event.TypeEgressPoolSet)
	inj := egress.EnvEntry{Name: "GW_KEY", Sealed: "k1:c2VhbGVk", Size: 24, HostOnly: true,
		Inject: &egress.EnvInject{Hosts: []string{"gw.example.com", "*.gw.net"}, Query: "key", Body: true, Placeholder: "PH"}}
	h.do(SetClaimEnv{Meta: h.meta(), Claim: claimID(1), Set: []egress.EnvEntry{inj, entry("MODE", false)}}, event.TypeClaimEnvChanged)
	// Claims pinning a class, egress false and an unpooled key, made
	// between an uncordon and a second drain.
	h.do(Uncordon{Meta: h.meta()}, event.TypeNodeUncordoned)
	h.do(Claim{Meta: h.meta(), ID: claimID(7), Key: kA, Tenant: "beta"}, event.TypeClaimCreated, event.TypeVMCloneRequested)
	h.do(Claim{Meta: h.meta(), ID: claimID(8), Key: PoolKey{Template: "other", Net: "none", Size: "small"}, NoEgress: true,
		Env: []egress.EnvEntry{entry("TOKEN", true)}}, event.TypeClaimCreated, event.TypeVMCloneRequested)
	h.do(Drain{Meta: h.meta()}, event.TypeNodeDrained)
	return h
}

// richStateV4 is richState as it was when StateFormatV4 was current:
// testdata/state_v4.bin is its encoding by that build.
func richStateV4(t *testing.T) *harness {
	h := richStateV3(t)
	c := h.claim(claimID(5))
	h.do(VMCloned{Meta: h.res(h.intentFor(c.VM, kA)), VM: c.VM}, event.TypeVMCloned, event.TypeClaimServed)
	h.do(OpenRelay{Meta: h.meta(), ID: relayID(1), Claim: c.ID, Kind: RelayAgent}, event.TypeRelayOpened)
	h.do(OpenRelay{Meta: h.meta(), ID: relayID(2), Claim: c.ID, Kind: RelayPort, Port: 8080, Passive: true}, event.TypeRelayOpened)
	h.do(OpenRelay{Meta: h.meta(), ID: relayID(3), Claim: c.ID, Kind: RelayExec}, event.TypeRelayOpened)
	return h
}

// richStateV3 is richState as it was when StateFormatV3 was current:
// testdata/state_v3.bin is its encoding by that build.
func richStateV3(t *testing.T) *harness {
	h := richStateV2(t)
	h.do(SetTenants{Meta: h.meta(), FromConfig: true, Tenants: []TenantSpec{
		{Name: "acme", TokenSHA256: tokenHash("acme"), MaxClaims: 20},
		{Name: "beta", TokenSHA256: tokenHash("beta"), EgressClass: "desk"},
	}}, event.TypeTenantPut, event.TypeTenantPut)
	h.do(PutTenant{Meta: h.meta(), Tenant: TenantSpec{Name: "u:42/west", TokenSHA256: tokenHash("west"), MaxClaims: 3}}, event.TypeTenantPut)
	warm := len(h.s.pools[kB].warm) + len(h.s.pools[kA].warm)
	want := []event.Type{event.TypeNodeDrained}
	for range warm {
		want = append(want, event.TypeVMDestroyRequested)
	}
	h.do(Drain{Meta: h.meta()}, want...)
	return h
}

// richStateV2 is richState as it was when StateFormatV2 was current:
// testdata/state_v2.bin is its encoding by that build.
func richStateV2(t *testing.T) *harness {
	h := richStateV1(t)
	vm := h.claim(claimID(1)).VM
	pol := RestartPolicy{Max: 3, WindowNS: 600 * second}
	h.do(VMExited{Meta: h.meta(), VM: vm, Detail: "signal: killed", Restart: pol}, event.TypeVMExited, event.TypeVMRestartRequested)
	h.do(VMRestarted{Meta: h.res(h.intentFor(vm, kA)), VM: vm}, event.TypeVMRestarted)
	h.advance(second)
	h.do(VMExited{Meta: h.meta(), VM: vm, Restart: pol}, event.TypeVMExited, event.TypeVMRestartRequested)
	return h
}

// richStateV1 is richState as it was when StateFormatV1 was current:
// testdata/state_v1.bin is its encoding by that build.
func richStateV1(t *testing.T) *harness {
	h := newHarness(t)
	h.setup(4)
	h.do(ConfigureLimits{Meta: h.meta(), MaxClaims: 100, DefaultTenantCap: 10, TenantCaps: map[string]int{"acme": 20}}, event.TypeLimitsConfigured)
	h.pools(PoolSpec{PoolKey: kA, Warm: 4, WarmMax: 6, IdleHibernateSeconds: 300}, PoolSpec{PoolKey: kB, Warm: 1})
	h.do(GoldenFailed{Meta: h.res(h.intentFor("", kB)), Key: kB, Error: "boom"}, event.TypeGoldenFailed)
	h.do(Claim{Meta: h.meta(), ID: claimID(1), Key: kA, Tenant: "acme", Metadata: map[string]string{"b": "2", "a": "1"}}, event.TypeClaimCreated)
	h.claimWarm(2, kA)
	h.claimWarm(3, kA)
	h.claimWarm(4, kA)
	h.hibernate(claimID(2))
	h.do(Hibernate{Meta: h.meta(), Claim: claimID(3)}, event.TypeHibernateRequested)
	h.do(Release{Meta: h.meta(), Claim: claimID(4)}, event.TypeClaimReleased, event.TypeVMDestroyRequested)
	h.do(Claim{Meta: h.meta(), ID: claimID(5), Key: kA}, event.TypeClaimCreated, event.TypeVMCloneRequested)
	h.do(Refill{Meta: h.meta()}, event.TypeVMCloneRequested, event.TypeVMCloneRequested, event.TypeVMCloneRequested, event.TypeVMCloneRequested)
	k := kA
	h.do(CapacityFull{Meta: h.meta(), Key: &k}, event.TypePoolParked)
	return h
}

func TestEncodeRoundTrip(t *testing.T) {
	for _, s := range []*State{New(), richState(t).s} {
		enc := Encode(s)
		if enc[0] != StateFormatCurrent {
			t.Fatalf("first byte %d", enc[0])
		}
		back, err := Decode(enc)
		if err != nil {
			t.Fatal(err)
		}
		if err := back.Check(); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(Encode(back), enc) || Hash(back) != Hash(s) {
			t.Fatal("round trip changed the encoding")
		}
		// The rebuilt indexes behave like the live ones.
		if fmt.Sprint(Intents(back)) != fmt.Sprint(Intents(s)) {
			t.Fatalf("intents differ:\n%v\n%v", Intents(back), Intents(s))
		}
		a1, ok1 := back.NextTimer()
		a2, ok2 := s.NextTimer()
		if a1 != a2 || ok1 != ok2 || fmt.Sprint(back.Info()) != fmt.Sprint(s.Info()) {
			t.Fatal("timers or info differ after decode")
		}
	}
}

// The warm VMs' LIFO order is part of the state: the same VMs in another
// order encode differently, and a decoded state claims the same VM next.
func TestEncodeKeepsLIFOOrder(t *testing.T) {
	h := newHarness(t)
	h.setup(3)
	back, err := Decode(Encode(h.s))
	if err != nil {
		t.Fatal(err)
	}
	swapped := New()
	*swapped = *back
	p := *back.pools[kA]
	p.warm = slices.Clone(p.warm)
	p.warm[0], p.warm[2] = p.warm[2], p.warm[0]
	swapped.pools = map[PoolKey]*PoolRec{kA: &p}
	if Hash(swapped) == Hash(h.s) {
		t.Fatal("warm order not part of the hash")
	}
	cmd := Claim{Meta: h.meta(), ID: claimID(1), Key: kA}
	e1, _ := Decide(h.s, cmd)
	e2, _ := Decide(back, cmd)
	if !bytes.Equal(e1[0].Payload, e2[0].Payload) {
		t.Fatal("decoded state claims a different VM")
	}
}

// Snapshots written in an earlier format (V1 before restart histories, V2
// before drain and tenants, V3 before relays, V4 before guarded egress,
// V6 before the archive)
// still decode, to the same state the same events give today, and
// re-encode as the current format.
func TestDecodeOldFormats(t *testing.T) {
	for _, tc := range []struct {
		file   string
		format byte
		events func(*testing.T) *harness
	}{
		{"state_v1.bin", StateFormatV1, richStateV1},
		{"state_v2.bin", StateFormatV2, richStateV2},
		{"state_v3.bin", StateFormatV3, richStateV3},
		{"state_v4.bin", StateFormatV4, richStateV4},
		// Written by the build before the archive (StateFormatV7): a V6
		// snapshot has no archive section.
		{"state_v6.bin", StateFormatV6, richState},
	} {
		t.Run(tc.file, func(t *testing.T) {
			old, err := os.ReadFile(filepath.Join("testdata", tc.file))
			if err != nil {
				t.Fatal(err)
			}
			if old[0] != tc.format {
				t.Fatalf("pinned file has format %d", old[0])
			}
			s, err := Decode(old)
			if err != nil {
				t.Fatal(err)
			}
			want := tc.events(t).s
			if Hash(s) != Hash(want) {
				t.Fatalf("format %d snapshot decodes to another state than its events give", tc.format)
			}
			if enc := Encode(s); enc[0] != StateFormatCurrent || !bytes.Equal(enc, Encode(want)) {
				t.Fatalf("format %d state does not re-encode as the current format", tc.format)
			}
			// Every truncation of the old form is refused.
			for i := 1; i < len(old); i++ {
				if _, err := Decode(old[:i]); err == nil {
					t.Fatalf("format %d truncated at %d decoded", tc.format, i)
				}
			}
		})
	}
}

// The drain, the tenant table and its owner survive an encoding.
func TestTenantsAndDrainAreEncoded(t *testing.T) {
	h := richState(t)
	back, err := Decode(Encode(h.s))
	if err != nil {
		t.Fatal(err)
	}
	if !back.Draining() || !back.TenantsOwnedByAPI() || !slices.Equal(back.Tenants(), h.s.Tenants()) || len(back.Tenants()) != 3 {
		t.Fatalf("decoded: draining %v, api %v, tenants %+v", back.Draining(), back.TenantsOwnedByAPI(), back.Tenants())
	}
	sum, _ := ParseTokenHash(tokenHash("west"))
	if tr, ok := back.TenantByHash(sum); !ok || tr.Name != "u:42/west" || tr.MaxClaims != 3 {
		t.Fatalf("lookup by hash after decode: %+v %v", tr, ok)
	}
}

func TestRestartHistoryIsEncoded(t *testing.T) {
	h := richState(t)
	vm := h.claim(claimID(1)).VM
	v, _ := h.s.VM(vm)
	if v.Status != VMRestarting || len(v.Restarts) != 2 {
		t.Fatalf("VM %+v", v)
	}
	back, err := Decode(Encode(h.s))
	if err != nil {
		t.Fatal(err)
	}
	if bv, _ := back.VM(vm); !slices.Equal(bv.Restarts, v.Restarts) {
		t.Fatalf("restarts %v after decode, want %v", bv.Restarts, v.Restarts)
	}
	saved := Encode(h.s)
	h.s.vms[vm].Restarts = []int64{1}
	if bytes.Equal(Encode(h.s), saved) {
		t.Fatal("restart history not part of the encoding")
	}
}

func TestDecodeRefusesNewerFormat(t *testing.T) {
	enc := Encode(New())
	enc[0] = StateFormatCurrent + 1
	if _, err := Decode(enc); !errors.Is(err, ErrStateFormat) {
		t.Fatalf("err = %v", err)
	}
}

// Any truncation or byte flip is an error, never a panic or a state that
// fails its own invariants.
func TestDecodeCorrupt(t *testing.T) {
	enc := Encode(richState(t).s)
	if _, err := Decode(nil); !errors.Is(err, ErrStateCorrupt) {
		t.Fatalf("empty: %v", err)
	}
	for i := 1; i < len(enc); i++ {
		if _, err := Decode(enc[:i]); err == nil {
			t.Fatalf("truncated at %d decoded", i)
		}
	}
	for i := 1; i < len(enc); i++ {
		b := bytes.Clone(enc)
		b[i] ^= 0x5a
		s, err := Decode(b)
		if err == nil {
			if cerr := s.Check(); cerr != nil {
				t.Fatalf("flip at %d decoded into a state that fails Check: %v", i, cerr)
			}
		}
	}
	if _, err := Decode(append(bytes.Clone(enc), 0)); !errors.Is(err, ErrStateCorrupt) {
		t.Fatalf("trailing byte: %v", err)
	}
}

func FuzzDecode(f *testing.F) {
	f.Add(Encode(New()))
	f.Add([]byte{1, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := Decode(b)
		if err != nil {
			return
		}
		if !bytes.Equal(Encode(s), b) {
			// Non-canonical input (e.g. unsorted) may decode; it must
			// re-encode to a stable form.
			s2, err := Decode(Encode(s))
			if err != nil || Hash(s2) != Hash(s) {
				t.Fatalf("re-encoding unstable: %v", err)
			}
		}
	})
}

func TestHashDiffersOnEveryField(t *testing.T) {
	h := richState(t)
	base := Hash(h.s)
	c := h.s.claims[claimID(1)]
	for name, mut := range map[string]func(){
		"claim deadline":  func() { c.Deadline++ },
		"claim metadata":  func() { c.Metadata = map[string]string{"a": "1"} },
		"vm snapshot dir": func() { h.s.vms[c.VM].SnapshotDir = "x" },
		"golden error":    func() { h.s.goldens[kB].Error = "other" },
		"limits":          func() { h.s.limits.MaxClaims++ },
		"tenant cap":      func() { h.s.tenants["acme"].MaxClaims++ },
		"tenant class":    func() { h.s.tenants["beta"].EgressClass = "" },
		"draining":        func() { h.s.draining = false },
		"tenants owner":   func() { h.s.tenantsAPI = false },
		"classes owner":   func() { h.s.classesAPI = false },
		"class policy":    func() { h.s.egressClasses["desk"].Policy.Allow[0].Ports = []uint16{443} },
		"class added":     func() { h.s.egressClasses["x"] = &EgressClassRec{Name: "x"} },
		"pool policy":     func() { h.s.pools[kA].Egress = nil },
		"pool socks":      func() { p := *h.s.pools[kA].Egress; p.Socks5 = false; h.s.pools[kA].Egress = &p },
		"claim class":     func() { h.s.claims[claimID(7)].EgressClass = "ops" },
		"claim no egress": func() { h.s.claims[claimID(8)].NoEgress = false },
		"claim unpooled":  func() { h.s.claims[claimID(8)].Unpooled = false },
		"claim env":       func() { c.Env = c.Env[:1] },
		"env inject": func() {
			in := *c.Env[0].Inject
			in.Body = false
			c.Env = []egress.EnvEntry{{Name: "GW_KEY", Sealed: "k1:c2VhbGVk", Size: 24, HostOnly: true, Inject: &in}, c.Env[1]}
		},
		"applied": func() { h.s.applied++ },
	} {
		saved := Encode(h.s)
		mut()
		if Hash(h.s) == base {
			t.Errorf("%s: hash unchanged", name)
		}
		s, err := Decode(saved)
		if err != nil {
			t.Fatal(err)
		}
		h.s = s
		c = h.s.claims[claimID(1)]
	}
}

// SkipCheck skips only the invariant check: the state is the same, and an
// encoding that breaks an invariant the indexes cannot see decodes with it
// and is refused without it.
func TestDecodeSkipCheck(t *testing.T) {
	h := richState(t)
	enc := Encode(h.s)
	s, err := DecodeWith(enc, DecodeOptions{SkipCheck: true})
	if err != nil || Hash(s) != Hash(h.s) {
		t.Fatalf("skip-check decode: %v", err)
	}
	// A hibernating claim pointing at another claim's hibernated VM.
	h.s.claims[claimID(3)].VM = h.s.claims[claimID(2)].VM
	bad := Encode(h.s)
	if _, err := Decode(bad); !errors.Is(err, ErrStateCorrupt) {
		t.Fatalf("checked decode of a broken state: %v", err)
	}
	if _, err := DecodeWith(bad, DecodeOptions{SkipCheck: true}); err != nil {
		t.Fatalf("skip-check decode of a broken state: %v", err)
	}
	if _, err := DecodeWith(enc[:len(enc)-1], DecodeOptions{SkipCheck: true}); !errors.Is(err, ErrStateCorrupt) {
		t.Fatalf("skip-check decode of a truncated state: %v", err)
	}
}

// Classes, pool policies and the claims' pinned egress and env survive an
// encoding, and answer the same effective policies.
func TestEgressIsEncoded(t *testing.T) {
	h := richState(t)
	back, err := Decode(Encode(h.s))
	if err != nil {
		t.Fatal(err)
	}
	if !back.EgressClassesOwnedByAPI() || len(back.EgressClasses()) != 3 || !egress.Equal(back.PoolEgress(kA), h.s.PoolEgress(kA)) {
		t.Fatalf("classes %+v, pool policy %+v", back.EgressClasses(), back.PoolEgress(kA))
	}
	for _, id := range h.s.ClaimIDs() {
		a, _ := h.s.Claim(id)
		b, _ := back.Claim(id)
		if !reflect.DeepEqual(a.Env, b.Env) || a.EgressClass != b.EgressClass || a.NoEgress != b.NoEgress || a.Unpooled != b.Unpooled {
			t.Fatalf("claim %s: %+v after decode, want %+v", id, b, a)
		}
		e1, ok1 := h.s.Egress(id)
		e2, ok2 := back.Egress(id)
		if ok1 != ok2 || !egress.Equal(e1.Base, e2.Base) || !egress.Equal(e1.Tenant, e2.Tenant) {
			t.Fatalf("claim %s: effective policy differs after decode", id)
		}
	}
	if c, _ := back.Claim(claimID(7)); c.EgressClass != "desk" {
		t.Fatalf("claim 7 pinned %q", c.EgressClass)
	}
	if e, ok := back.Egress(claimID(7)); !ok || e.Tenant == nil || e.Tenant.Allow[0].Host != "api.github.com" {
		t.Fatalf("claim 7 policy %+v %v", e, ok)
	}
}
