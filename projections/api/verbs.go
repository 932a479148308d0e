package api

import (
	"fmt"
	"net/http"
	"time"

	"github.com/sbxlog/sbxlog/eventlog/event"
	"github.com/sbxlog/sbxlog/fsm"
	"github.com/sbxlog/sbxlog/fsm/engine"
	"github.com/sbxlog/sbxlog/projections/auth"
)

// RenewRequest is POST /v1/sandboxes/{id}/renew's body.
type RenewRequest struct {
	TTLSeconds int64 `json:"ttl_seconds"`
}

func (s *Server) handleOwner(w http.ResponseWriter, r *http.Request, id auth.Identity) error {
	_, err := s.visible(r, id)
	if oe, ok := err.(*ownedElsewhere); ok {
		writeJSON(w, http.StatusOK, map[string]string{"owner_addr": oe.addr})
		return nil
	}
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, map[string]string{"owner_addr": s.cfg.OwnerAddr})
	return nil
}

// lifecycle runs a command about one visible sandbox and answers 204.
func (s *Server) lifecycle(w http.ResponseWriter, r *http.Request, id auth.Identity, mk func(fsm.Meta, string) fsm.Command) error {
	if err := decodeBody(r, &struct{}{}, true); err != nil {
		return err
	}
	c, err := s.visible(r, id)
	if err != nil {
		return err
	}
	if _, err := s.eng.ProposeNew(r.Context(), func(m fsm.Meta) fsm.Command { return mk(m, c.ID) }, engine.Hooks{}); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) handleRelease(w http.ResponseWriter, r *http.Request, id auth.Identity) error {
	return s.lifecycle(w, r, id, func(m fsm.Meta, c string) fsm.Command { return fsm.Release{Meta: m, Claim: c} })
}

func (s *Server) handleHibernate(w http.ResponseWriter, r *http.Request, id auth.Identity) error {
	return s.lifecycle(w, r, id, func(m fsm.Meta, c string) fsm.Command { return fsm.Hibernate{Meta: m, Claim: c} })
}

func (s *Server) handleWake(w http.ResponseWriter, r *http.Request, id auth.Identity) error {
	return s.lifecycle(w, r, id, func(m fsm.Meta, c string) fsm.Command { return fsm.Wake{Meta: m, Claim: c} })
}

func (s *Server) handleRenew(w http.ResponseWriter, r *http.Request, id auth.Identity) error {
	var req RenewRequest
	if err := decodeBody(r, &req, false); err != nil {
		return err
	}
	if req.TTLSeconds < 0 || req.TTLSeconds > int64(MaxTTL/time.Second) {
		return errorf(http.StatusBadRequest, "ttl_seconds %d out of [0, %d]", req.TTLSeconds, int64(MaxTTL/time.Second))
	}
	c, err := s.visible(r, id)
	if err != nil {
		return err
	}
	res, err := s.eng.ProposeNew(r.Context(), func(m fsm.Meta) fsm.Command {
		return fsm.Renew{Meta: m, Claim: c.ID, TTLSeconds: req.TTLSeconds}
	}, engine.Hooks{})
	if err != nil {
		return err
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
