package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"

	"github.com/sbxlog/sbxlog/fsm"
	"github.com/sbxlog/sbxlog/fsm/egress"
	"github.com/sbxlog/sbxlog/fsm/engine"
	"github.com/sbxlog/sbxlog/projections/auth"
	"github.com/sbxlog/sbxlog/projections/envseal"
)

// A claim's env, in the old daemon's shapes (GET, PUT and PATCH
// /v1/sandboxes/{id}/env, and the claim's "env"). Each value is sealed
// here, under the node's env key, before anything is proposed: the log,
// its snapshots, the stream and the journals only ever hold ciphertext.
// GET opens the guest entries and blanks the host-only ones.

// EgressOptions are the node's guarded egress, as the API needs it.
type EgressOptions struct {
	// Key seals and opens env values; without it env is refused.
	Key *envseal.Key
	// Secrets is the node's secret registry: rules may only name these.
	Secrets []egress.SecretSpec
	// CanIntercept: the node holds the CA a pool's intercept rules need.
	CanIntercept bool
	// Locked: the node locks every egress tap to its VM's proxy door, so
	// an egress claim's guest reaches the network only through the proxy
	// (net_route relay or none, never direct).
	Locked bool
	// Doors reports whether VM vm's egress proxy doors are open (nil: the
	// node runs no proxy).
	Doors func(vm string) bool
}

// EnvVar is one env entry on the wire: the value, guest (absent or true:
// the guest may see it; false: host-only, never in the guest) and, on a
// host-only entry, the claim credential's inject spec.
type EnvVar struct {
	Value  string            `json:"value"`
	Guest  *bool             `json:"guest,omitempty"`
	Inject *egress.EnvInject `json:"inject,omitempty"`
}

// UnmarshalJSON reads an entry strictly: only value, guest and inject,
// and guest must be true or false (a mistyped host-only flag must never
// fall back to the guest).
func (v *EnvVar) UnmarshalJSON(b []byte) error {
	var raw struct {
		Value  *string           `json:"value"`
		Guest  json.RawMessage   `json:"guest"`
		Inject *egress.EnvInject `json:"inject"`
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&raw); err != nil {
		return fmt.Errorf("env entry: %w", err)
	}
	*v = EnvVar{Inject: raw.Inject}
	if raw.Value != nil {
		v.Value = *raw.Value
	}
	if raw.Guest != nil {
		var g bool
		if err := json.Unmarshal(raw.Guest, &g); err != nil || string(bytes.TrimSpace(raw.Guest)) == "null" {
			return errors.New("env entry: guest must be true or false")
		}
		v.Guest = &g
	}
	return nil
}

// hostOnly reports whether the entry never enters the guest.
func (v *EnvVar) hostOnly() bool { return v.Guest != nil && !*v.Guest }

// EnvBody is the body of GET, PUT and PATCH /v1/sandboxes/{id}/env. In
// PATCH a null entry removes it; PUT and a claim take no null.
type EnvBody struct {
	Env map[string]*EnvVar `json:"env"`
}

// sealEnv checks entries in the clear, checks the credentials against
// the sandbox's policy, and seals each value for claim.
func (s *Server) sealEnv(claim string, env map[string]*EnvVar, pol egress.Effective, allowNull bool) (set []egress.EnvEntry, remove []string, err error) {
	if len(env) == 0 {
		return nil, nil, nil
	}
	key := s.egress.Key
	if key == nil {
		return nil, nil, errorf(http.StatusBadRequest, "invalid env: env is not supported on this node (no env key)")
	}
	if len(env) > egress.MaxEnvEntries {
		return nil, nil, errorf(http.StatusBadRequest, "invalid env: env has %d entries, at most %d", len(env), egress.MaxEnvEntries)
	}
	for _, name := range slices.Sorted(maps.Keys(env)) {
		v := env[name]
		if !egress.EnvNameRE.MatchString(name) {
			return nil, nil, errorf(http.StatusBadRequest, "invalid env: env name %q must match %s", name, egress.EnvNameRE)
		}
		if v == nil {
			if !allowNull {
				return nil, nil, errorf(http.StatusBadRequest, "invalid env: env %s is null: only PATCH removes an entry", name)
			}
			remove = append(remove, name)
			continue
		}
		if err := egress.ValidEnvValue(name, v.Value); err != nil {
			return nil, nil, errorf(http.StatusBadRequest, "invalid env: %v", err)
		}
		if v.Inject != nil {
			if !v.hostOnly() {
				return nil, nil, errorf(http.StatusBadRequest, "invalid env: env %s: inject needs guest: false, or the guest holds the value", name)
			}
			if err := egress.InjectGap(pol, name, *v.Inject, s.secretHeader); err != nil {
				return nil, nil, errorf(http.StatusBadRequest, "invalid env: %v", err)
			}
		}
		sealed, err := key.Seal(claim, name, []byte(v.Value))
		if err != nil {
			return nil, nil, err
		}
		set = append(set, egress.EnvEntry{Name: name, Sealed: sealed, Size: len(v.Value), HostOnly: v.hostOnly(), Inject: v.Inject})
	}
	return set, remove, nil
}

// secretHeader is the registry's header of a secret ("" when unknown).
func (s *Server) secretHeader(name string) string {
	for _, sp := range s.egress.Secrets {
		if sp.Name == name {
			return sp.Header
		}
	}
	return ""
}

// envSandbox finds a live sandbox the caller (root, or its tenant) may
// see; anything else, an ended sandbox included, is 404.
func (s *Server) envSandbox(r *http.Request, id auth.Identity) (fsm.ClaimRec, error) {
	c, err := s.visible(r, id)
	var oe *ownedElsewhere
	var oa *ownerAway
	if errors.As(err, &oe) || errors.As(err, &oa) {
		return c, err
	}
	if err != nil {
		return c, errorf(http.StatusNotFound, "%s", errUnknownSandbox)
	}
	if !c.Status.Live() {
		return c, endedError(&c)
	}
	return c, nil
}

// handleGetEnv answers GET /v1/sandboxes/{id}/env: guest entries with
// their values, host-only ones with value "" (guest false and the inject
// spec kept).
func (s *Server) handleGetEnv(w http.ResponseWriter, r *http.Request, id auth.Identity) error {
	c, err := s.envSandbox(r, id)
	if err != nil {
		return err
	}
	out := EnvBody{Env: map[string]*EnvVar{}}
	for _, e := range c.Env {
		v := &EnvVar{Inject: e.Inject}
		if e.HostOnly {
			f := false
			v.Guest = &f
		} else {
			if s.egress.Key == nil {
				return fmt.Errorf("env %s: %w: this node has no env key", e.Name, envseal.ErrOpen)
			}
			b, err := s.egress.Key.Open(c.ID, e.Name, e.Sealed)
			if err != nil {
				return fmt.Errorf("env %s: %w", e.Name, err)
			}
			v.Value = string(b)
		}
		out.Env[e.Name] = v
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// handlePutEnv replaces the env (PUT; {"env": {}} clears it).
func (s *Server) handlePutEnv(w http.ResponseWriter, r *http.Request, id auth.Identity) error {
	return s.changeEnv(w, r, id, true)
}

// handlePatchEnv merges: entries set, null entries removed, the rest kept.
func (s *Server) handlePatchEnv(w http.ResponseWriter, r *http.Request, id auth.Identity) error {
	return s.changeEnv(w, r, id, false)
}

func (s *Server) changeEnv(w http.ResponseWriter, r *http.Request, id auth.Identity, replace bool) error {
	c, err := s.envSandbox(r, id)
	if err != nil {
		return err
	}
	var req EnvBody
	if err := decodeBody(r, &req, false); err != nil {
		return err
	}
	var pol egress.Effective
	s.eng.View(func(st *fsm.State) { pol, _ = st.Egress(c.ID) })
	set, remove, err := s.sealEnv(c.ID, req.Env, pol, !replace)
	if err != nil {
		return err
	}
	if _, err := s.eng.ProposeNew(r.Context(), func(m fsm.Meta) fsm.Command {
		return fsm.SetClaimEnv{Meta: m, Claim: c.ID, Replace: replace, Set: set, Remove: remove}
	}, engine.Hooks{}); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
