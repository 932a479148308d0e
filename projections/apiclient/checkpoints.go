package apiclient

import (
	"context"
	"net/http"
	"net/url"

	"github.com/sbxlog/sbxlog/projections/api"
)

// Checkpoint is POST /v1/sandboxes/{id}/checkpoint: it returns once the
// checkpoint is taken (the sandbox runs on, or stays hibernated).
func (c *Client) Checkpoint(ctx context.Context, id string, req api.CheckpointRequest) (*api.CheckpointRecord, error) {
	var out api.CheckpointResponse
	if err := c.do(ctx, http.MethodPost, sandboxPath(id, "checkpoint"), nil, req, &out); err != nil {
		return nil, err
	}
	return &out.Checkpoint, nil
}

// Checkpoints is GET /v1/checkpoints: the caller's, newest first.
func (c *Client) Checkpoints(ctx context.Context) ([]api.CheckpointRecord, error) {
	var out api.CheckpointList
	if err := c.do(ctx, http.MethodGet, "/v1/checkpoints", nil, nil, &out); err != nil {
		return nil, err
	}
	return out.Checkpoints, nil
}

// DeleteCheckpoint is DELETE /v1/checkpoints/{id}.
func (c *Client) DeleteCheckpoint(ctx context.Context, id string) error {
	return c.do(ctx, http.MethodDelete, "/v1/checkpoints/"+url.PathEscape(id), nil, nil, nil)
}

// ClaimCheckpoint is POST /v1/checkpoints/{id}/claim: a new sandbox cloned
// from the checkpoint, returned once it runs.
func (c *Client) ClaimCheckpoint(ctx context.Context, id string, req api.CheckpointClaimRequest) (*api.ClaimResponse, error) {
	var out api.ClaimResponse
	if err := c.do(ctx, http.MethodPost, "/v1/checkpoints/"+url.PathEscape(id)+"/claim", nil, req, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Fork is POST /v1/sandboxes/{id}/fork: req.Count children, returned once
// every one runs (or an error: none survived).
func (c *Client) Fork(ctx context.Context, id string, req api.ForkRequest) ([]api.ClaimResponse, error) {
	var out api.ForkResponse
	if err := c.do(ctx, http.MethodPost, sandboxPath(id, "fork"), nil, req, &out); err != nil {
		return nil, err
	}
	return out.Children, nil
}
