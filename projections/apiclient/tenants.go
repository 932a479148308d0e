package apiclient

import (
	"context"
	"net/http"
	"net/url"
	"strconv"

	"github.com/sbxlog/sbxlog/projections/api"
)

// The operator's calls (root token): the tenant set and the node's drain.

func tenantPath(name string) string { return "/v1/tenants/" + url.PathEscape(name) }

// TenantPage selects a page of GET /v1/tenants: the tenants after After
// (a previous page's Next), at most Limit (0: the server's default).
type TenantPage struct {
	After string
	Limit int
}

func (p TenantPage) query() url.Values {
	q := url.Values{}
	if p.After != "" {
		q.Set("after", p.After)
	}
	if p.Limit > 0 {
		q.Set("limit", strconv.Itoa(p.Limit))
	}
	return q
}

// Tenants is GET /v1/tenants: one page of the tenant set, by name.
func (c *Client) Tenants(ctx context.Context, page TenantPage) (*api.TenantList, error) {
	var out api.TenantList
	if err := c.do(ctx, http.MethodGet, "/v1/tenants", page.query(), nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// SetTenants is PUT /v1/tenants: it replaces the whole set (tenants left
// out are removed; an entry without a token keeps the stored one) and
// returns the set's first page.
func (c *Client) SetTenants(ctx context.Context, req api.TenantsRequest) (*api.TenantList, error) {
	if req.Tenants == nil {
		req.Tenants = []api.TenantSpec{}
	}
	var out api.TenantList
	if err := c.do(ctx, http.MethodPut, "/v1/tenants", nil, req, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// PutTenant is PUT /v1/tenants/{name}: it creates or changes one tenant
// (no token: keep the stored one).
func (c *Client) PutTenant(ctx context.Context, name string, req api.TenantRequest) error {
	return c.do(ctx, http.MethodPut, tenantPath(name), nil, req, nil)
}

// DeleteTenant is DELETE /v1/tenants/{name}; an unknown name is a 404
// *Error whose Message is "unknown tenant".
func (c *Client) DeleteTenant(ctx context.Context, name string) error {
	return c.do(ctx, http.MethodDelete, tenantPath(name), nil, nil, nil)
}

// Drain is POST /v1/drain: the node refuses new claims and destroys its
// warm VMs; it returns the node's info once they are gone.
func (c *Client) Drain(ctx context.Context) (*api.Info, error) {
	var out api.Info
	if err := c.do(ctx, http.MethodPost, "/v1/drain", nil, nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Uncordon is DELETE /v1/drain: claims and refills resume.
func (c *Client) Uncordon(ctx context.Context) (*api.Info, error) {
	var out api.Info
	if err := c.do(ctx, http.MethodDelete, "/v1/drain", nil, nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}
