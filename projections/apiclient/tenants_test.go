package apiclient_test

import (
	"errors"
	"slices"
	"testing"

	"github.com/sbxlog/sbxlog/projections/api"
	"github.com/sbxlog/sbxlog/projections/apiclient"
)

func TestTenantsAndDrain(t *testing.T) {
	_, c := startNode(t, 1)
	ctx := ctxT(t)
	// A name with a '/' stays one path segment.
	if err := c.PutTenant(ctx, "u:42/west", api.TenantRequest{Token: "west-token", MaxClaims: 3}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WithToken("west-token").Sandboxes(ctx, apiclient.ListOptions{}); err != nil {
		t.Fatalf("the new tenant's token: %v", err)
	}
	l, err := c.Tenants(ctx, apiclient.TenantPage{Limit: 2})
	if err != nil || len(l.Tenants) != 2 || l.Next != "other" {
		t.Fatalf("first page: %+v, %v", l, err)
	}
	l, err = c.Tenants(ctx, apiclient.TenantPage{After: l.Next})
	if err != nil || len(l.Tenants) != 1 || l.Tenants[0] != (api.TenantJSON{Name: "u:42/west", MaxClaims: 3}) {
		t.Fatalf("second page: %+v, %v", l, err)
	}
	l, err = c.SetTenants(ctx, api.TenantsRequest{Tenants: []api.TenantSpec{{Name: "acme"}, {Name: "u:42/west"}}})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tn := range l.Tenants {
		names = append(names, tn.Name)
	}
	if !slices.Equal(names, []string{"acme", "u:42/west"}) {
		t.Fatalf("after SetTenants: %v", names)
	}
	if err := c.DeleteTenant(ctx, "u:42/west"); err != nil {
		t.Fatal(err)
	}
	var e *apiclient.Error
	if err := c.DeleteTenant(ctx, "u:42/west"); !errors.As(err, &e) || e.Status != 404 || e.Message != "unknown tenant" {
		t.Fatalf("second delete: %v", err)
	}
	if err := c.WithToken("acme-token").DeleteTenant(ctx, "acme"); apiclient.StatusOf(err) != 403 {
		t.Fatalf("a tenant deletes a tenant: %v", err)
	}

	in, err := c.Drain(ctx)
	if err != nil || !in.Draining {
		t.Fatalf("drain: %+v, %v", in, err)
	}
	if _, err := c.Claim(ctx, api.ClaimRequest{Template: "default"}); apiclient.StatusOf(err) != 429 {
		t.Fatalf("claim while draining: %v", err)
	}
	if in, err = c.Uncordon(ctx); err != nil || in.Draining {
		t.Fatalf("uncordon: %+v, %v", in, err)
	}
	if _, err := c.Claim(ctx, api.ClaimRequest{Template: "default"}); err != nil {
		t.Fatalf("claim after uncordon: %v", err)
	}
}
