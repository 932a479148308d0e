package apiclient

import (
	"context"
	"net/http"
	"net/url"

	"github.com/sbxlog/sbxlog/projections/api"
)

// Guarded egress's calls: a sandbox's env (root, or its tenant) and the
// egress classes (root).

func envPath(id string) string { return "/v1/sandboxes/" + url.PathEscape(id) + "/env" }

// Env is GET /v1/sandboxes/{id}/env: host-only entries come back with an
// empty value.
func (c *Client) Env(ctx context.Context, id string) (map[string]*api.EnvVar, error) {
	var out api.EnvBody
	if err := c.do(ctx, http.MethodGet, envPath(id), nil, nil, &out); err != nil {
		return nil, err
	}
	return out.Env, nil
}

// SetEnv is PUT /v1/sandboxes/{id}/env: it replaces the env (nil or empty
// clears it).
func (c *Client) SetEnv(ctx context.Context, id string, env map[string]*api.EnvVar) error {
	if env == nil {
		env = map[string]*api.EnvVar{}
	}
	return c.do(ctx, http.MethodPut, envPath(id), nil, api.EnvBody{Env: env}, nil)
}

// PatchEnv is PATCH /v1/sandboxes/{id}/env: entries set, nil entries
// removed, the others kept.
func (c *Client) PatchEnv(ctx context.Context, id string, patch map[string]*api.EnvVar) error {
	if patch == nil {
		patch = map[string]*api.EnvVar{}
	}
	return c.do(ctx, http.MethodPatch, envPath(id), nil, api.EnvBody{Env: patch}, nil)
}

// EgressClasses is GET /v1/egress/classes.
func (c *Client) EgressClasses(ctx context.Context) ([]api.EgressClassJSON, error) {
	var out api.EgressClassesJSON
	if err := c.do(ctx, http.MethodGet, "/v1/egress/classes", nil, nil, &out); err != nil {
		return nil, err
	}
	return out.Classes, nil
}

// PutEgressClass is PUT /v1/egress/classes/{name}.
func (c *Client) PutEgressClass(ctx context.Context, name string, policy api.PolicyJSON) error {
	return c.do(ctx, http.MethodPut, "/v1/egress/classes/"+url.PathEscape(name), nil, api.EgressClassRequest{Egress: &policy}, nil)
}

// DeleteEgressClass is DELETE /v1/egress/classes/{name}.
func (c *Client) DeleteEgressClass(ctx context.Context, name string) error {
	return c.do(ctx, http.MethodDelete, "/v1/egress/classes/"+url.PathEscape(name), nil, nil, nil)
}
