package apiclient

import (
	"context"
	"fmt"
	"strings"
)

// The data plane takes the sandbox's own token (the old clients' contract,
// unchanged). A client holding root need not be handed that token: root
// reads it with GET /v1/sandboxes/{id}, so a client made with
// WithSandboxLookup reads it there before each data-plane call (DialAgent,
// DialPort, Exec) on the sandbox named, instead of sending its own token.

// SandboxTokenPrefix starts every sandbox token.
const SandboxTokenPrefix = "sbt_"

type sandboxLookup struct {
	// fallback is the token used when the read gives none (a tenant's
	// token, a sandbox of another node); "" means the read's error.
	fallback string
}

// WithSandboxLookup returns a client whose data-plane calls use the
// sandbox's own token, read with this client's token (root's), else
// fallback. A client whose token is a sandbox token is returned as it is.
func (c *Client) WithSandboxLookup(fallback string) *Client {
	if strings.HasPrefix(c.token, SandboxTokenPrefix) {
		return c
	}
	cp := *c
	cp.lookup = &sandboxLookup{fallback: fallback}
	return &cp
}

// forSandbox is the client a data-plane call on sandbox id uses.
func (c *Client) forSandbox(ctx context.Context, id string) (*Client, error) {
	if c.lookup == nil {
		return c, nil
	}
	plain := *c
	plain.lookup = nil
	sb, err := plain.Sandbox(ctx, id)
	switch {
	case err == nil && sb.Token != "":
		return plain.WithToken(sb.Token), nil
	case c.lookup.fallback != "":
		return plain.WithToken(c.lookup.fallback), nil
	case err != nil:
		return nil, err
	}
	return nil, fmt.Errorf("sandbox %s: its own token is needed, and this token cannot read it (root's can)", id)
}

// HasToken says whether the client sends a token at all.
func (c *Client) HasToken() bool { return c.token != "" }
