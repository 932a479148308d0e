package api

import (
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/sbxlog/sbxlog/fsm"
	"github.com/sbxlog/sbxlog/fsm/engine"
	"github.com/sbxlog/sbxlog/projections/auth"
)

// The tenant routes change the state's tenant table (fsm PutTenant,
// RemoveTenant, SetTenants), in the old daemon's shapes. A token sent here
// is hashed at once (SHA-256) and only the hash goes on; no answer carries
// a token or its hash.

// Tenant list paging bounds (the old daemon's).
const (
	DefaultTenantLimit = 1000
	MaxTenantLimit     = 10_000
)

// TenantJSON is one tenant in GET /v1/tenants.
type TenantJSON struct {
	Name        string `json:"name"`
	MaxClaims   int    `json:"max_claims,omitempty"`
	EgressClass string `json:"egress_class,omitempty"`
	Claims      int    `json:"claims"`
	Removed     bool   `json:"removed,omitempty"`
}

// TenantList is GET /v1/tenants's body and PUT /v1/tenants's answer.
type TenantList struct {
	Tenants []TenantJSON `json:"tenants"`
	Digest  string       `json:"digest"`
	Next    string       `json:"next,omitempty"`
}

// TenantSpec is one tenant in PUT /v1/tenants.
type TenantSpec struct {
	Name        string `json:"name"`
	Token       string `json:"token,omitempty"`
	MaxClaims   int    `json:"max_claims,omitempty"`
	EgressClass string `json:"egress_class,omitempty"`
}

// TenantsRequest is PUT /v1/tenants's body; tenants left out are removed.
type TenantsRequest struct {
	Tenants []TenantSpec `json:"tenants"`
}

// TenantRequest is PUT /v1/tenants/{name}'s body, every field optional.
type TenantRequest struct {
	Token       string `json:"token,omitempty"`
	MaxClaims   int    `json:"max_claims,omitempty"`
	EgressClass string `json:"egress_class,omitempty"`
}

// rootOnly admits the root token only, refusing a tenant token with the
// old daemon's 403 text (dispatch lets tenants reach the operator routes
// for that answer).
func rootOnly(id auth.Identity) error {
	if id.Kind != auth.Root {
		return errorf(http.StatusForbidden, "%s", errOperatorOnly)
	}
	return nil
}

// operatorOnly is rootOnly for the tenant routes, which on a node without
// a root token answer 400, as the old daemon refused tenants without an
// api_token.
func (s *Server) operatorOnly(id auth.Identity) error {
	if !s.auth.HasRoot() {
		return errorf(http.StatusBadRequest, "invalid tenant: tenants require api_token")
	}
	return rootOnly(id)
}

// tenantSpec validates what the fsm cannot see (the token itself: not the
// root token) and hashes the token; the fsm refuses an egress class that
// does not exist, as the old daemon did.
func (s *Server) tenantSpec(name, token string, maxClaims int, class string) (fsm.TenantSpec, error) {
	spec := fsm.TenantSpec{Name: name, MaxClaims: maxClaims, EgressClass: class}
	if token != "" {
		if s.auth.IsRoot(token) {
			return spec, errorf(http.StatusBadRequest, "invalid tenant: tenant %q: token must differ from api_token", name)
		}
		spec.TokenSHA256 = auth.HashToken(token)
	}
	return spec, nil
}

// handleTenants answers GET /v1/tenants[?after=&limit=].
func (s *Server) handleTenants(w http.ResponseWriter, r *http.Request, id auth.Identity) error {
	if err := s.operatorOnly(id); err != nil {
		return err
	}
	pg, err := tenantQuery(r)
	if err != nil {
		return err
	}
	return s.writeTenants(w, r, pg)
}

// tenantPaging is the page a tenant list's query asks for.
type tenantPaging struct {
	after string
	limit int
}

// tenantQuery reads ?after= and ?limit= (default DefaultTenantLimit).
func tenantQuery(r *http.Request) (tenantPaging, error) {
	q := r.URL.Query()
	pg := tenantPaging{after: q.Get("after"), limit: DefaultTenantLimit}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > MaxTenantLimit {
			return pg, errorf(http.StatusBadRequest, "limit must be 1..%d", MaxTenantLimit)
		}
		pg.limit = n
	}
	return pg, nil
}

// writeTenants answers the tenant list page pg, once the log is durable up
// to the state it reports.
func (s *Server) writeTenants(w http.ResponseWriter, r *http.Request, pg tenantPaging) error {
	var out TenantList
	if _, err := s.durableRead(r.Context(), func(st *fsm.State) { out = tenantPage(st, pg.after, pg.limit) }); err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// tenantPage is one page of the set in name order: tenants after after, at
// most limit, with next naming the last when more follow. The first page
// also lists the removed tenants that still own live claims here. digest
// fingerprints the whole set (names, token hashes, caps, classes), so two
// nodes with equal digests hold the same set. O(tenants).
func tenantPage(st *fsm.State, after string, limit int) TenantList {
	all := st.Tenants()
	out := TenantList{Tenants: []TenantJSON{}}
	out.Digest = fsm.TenantDigest(all)
	start, _ := slices.BinarySearchFunc(all, after, func(t fsm.TenantRec, name string) int { return strings.Compare(t.Name, name) })
	if start < len(all) && all[start].Name == after {
		start++
	}
	page := all[start:min(len(all), start+limit)]
	for _, t := range page {
		out.Tenants = append(out.Tenants, TenantJSON{Name: t.Name, MaxClaims: t.MaxClaims, EgressClass: t.EgressClass, Claims: st.TenantLive(t.Name)})
	}
	if start+len(page) < len(all) {
		out.Next = page[len(page)-1].Name
	}
	if after == "" {
		for _, name := range st.TenantsWithClaims() {
			if _, ok := st.Tenant(name); !ok {
				out.Tenants = append(out.Tenants, TenantJSON{Name: name, Claims: st.TenantLive(name), Removed: true})
			}
		}
		slices.SortStableFunc(out.Tenants, func(a, b TenantJSON) int { return strings.Compare(a.Name, b.Name) })
	}
	return out
}

// handlePutTenants replaces the whole set (PUT /v1/tenants) and answers
// the list as GET does; a missing or null list is the empty set.
func (s *Server) handlePutTenants(w http.ResponseWriter, r *http.Request, id auth.Identity) error {
	if err := s.operatorOnly(id); err != nil {
		return err
	}
	var req TenantsRequest
	if err := decodeBody(r, &req, false); err != nil {
		return err
	}
	specs := make([]fsm.TenantSpec, len(req.Tenants))
	for i, t := range req.Tenants {
		var err error
		if specs[i], err = s.tenantSpec(t.Name, t.Token, t.MaxClaims, t.EgressClass); err != nil {
			return err
		}
	}
	// The answer's page is read before the change: a bad query must not be
	// a 400 for a set already replaced.
	pg, err := tenantQuery(r)
	if err != nil {
		return err
	}
	if _, err := s.eng.ProposeNew(r.Context(), func(m fsm.Meta) fsm.Command { return fsm.SetTenants{Meta: m, Tenants: specs} }, engine.Hooks{}); err != nil {
		return err
	}
	return s.writeTenants(w, r, pg)
}

// handlePutTenant creates or changes one tenant (PUT /v1/tenants/{name}):
// a token left out keeps the stored one; max_claims and egress_class take
// the values sent.
func (s *Server) handlePutTenant(w http.ResponseWriter, r *http.Request, id auth.Identity) error {
	if err := s.operatorOnly(id); err != nil {
		return err
	}
	var req TenantRequest
	if err := decodeBody(r, &req, true); err != nil {
		return err
	}
	spec, err := s.tenantSpec(r.PathValue("name"), req.Token, req.MaxClaims, req.EgressClass)
	if err != nil {
		return err
	}
	if _, err := s.eng.ProposeNew(r.Context(), func(m fsm.Meta) fsm.Command { return fsm.PutTenant{Meta: m, Tenant: spec} }, engine.Hooks{}); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// handleDeleteTenant removes a tenant (DELETE /v1/tenants/{name}); an
// unknown name is 404 {"error":"unknown tenant"}, which old clients compare.
func (s *Server) handleDeleteTenant(w http.ResponseWriter, r *http.Request, id auth.Identity) error {
	if err := s.operatorOnly(id); err != nil {
		return err
	}
	name := r.PathValue("name")
	if _, err := s.eng.ProposeNew(r.Context(), func(m fsm.Meta) fsm.Command { return fsm.RemoveTenant{Meta: m, Name: name} }, engine.Hooks{}); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
