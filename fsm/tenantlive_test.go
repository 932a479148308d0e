package fsm

import (
	"maps"
	"testing"

	"github.com/sbxlog/sbxlog/eventlog/event"
)

// TestTenantsLive: live claims per tenant, root's left out, a tenant whose
// last claim ended gone from the map, and the map a copy.
func TestTenantsLive(t *testing.T) {
	h := newHarness(t)
	h.setup(4)
	h.do(Claim{Meta: h.meta(), ID: claimID(1), Key: kA, Tenant: "acme"}, event.TypeClaimCreated)
	h.do(Claim{Meta: h.meta(), ID: claimID(2), Key: kA, Tenant: "acme"}, event.TypeClaimCreated)
	h.do(Claim{Meta: h.meta(), ID: claimID(3), Key: kA, Tenant: "beta"}, event.TypeClaimCreated)
	h.claimWarm(4, kA) // root
	if got, want := h.s.TenantsLive(), map[string]int{"acme": 2, "beta": 1}; !maps.Equal(got, want) {
		t.Fatalf("TenantsLive = %v, want %v", got, want)
	}
	h.do(Release{Meta: h.meta(), Claim: claimID(3)}, event.TypeClaimReleased, event.TypeVMDestroyRequested)
	got := h.s.TenantsLive()
	if want := map[string]int{"acme": 2}; !maps.Equal(got, want) {
		t.Fatalf("after beta's release: TenantsLive = %v, want %v", got, want)
	}
	got["acme"] = 99
	if n := h.s.TenantLive("acme"); n != 2 {
		t.Fatalf("changing the returned map changed the state: %d", n)
	}
}
