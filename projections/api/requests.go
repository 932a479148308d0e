package api

import (
	"net/http"
	"time"

	"github.com/sbxlog/sbxlog/fsm"
)

// Claim TTL bounds: 0 (or less) means the default, more than MaxTTL is
// clamped to it, as the old daemon did; never an error.
const (
	DefaultTTL = 5 * time.Minute
	MaxTTL     = 24 * time.Hour
)

// ClaimRequest is POST /v1/claim's body. Besides sbxlog's fields it takes
// every field the old daemon's SDKs send: what this node can honour is
// honoured or ignored (engine; on_expire "destroy"; egress; env; volumes),
// what it cannot is refused with a 400 naming the feature, but only when it
// is asked for (on_expire "archive" on a node without an archive store).
type ClaimRequest struct {
	Template   string            `json:"template"`
	Net        string            `json:"net,omitempty"`
	Size       string            `json:"size,omitempty"`
	TTLSeconds int64             `json:"ttl_seconds,omitempty"`
	ClaimRef   string            `json:"claim_ref,omitempty"`
	Metadata   map[string]string `json:"metadata,omitempty"`
	// NoRedirect asks this node to serve the claim (cloning if it has no
	// warm VM) instead of answering with a redirect: a client following a
	// redirect sets it, so two nodes whose cluster views lag cannot bounce
	// a claim between them.
	NoRedirect bool `json:"no_redirect,omitempty"`
	// RequirePromoted asks for a promoted template only; this node has
	// none, so it is 404 unknown template.
	RequirePromoted bool `json:"require_promoted,omitempty"`
	// Engine is the old operator's engine hint; ignored.
	Engine string `json:"engine,omitempty"`
	// OnExpire: "destroy" (or empty), or "archive": the lease's end
	// archives the sandbox (needs the node's archive store).
	OnExpire string `json:"on_expire,omitempty"`
	// Egress false asks for no egress policy (absent or true: the
	// pool's, or the tenant's class's).
	Egress *bool `json:"egress,omitempty"`
	// Env is the claim's env ({value, guest?, inject?} per name), as
	// PUT /v1/sandboxes/{id}/env takes it.
	Env map[string]*EnvVar `json:"env,omitempty"`
	// Volumes are catalog volumes to attach (volumes.go);
	// VolumesAttachOnly: attach without mounting.
	Volumes           []VolumeJSON `json:"volumes,omitempty"`
	VolumesAttachOnly bool         `json:"volumes_attach_only,omitempty"`
}

// normalize fills defaults (net none, size small), clamps the TTL into
// (0, MaxTTL] (0 or less: the default) and validates; the old fields this
// node cannot honour are refused here, before anything is proposed.
func (c *ClaimRequest) normalize(archive bool) error {
	k := keyWithDefaults(c.Template, c.Net, c.Size)
	c.Net, c.Size = k.Net, k.Size
	if err := validPoolKey(c.Template, c.Net, c.Size); err != nil {
		return err
	}
	c.TTLSeconds = clampTTL(c.TTLSeconds)
	if len(c.ClaimRef) > fsm.MaxClaimRef {
		return errorf(http.StatusBadRequest, "claim_ref is over %d bytes", fsm.MaxClaimRef)
	}
	if err := validMetadata(c.Metadata); err != nil {
		return err
	}
	if err := validOnExpire(c.OnExpire, archive); err != nil {
		return err
	}
	return checkVolumes(c.Volumes, c.VolumesAttachOnly)
}

// validOnExpire checks the old daemon's action at a lease's deadline (a
// claim's or a renew's): "destroy" (or none), or "archive", which needs
// the node's archive store (archive_dir) and is refused, not ignored,
// without one.
func validOnExpire(v string, archive bool) error {
	switch v {
	case "", "destroy":
		return nil
	case "archive":
		if archive {
			return nil
		}
		return errorf(http.StatusBadRequest, "on_expire \"archive\" is not supported on this node (no archive store): use \"destroy\" or leave it out")
	}
	return errorf(http.StatusBadRequest, "on_expire %q must be destroy or archive", v)
}

// clampTTL is the old daemon's lease rule (a claim's and a renew's): 0 or
// less is the default, over MaxTTL is MaxTTL; the old daemon clamped, it
// did not refuse.
func clampTTL(s int64) int64 {
	switch {
	case s <= 0:
		return int64(DefaultTTL / time.Second)
	case s > int64(MaxTTL/time.Second):
		return int64(MaxTTL / time.Second)
	}
	return s
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
// fsm cannot disagree on what a valid template, net or size is. The message
// starts as the old daemon's did ("invalid pool key: ...").
func validPoolKey(template, netMode, size string) error {
	if err := fsm.ValidKey(fsm.PoolKey{Template: template, Net: netMode, Size: size}); err != nil {
		rej, _ := fsm.AsRejection(err)
		return errorf(http.StatusBadRequest, "invalid pool key: %s", rej.Msg)
	}
	return nil
}

// PoolsRequest is PUT /v1/pools's body; pools omitted are drained.
type PoolsRequest struct {
	Pools []PoolSpec `json:"pools"`
}

// PoolSpec is one pool in PUT /v1/pools, with the old daemon's fields: the
// archive settings need the node's archive store (refused otherwise, unless
// 0). Egress is the pool's egress policy (the old config's per-pool
// field; absent: none), changed at runtime.
type PoolSpec struct {
	Template                  string      `json:"template"`
	Net                       string      `json:"net"`
	Size                      string      `json:"size"`
	Warm                      int         `json:"warm"`
	WarmMax                   int         `json:"warm_max,omitempty"`
	IdleHibernateSeconds      int64       `json:"idle_hibernate_seconds,omitempty"`
	ArchiveAfterSeconds       int64       `json:"archive_after_seconds,omitempty"`
	ArchiveDeleteAfterSeconds int64       `json:"archive_delete_after_seconds,omitempty"`
	Egress                    *PolicyJSON `json:"egress,omitempty"`
}

// Spec is p as the log records it (its egress policy goes separately,
// Egress.Policy). The daemon's config pools are PoolSpecs too and go
// through it, so both ways in configure the same pool.
func (p *PoolSpec) Spec() fsm.PoolSpec {
	return fsm.PoolSpec{
		PoolKey: fsm.PoolKey{Template: p.Template, Net: p.Net, Size: p.Size},
		Warm:    p.Warm, WarmMax: p.WarmMax, IdleHibernateSeconds: p.IdleHibernateSeconds,
		ArchiveAfterSeconds: p.ArchiveAfterSeconds, ArchiveDeleteAfterSeconds: p.ArchiveDeleteAfterSeconds,
	}
}

func (p *PoolsRequest) validate(archive bool) error {
	if p.Pools == nil {
		return errorf(http.StatusBadRequest, "%s: missing pools", errInvalidBody)
	}
	if len(p.Pools) > fsm.MaxPools {
		return errorf(http.StatusBadRequest, "%d pools, at most %d", len(p.Pools), fsm.MaxPools)
	}
	seen := map[[3]string]bool{}
	for i := range p.Pools {
		s := &p.Pools[i]
		dk := keyWithDefaults(s.Template, s.Net, s.Size)
		s.Net, s.Size = dk.Net, dk.Size
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
		case s.ArchiveAfterSeconds != 0 && !archive:
			return errorf(http.StatusBadRequest, "pool %s: archive_after_seconds is not supported on this node (no archive store): use 0", s.Template)
		case s.ArchiveDeleteAfterSeconds != 0 && !archive:
			return errorf(http.StatusBadRequest, "pool %s: archive_delete_after_seconds is not supported on this node (no archive store): use 0", s.Template)
		}
	}
	return nil
}
