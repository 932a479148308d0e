package apiclient

import (
	"context"
	"net/http"
	"net/url"

	"github.com/sbxlog/sbxlog/projections/api"
)

// Promote is POST /v1/sandboxes/{id}/promote: sandbox id becomes template
// name (under its net and size). token is the sandbox's own token, the
// ownership proof; root may leave it empty and act by id. It returns once
// the template's golden is in the store.
func (c *Client) Promote(ctx context.Context, id, token, name string) (*api.PromoteResponse, error) {
	var out api.PromoteResponse
	if err := c.do(ctx, http.MethodPost, sandboxPath(id, "promote"), nil, api.PromoteRequest{Token: token, Template: name}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Templates is GET /v1/templates: every template the caller may claim here
// (configured pools, the driver's images, promoted templates).
func (c *Client) Templates(ctx context.Context) ([]api.TemplateEntry, error) {
	var out api.TemplatesResponse
	if err := c.do(ctx, http.MethodGet, "/v1/templates", nil, nil, &out); err != nil {
		return nil, err
	}
	return out.Templates, nil
}

// templateQuery is a template's key (and digest precondition) as DELETE
// /v1/templates and PUT /v1/templates/labels take it.
func templateQuery(k api.TemplateKey, digest string) url.Values {
	q := url.Values{"template": {k.Template}}
	if k.Net != "" {
		q.Set("net", k.Net)
	}
	if k.Size != "" {
		q.Set("size", k.Size)
	}
	if digest != "" {
		q.Set("digest", digest)
	}
	return q
}

// DeleteTemplate is DELETE /v1/templates; digest, when set, must be the
// template's (412 otherwise).
func (c *Client) DeleteTemplate(ctx context.Context, k api.TemplateKey, digest string) error {
	return c.do(ctx, http.MethodDelete, "/v1/templates", templateQuery(k, digest), nil, nil)
}

// SetTemplateLabels is PUT /v1/templates/labels: labels replace the
// template's (none: cleared).
func (c *Client) SetTemplateLabels(ctx context.Context, k api.TemplateKey, labels map[string]string, digest string) error {
	if labels == nil {
		labels = map[string]string{}
	}
	return c.do(ctx, http.MethodPut, "/v1/templates/labels", templateQuery(k, digest), api.LabelsRequest{Labels: labels}, nil)
}

// RebuildGolden is POST /v1/pools/rebuild (root): the pool's golden is
// built again; the old one is collected once its clones are gone.
func (c *Client) RebuildGolden(ctx context.Context, k api.TemplateKey) error {
	return c.do(ctx, http.MethodPost, "/v1/pools/rebuild", nil, api.RebuildRequest{Template: k.Template, Net: k.Net, Size: k.Size}, nil)
}

// Store is GET /v1/store (root): every snapshot dir the state references.
func (c *Client) Store(ctx context.Context) (*api.StoreResponse, error) {
	var out api.StoreResponse
	if err := c.do(ctx, http.MethodGet, "/v1/store", nil, nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}
