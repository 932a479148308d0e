package api

import (
	"net/http"
	"time"

	"github.com/sbxlog/sbxlog/fsm"
)

// Claim TTL bounds: 0 means the default.
const (
	DefaultTTL = 5 * time.Minute
	MaxTTL     = 24 * time.Hour
)

// ClaimRequest is POST /v1/claim's body.
type ClaimRequest struct {
	Template   string            `json:"template"`
	Net        string            `json:"net,omitempty"`
	Size       string            `json:"size,omitempty"`
	TTLSeconds int64             `json:"ttl_seconds,omitempty"`
	ClaimRef   string            `json:"claim_ref,omitempty"`
	Metadata   map[string]string `json:"metadata,omitempty"`
	// NoRedirect asks this node to serve the claim (cloning if it has no
	// warm VM) instead of answering 307: a client following a redirect sets
	// it, so two nodes whose cluster views lag cannot bounce a claim
	// between them.
	NoRedirect bool `json:"no_redirect,omitempty"`
}

// normalize fills defaults (net none, size small, ttl 5 min) and validates.
func (c *ClaimRequest) normalize() (ttl time.Duration, err error) {
	if c.Net == "" {
		c.Net = "none"
	}
	if c.Size == "" {
		c.Size = "small"
	}
	if err := validPoolKey(c.Template, c.Net, c.Size); err != nil {
		return 0, err
	}
	switch {
	case c.TTLSeconds < 0:
		return 0, errorf(http.StatusBadRequest, "ttl_seconds %d is negative", c.TTLSeconds)
	case c.TTLSeconds == 0:
		ttl = DefaultTTL
	case c.TTLSeconds > int64(MaxTTL/time.Second):
		return 0, errorf(http.StatusBadRequest, "ttl_seconds %d is over the maximum %d", c.TTLSeconds, int64(MaxTTL/time.Second))
	default:
		ttl = time.Duration(c.TTLSeconds) * time.Second
	}
	if len(c.ClaimRef) > fsm.MaxClaimRef {
		return 0, errorf(http.StatusBadRequest, "claim_ref is over %d bytes", fsm.MaxClaimRef)
	}
	if err := validMetadata(c.Metadata); err != nil {
		return 0, err
	}
	return ttl, nil
}

func validMetadata(m map[string]string) error {
	if len(m) > fsm.MaxMetadataKeys {
		return errorf(http.StatusBadRequest, "metadata has %d keys, at most %d", len(m), fsm.MaxMetadataKeys)
	}
	for k, v := range m {
		if k == "" || len(k) > fsm.MaxMetadataKey {
			return errorf(http.StatusBadRequest, "metadata key %q: 1 to %d bytes", k, fsm.MaxMetadataKey)
		}
		if len(v) > fsm.MaxMetadataValue {
			return errorf(http.StatusBadRequest, "metadata value of %q is over %d bytes", k, fsm.MaxMetadataValue)
		}
	}
	return nil
}

// validPoolKey applies the state machine's own key rules, so the API and the
// fsm cannot disagree on what a valid template, net or size is.
func validPoolKey(template, netMode, size string) error {
	if err := fsm.ValidKey(fsm.PoolKey{Template: template, Net: netMode, Size: size}); err != nil {
		rej, _ := fsm.AsRejection(err)
		return errorf(http.StatusBadRequest, "%s", rej.Msg)
	}
	return nil
}

// PoolsRequest is PUT /v1/pools's body; pools omitted are drained.
type PoolsRequest struct {
	Pools []PoolSpec `json:"pools"`
}

// PoolSpec is one pool in PUT /v1/pools.
type PoolSpec struct {
	Template             string `json:"template"`
	Net                  string `json:"net"`
	Size                 string `json:"size"`
	Warm                 int    `json:"warm"`
	WarmMax              int    `json:"warm_max,omitempty"`
	IdleHibernateSeconds int64  `json:"idle_hibernate_seconds,omitempty"`
}

func (p *PoolsRequest) validate() error {
	if p.Pools == nil {
		return errorf(http.StatusBadRequest, "%s: missing pools", errInvalidBody)
	}
	if len(p.Pools) > fsm.MaxPools {
		return errorf(http.StatusBadRequest, "%d pools, at most %d", len(p.Pools), fsm.MaxPools)
	}
	seen := map[[3]string]bool{}
	for i := range p.Pools {
		s := &p.Pools[i]
		if s.Net == "" {
			s.Net = "none"
		}
		if s.Size == "" {
			s.Size = "small"
		}
		if err := validPoolKey(s.Template, s.Net, s.Size); err != nil {
			return err
		}
		k := [3]string{s.Template, s.Net, s.Size}
		if seen[k] {
			return errorf(http.StatusBadRequest, "pool %s/%s/%s listed twice", s.Template, s.Net, s.Size)
		}
		seen[k] = true
		switch {
		case s.Warm < 0 || s.Warm > fsm.MaxWarm:
			return errorf(http.StatusBadRequest, "pool %s: warm %d out of [0, 10000]", s.Template, s.Warm)
		case s.WarmMax != 0 && s.WarmMax < s.Warm:
			return errorf(http.StatusBadRequest, "pool %s: warm_max %d below warm %d", s.Template, s.WarmMax, s.Warm)
		case s.WarmMax > fsm.MaxWarm:
			return errorf(http.StatusBadRequest, "pool %s: warm_max %d over 10000", s.Template, s.WarmMax)
		case s.IdleHibernateSeconds < 0:
			return errorf(http.StatusBadRequest, "pool %s: idle_hibernate_seconds is negative", s.Template)
		}
	}
	return nil
}
