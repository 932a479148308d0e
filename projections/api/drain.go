package api

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/sbxlog/sbxlog/eventlog/event"
	"github.com/sbxlog/sbxlog/fsm"
	"github.com/sbxlog/sbxlog/fsm/engine"
	"github.com/sbxlog/sbxlog/projections/auth"
)

// DrainWait bounds how long POST /v1/drain waits for the warm VMs it
// destroys to be gone; past it the answer goes out with the drain in
// effect and the destruction continuing.
const DrainWait = time.Minute

// handleDrain drains the node (fsm Drain): new claims are refused with the
// old daemon's 429, refills stop, warm VMs are destroyed. Like the old
// daemon it answers once they are gone, with the info body (draining:
// true). The drain is state: a restarted node is still drained.
func (s *Server) handleDrain(w http.ResponseWriter, r *http.Request, id auth.Identity) error {
	if err := rootOnly(id); err != nil {
		return err
	}
	if err := decodeBody(r, &struct{}{}, true); err != nil {
		return err
	}
	res, err := s.eng.ProposeNew(r.Context(), func(m fsm.Meta) fsm.Command { return fsm.Drain{Meta: m} }, engine.Hooks{})
	if err != nil {
		return err
	}
	var vms []string
	for i := range res.Events {
		if res.Events[i].Type == event.TypeVMDestroyRequested {
			vms = append(vms, res.Events[i].AggID)
		}
	}
	if err := s.waitGone(r.Context(), vms); err != nil {
		return err
	}
	return s.writeInfo(w, r, id)
}

// handleUncordon ends a drain (fsm Uncordon): claims and refills resume.
// It answers the info body.
func (s *Server) handleUncordon(w http.ResponseWriter, r *http.Request, id auth.Identity) error {
	if err := rootOnly(id); err != nil {
		return err
	}
	if _, err := s.eng.ProposeNew(r.Context(), func(m fsm.Meta) fsm.Command { return fsm.Uncordon{Meta: m} }, engine.Hooks{}); err != nil {
		return err
	}
	return s.writeInfo(w, r, id)
}

// waitGone waits, at most DrainWait, until none of vms is in the state,
// watching for their destroyed events. It returns the wait's error only
// when the server began shutting down first (503 for the drain); past
// DrainWait the drain answers with its VMs still going.
func (s *Server) waitGone(ctx context.Context, vms []string) error {
	if len(vms) == 0 {
		return nil
	}
	ctx, cancel := s.waitContext(ctx, DrainWait)
	defer cancel()
	// Watched before the state is read, so no destruction slips past.
	signal := make(chan struct{}, 1)
	ws := make([]*watch, len(vms))
	for i, vm := range vms {
		ws[i] = s.watchOn(vm, signal, event.TypeVMDestroyed)
	}
	defer func() {
		for _, w := range ws {
			s.unwatch(w)
		}
	}()
	for {
		left := 0
		s.eng.View(func(st *fsm.State) {
			for _, vm := range vms {
				if _, ok := st.VM(vm); ok {
					left++
				}
			}
		})
		if left == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			switch {
			case s.stopping.Err() != nil:
				return ctx.Err()
			case errors.Is(ctx.Err(), context.DeadlineExceeded):
				s.zl.Warn().Int("vms", left).Dur("waited", DrainWait).Msg("api: drain answered before its warm VMs were destroyed")
			}
			return nil
		case <-signal:
		}
	}
}

// writeInfo answers the info body once the log is durable up to the state
// it reports (its log_seq): it acknowledges a change.
func (s *Server) writeInfo(w http.ResponseWriter, r *http.Request, id auth.Identity) error {
	out := s.info(id)
	if err := s.durableAt(r.Context(), out.LogSeq); err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}
