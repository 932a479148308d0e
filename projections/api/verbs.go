package api

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/sbxlog/sbxlog/eventlog/event"
	"github.com/sbxlog/sbxlog/fsm"
	"github.com/sbxlog/sbxlog/fsm/engine"
	"github.com/sbxlog/sbxlog/projections/auth"
)

// RenewRequest is POST /v1/sandboxes/{id}/renew's body. The body is
// optional, as the old daemon's was: none means ttl_seconds 0.
type RenewRequest struct {
	// TTLSeconds is the new lease from now: 0 or negative is the default
	// (5 min), over 24 h is 24 h (the old daemon clamped, it did not refuse).
	TTLSeconds int64 `json:"ttl_seconds"`
	// OnExpire is the old daemon's action at the deadline (validOnExpire).
	OnExpire string `json:"on_expire,omitempty"`
}

// normalize validates on_expire and clamps the ttl (clampTTL).
func (r *RenewRequest) normalize(archive bool) error {
	if err := validOnExpire(r.OnExpire, archive); err != nil {
		return err
	}
	r.TTLSeconds = clampTTL(r.TTLSeconds)
	return nil
}

// The old daemon's 404 texts of the sandbox verbs, which its clients show
// (and the SDKs' Close takes a 404 for "already gone").
const (
	errUnknownSandbox = "unknown sandbox"
	errNotOwnedHere   = "not owned here"
)

// hiddenRoute is how a route that hides which sandboxes exist answers a
// caller it does not take.
type hiddenRoute struct {
	// unknown is the route's 404 text.
	unknown string
	// pre, when set, are the header and path checks the old daemon made
	// before the token (an upgrade's 426, a port's 400): dispatch runs them
	// for a caller with a bearer token, before authenticating it. They read
	// no body.
	pre func(w http.ResponseWriter, r *http.Request) error
}

// hiddenRoutes are the routes that answer callers as the old daemon's
// sandbox verbs and data plane did, by path: no bearer token is 401
// "missing bearer token" (even on a node without a root token), and a
// token that is no credential for the sandbox named (a wrong or forgotten
// sandbox token, another sandbox's, a kind the route does not take) is the
// same 404 an unknown id gets, so a client cannot tell an id that exists
// from one that does not.
var hiddenRoutes = map[string]hiddenRoute{
	"/v1/sandboxes/{id}/release":      {unknown: errUnknownSandbox},
	"/v1/sandboxes/{id}/hibernate":    {unknown: errUnknownSandbox},
	"/v1/sandboxes/{id}/wake":         {unknown: errUnknownSandbox},
	"/v1/sandboxes/{id}/renew":        {unknown: errUnknownSandbox},
	"/v1/sandboxes/{id}/owner":        {unknown: errNotOwnedHere},
	"/v1/sandboxes/{id}/agent":        {unknown: errUnknownSandbox, pre: agentPre},
	"/v1/sandboxes/{id}/ports/{port}": {unknown: errUnknownSandbox, pre: portPre},
	"/v1/sandboxes/{id}/exec":         {unknown: errUnknownSandbox},
}

// refuseSandboxCaller is dispatch's answer on a hidden route to a caller
// the route does not take.
func refuseSandboxCaller(bearer, unknown string) error {
	if bearer == "" {
		return errorf(http.StatusUnauthorized, "missing bearer token")
	}
	return errorf(http.StatusNotFound, "%s", unknown)
}

// target finds the sandbox a verb is about: root names any by id, a tenant
// its own tenant's (sbxlog's extension: the old daemon took only root and
// the sandbox's token here), a sandbox token its own. Anything else is the
// old daemon's 404; a root caller naming another node's sandbox gets
// visible's answer (404 naming the owner). It may have ended (release
// takes that); liveTarget refuses an ended one.
func (s *Server) target(r *http.Request, id auth.Identity) (fsm.ClaimRec, error) {
	c, err := s.visible(r, id)
	var he *httpError
	switch {
	case errors.As(err, &he):
		return c, errorf(http.StatusNotFound, "%s", errUnknownSandbox)
	case err != nil:
		return c, err
	}
	return c, nil
}

// liveTarget is target for the verbs that need the claim live: an ended
// one says it ended (410, ended.go).
func (s *Server) liveTarget(r *http.Request, id auth.Identity) (fsm.ClaimRec, error) {
	c, err := s.target(r, id)
	if err == nil && !c.Status.Live() {
		return c, endedError(&c)
	}
	return c, err
}

// settled maps a rejection of release about sandbox id: the claim gone
// from the state, or ended between target and the proposal, is the old
// daemon's 404; any other answer is returned as it is.
func (s *Server) settled(err error, id string) error {
	if _, isRej := fsm.AsRejection(err); isRej {
		if c, ok := s.claim(id); !ok || !c.Status.Live() {
			return errorf(http.StatusNotFound, "%s", errUnknownSandbox)
		}
	}
	return err
}

// settledLive is settled for the verbs that need the claim live: one that
// ended meanwhile says so (410, ended.go).
func (s *Server) settledLive(err error, id string) error {
	if _, isRej := fsm.AsRejection(err); isRej {
		if c, ok := s.claim(id); !ok || !c.Status.Live() {
			return s.goneOrUnknown(id)
		}
	}
	return err
}

// handleOwner answers GET /v1/sandboxes/{id}/owner: this node's address
// for a live sandbox it holds; for root, the owner of another node's
// sandbox from the cluster view. The old daemon took only the sandbox's
// token here; root and the sandbox's tenant are sbxlog's extensions.
func (s *Server) handleOwner(w http.ResponseWriter, r *http.Request, id auth.Identity) error {
	c, err := s.visible(r, id)
	if oe, ok := err.(*ownedElsewhere); ok {
		writeJSON(w, http.StatusOK, map[string]string{"owner_addr": oe.addr})
		return nil
	}
	if _, away := err.(*ownerAway); away {
		return err
	}
	if err != nil || !c.Status.Live() {
		return errorf(http.StatusNotFound, "%s", errNotOwnedHere)
	}
	writeJSON(w, http.StatusOK, map[string]string{"owner_addr": s.cfg.OwnerAddr})
	return nil
}

// handleRelease ends the claim and answers 204 once that is durable. An
// ended claim's release is an idempotent 204, as sbxlog always answered
// (the old daemon said 404, which its SDKs take for success too). Release
// does not queue behind a waiting hibernate or wake: that one answers 404
// once the claim ended, as the old daemon's did.
func (s *Server) handleRelease(w http.ResponseWriter, r *http.Request, id auth.Identity) error {
	if err := decodeBody(r, &struct{}{}, true); err != nil {
		return err
	}
	c, err := s.target(r, id)
	if err != nil {
		return err
	}
	if _, err := s.eng.ProposeNew(r.Context(), func(m fsm.Meta) fsm.Command { return fsm.Release{Meta: m, Claim: c.ID} }, engine.Hooks{}); err != nil {
		return s.settled(err, c.ID)
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// handleRenew answers POST /v1/sandboxes/{id}/renew: the deadline becomes
// now + the (clamped) ttl, longer or shorter, and the answer is it.
func (s *Server) handleRenew(w http.ResponseWriter, r *http.Request, id auth.Identity) error {
	var req RenewRequest
	if err := decodeBody(r, &req, true); err != nil {
		return err
	}
	if err := req.normalize(s.cfg.Archive); err != nil {
		return err
	}
	c, err := s.liveTarget(r, id)
	if err != nil {
		return err
	}
	res, err := s.eng.ProposeNew(r.Context(), func(m fsm.Meta) fsm.Command {
		return fsm.Renew{Meta: m, Claim: c.ID, TTLSeconds: req.TTLSeconds, OnExpire: req.OnExpire}
	}, engine.Hooks{})
	if err != nil {
		return s.settledLive(err, c.ID)
	}
	// The answer is this renew's own deadline, from its own event: the
	// state may already hold a concurrent renew's, not yet durable.
	deadline, ok := renewedDeadline(res.Events)
	if !ok {
		return fmt.Errorf("renew of %s made no ClaimRenewed event", c.ID)
	}
	writeJSON(w, http.StatusOK, map[string]string{"deadline": rfc3339(deadline)})
	return nil
}

// renewedDeadline is the deadline a renew's events set.
func renewedDeadline(evs []event.Event) (int64, bool) {
	for i := range evs {
		if evs[i].Type != event.TypeClaimRenewed {
			continue
		}
		p, err := evs[i].Decode()
		if r, ok := p.(event.ClaimRenewed); err == nil && ok {
			return r.DeadlineNS, true
		}
	}
	return 0, false
}
