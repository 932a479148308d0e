package node

import (
	"context"
	"fmt"

	"github.com/sbxlog/sbxlog/fsm"
	"github.com/sbxlog/sbxlog/projections/auth"
)

// Tenants are state (fsm's tenant table, changed over /v1/tenants). The
// config's tenants seed it: at every start they are proposed as the whole
// set, marked as the config's, and the state applies them for as long as
// the API has never changed the set; once it has, the API's set wins and a
// config that differs from it is reported and ignored (the old daemon's
// rule: the API-applied set wins once written). A tenant's cap lives in
// its record only, so the limits carry no tenant caps.

// configTenants turns the config's tenants into specs: each token hashed
// (an old config's plaintext `token` included, which goes no further), the
// root token refused as a tenant's.
func configTenants(in []auth.TenantConfig, rootToken string) ([]fsm.TenantSpec, error) {
	specs := make([]fsm.TenantSpec, 0, len(in))
	rootHash := ""
	if rootToken != "" {
		rootHash = auth.HashToken(rootToken)
	}
	for _, t := range in {
		if err := t.Normalize(); err != nil {
			return nil, err
		}
		if !fsm.ValidTenantName(t.Name) {
			return nil, fmt.Errorf("%w: tenant name %q: want 1 to 63 letters, digits and ._:/- starting with a letter or digit", auth.ErrBadTenant, t.Name)
		}
		if t.TokenSHA256 == rootHash {
			return nil, fmt.Errorf("%w: tenant %q: its token must differ from api_token", auth.ErrBadTenant, t.Name)
		}
		specs = append(specs, fsm.TenantSpec{Name: t.Name, TokenSHA256: t.TokenSHA256, MaxClaims: t.MaxClaims, EgressClass: t.EgressClass})
	}
	return specs, nil
}

// tenantByHash is the authenticator's tenant source: the state's table.
func (n *Node) tenantByHash(sum [32]byte) (name string, stored [32]byte, ok bool) {
	n.Engine.View(func(st *fsm.State) {
		if t, found := st.TenantByHash(sum); found {
			name, stored, ok = t.Name, t.Sum(), true
		}
	})
	return name, stored, ok
}

// applyTenants proposes the config's tenants (a no-op when they are the
// state's already, or once the API owns the set).
func (n *Node) applyTenants(ctx context.Context) error {
	zl := n.zl
	var byAPI bool
	var cur []fsm.TenantRec
	n.Engine.View(func(st *fsm.State) { byAPI, cur = st.TenantsOwnedByAPI(), st.Tenants() })
	if byAPI {
		if len(n.tenants) > 0 && !sameTenants(cur, n.tenants) {
			zl.Warn().Int("config_tenants", len(n.tenants)).Int("tenants", len(cur)).
				Msg("the config's tenants differ from the set the API applied, and are ignored: /v1/tenants owns the tenants (GET /v1/tenants lists them)")
		}
		return nil
	}
	res, err := n.Engine.Propose(ctx, fsm.SetTenants{Meta: n.Engine.Meta(), Tenants: n.tenants, FromConfig: true})
	if err != nil {
		return fmt.Errorf("apply configured tenants: %w", err)
	}
	if len(res.Events) > 0 {
		zl.Info().Int("tenants", len(n.tenants)).Msg("tenants from the config applied; once /v1/tenants changes them, the API owns them")
	}
	return nil
}

// sameTenants reports whether the records are exactly the specs.
func sameTenants(recs []fsm.TenantRec, specs []fsm.TenantSpec) bool {
	if len(recs) != len(specs) {
		return false
	}
	byName := make(map[string]fsm.TenantRec, len(recs))
	for _, r := range recs {
		byName[r.Name] = r
	}
	for _, s := range specs {
		r, ok := byName[s.Name]
		if !ok || r.TokenSHA256 != s.TokenSHA256 || r.MaxClaims != s.MaxClaims || r.EgressClass != s.EgressClass {
			return false
		}
	}
	return true
}
