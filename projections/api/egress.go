package api

import (
	"net/http"

	"github.com/sbxlog/sbxlog/fsm"
	"github.com/sbxlog/sbxlog/fsm/egress"
	"github.com/sbxlog/sbxlog/fsm/engine"
	"github.com/sbxlog/sbxlog/projections/auth"
)

// Egress policies are state, changed here at runtime and applied to a
// sandbox's next connection: a pool's in PUT /v1/pools' pool spec
// ("egress", the old config's field), an egress class's at
// /v1/egress/classes/{name} (the old config's egress_classes entries,
// {"name", "egress"}), which tenants name with egress_class. The API
// checks what the state cannot see: the secret names against the node's
// registry and interception against its CA; the state checks the rest.

// PolicyJSON is a policy on the wire: the old shape, with allow always a
// list.
type PolicyJSON struct {
	Allow  []egress.Rule `json:"allow"`
	Socks5 bool          `json:"socks5,omitempty"`
}

func policyJSON(p *egress.Policy) *PolicyJSON {
	if p == nil {
		return nil
	}
	out := &PolicyJSON{Allow: p.Allow, Socks5: p.Socks5}
	if out.Allow == nil {
		out.Allow = []egress.Rule{}
	}
	return out
}

// Policy is p as the log records it.
func (p *PolicyJSON) Policy() egress.Policy { return egress.Policy{Allow: p.Allow, Socks5: p.Socks5} }

// EgressClassJSON is one egress class, as GET lists it.
type EgressClassJSON struct {
	Name   string      `json:"name"`
	Egress *PolicyJSON `json:"egress"`
}

// EgressClassesJSON is GET /v1/egress/classes's body.
type EgressClassesJSON struct {
	Classes []EgressClassJSON `json:"egress_classes"`
}

// EgressClassRequest is PUT /v1/egress/classes/{name}'s body.
type EgressClassRequest struct {
	Egress *PolicyJSON `json:"egress"`
}

// checkPolicy is the API's part of a policy's validation: every secret a
// rule names is in the registry; a pool's intercept rules need the CA.
// what names the policy as the old daemon's texts do (pool "T", egress
// class "x").
func (s *Server) checkPolicy(p egress.Policy, what string, pool bool) error {
	for i, r := range p.Allow {
		if r.Secret != "" && s.secretHeader(r.Secret) == "" {
			return errorf(http.StatusBadRequest, "%s egress: allow[%d]: unknown secret %q", what, i, r.Secret)
		}
	}
	if pool && egress.Intercepts(p) && !s.egress.CanIntercept {
		return errorf(http.StatusBadRequest, "%s: intercept needs egress_ca (root_cert + this node's intermediate_cert/intermediate_key)", what)
	}
	return nil
}

func (s *Server) handleGetEgressClasses(w http.ResponseWriter, r *http.Request, id auth.Identity) error {
	if err := rootOnly(id); err != nil {
		return err
	}
	out := EgressClassesJSON{Classes: []EgressClassJSON{}}
	s.eng.View(func(st *fsm.State) {
		for _, c := range st.EgressClasses() {
			out.Classes = append(out.Classes, EgressClassJSON{Name: c.Name, Egress: policyJSON(&c.Policy)})
		}
	})
	writeJSON(w, http.StatusOK, out)
	return nil
}

// handlePutEgressClass creates or replaces a class; the sandboxes of the
// tenants naming it get the new policy on their next connection.
func (s *Server) handlePutEgressClass(w http.ResponseWriter, r *http.Request, id auth.Identity) error {
	if err := rootOnly(id); err != nil {
		return err
	}
	var req EgressClassRequest
	if err := decodeBody(r, &req, false); err != nil {
		return err
	}
	name := r.PathValue("name")
	if req.Egress == nil {
		return errorf(http.StatusBadRequest, "egress class %q needs egress", name)
	}
	p := req.Egress.Policy()
	if err := s.checkPolicy(p, "egress class \""+name+"\"", false); err != nil {
		return err
	}
	if _, err := s.eng.ProposeNew(r.Context(), func(m fsm.Meta) fsm.Command {
		return fsm.PutEgressClass{Meta: m, Class: fsm.EgressClassSpec{Name: name, Policy: p}}
	}, engine.Hooks{}); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// handleDeleteEgressClass removes a class no tenant names.
func (s *Server) handleDeleteEgressClass(w http.ResponseWriter, r *http.Request, id auth.Identity) error {
	if err := rootOnly(id); err != nil {
		return err
	}
	name := r.PathValue("name")
	if _, err := s.eng.ProposeNew(r.Context(), func(m fsm.Meta) fsm.Command { return fsm.RemoveEgressClass{Meta: m, Name: name} }, engine.Hooks{}); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
