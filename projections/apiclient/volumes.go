package apiclient

import (
	"context"
	"encoding/json"
	"net/http"

	"github.com/sbxlog/sbxlog/projections/api"
)

// Volumes is GET /v1/volumes: the catalog entries the caller may use.
func (c *Client) Volumes(ctx context.Context) ([]api.VolumeInfo, error) {
	var out struct {
		Volumes []api.VolumeInfo `json:"volumes"`
	}
	if err := c.do(ctx, http.MethodGet, "/v1/volumes", nil, nil, &out); err != nil {
		return nil, err
	}
	return out.Volumes, nil
}

// AttachVolumes is POST /v1/sandboxes/{id}/volumes/attach: it returns the
// sandbox's volumes once the new ones are mounted.
func (c *Client) AttachVolumes(ctx context.Context, id string, vs []api.VolumeJSON) ([]api.VolumeJSON, error) {
	var out api.SandboxVolumes
	if err := c.do(ctx, http.MethodPost, sandboxPath(id, "volumes/attach"), nil, api.AttachVolumesRequest{Volumes: vs}, &out); err != nil {
		return nil, err
	}
	return out.Volumes, nil
}

// DetachVolumes is POST /v1/sandboxes/{id}/volumes/detach.
func (c *Client) DetachVolumes(ctx context.Context, id string, names []string) ([]api.VolumeJSON, error) {
	var out api.SandboxVolumes
	if err := c.do(ctx, http.MethodPost, sandboxPath(id, "volumes/detach"), nil, api.DetachVolumesRequest{Names: names}, &out); err != nil {
		return nil, err
	}
	return out.Volumes, nil
}

// SetInstanceMetadata is PUT /v1/sandboxes/{id}/instance-metadata (root).
func (c *Client) SetInstanceMetadata(ctx context.Context, id string, doc json.RawMessage) error {
	return c.do(ctx, http.MethodPut, sandboxPath(id, "instance-metadata"), nil, doc, nil)
}
