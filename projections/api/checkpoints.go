package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/sbxlog/sbxlog/eventlog/event"
	"github.com/sbxlog/sbxlog/fsm"
	"github.com/sbxlog/sbxlog/fsm/engine"
	"github.com/sbxlog/sbxlog/projections/auth"
)

// Checkpoints and forks, with the old daemon's fields, codes and scoping.
//
// POST /v1/sandboxes/{id}/checkpoint and .../fork take the node's API token
// (root or tenant) and the sandbox's own token in the body as the ownership
// proof; the root token, or the sandbox's tenant's, with no body token acts
// by id (as preview here). A
// checkpoint answers once taken (or failed), a fork once every child runs
// (or all failed together), waiting on the commits as hibernate does. A
// checkpoint is the caller's tenant's: a tenant lists and deletes only its
// own, anything else is 404; root sees every one. Claiming from one takes
// only its id (the capability to branch) and is attributed to the caller.

// The old daemon's texts.
const errUnknownCheckpoint = "unknown checkpoint"

// CheckpointRequest is POST /v1/sandboxes/{id}/checkpoint's body.
type CheckpointRequest struct {
	Token string `json:"token,omitempty"`
	Name  string `json:"name,omitempty"`
}

// CheckpointRecord is a checkpoint as the API shows it.
type CheckpointRecord struct {
	ID        string        `json:"id"`
	Name      string        `json:"name,omitempty"`
	SandboxID string        `json:"sandbox_id"`
	Key       event.PoolKey `json:"key"`
	Tenant    string        `json:"tenant,omitempty"`
	CreatedAt string        `json:"created_at"`
	// ExpiresAt is when the node's checkpoint TTL deletes it (sbxlog's
	// addition; absent without a TTL).
	ExpiresAt string `json:"expires_at,omitempty"`
}

// CheckpointResponse answers a checkpoint.
type CheckpointResponse struct {
	Checkpoint CheckpointRecord `json:"checkpoint"`
}

// CheckpointList answers GET /v1/checkpoints, newest first.
type CheckpointList struct {
	Checkpoints []CheckpointRecord `json:"checkpoints"`
}

// CheckpointClaimRequest is POST /v1/checkpoints/{id}/claim's body.
type CheckpointClaimRequest struct {
	TTLSeconds int64 `json:"ttl_seconds,omitzero"`
	// NoRedirect is the old SDKs' retry marker; checkpoints are this
	// node's, so it changes nothing.
	NoRedirect bool `json:"no_redirect,omitempty"`
}

// ForkRequest is POST /v1/sandboxes/{id}/fork's body.
type ForkRequest struct {
	Token          string `json:"token,omitempty"`
	Count          int    `json:"count"`
	TTLSeconds     int64  `json:"ttl_seconds,omitzero"`
	ClaimRefPrefix string `json:"claim_ref_prefix,omitempty"`
}

// ForkResponse lists the children, one claim answer each.
type ForkResponse struct {
	Children []ClaimResponse `json:"children"`
}

func checkpointRecord(ck *fsm.CheckpointRec) CheckpointRecord {
	rec := CheckpointRecord{ID: ck.ID, Name: ck.Name, SandboxID: ck.Claim, Key: ck.Key, Tenant: ck.Tenant, CreatedAt: rfc3339(ck.Created)}
	if ck.Expires != 0 {
		rec.ExpiresAt = rfc3339(ck.Expires)
	}
	return rec
}

// newCheckpointID mints "ck_" + 16 hex digits, the first 4 this node's
// tag (origins.go), so another node asked to claim it knows whom to import
// it from (checkpointblob.go).
func (s *Server) newCheckpointID() string { return "ck_" + newClaimID(s.idTag)[3:] }

// owned finds the live sandbox of the path for a checkpoint or fork: one the
// caller sees (root: any, a tenant: its own), whose token the body carries
// when it carries one, as preview's. Anything else is the old daemon's 404.
func (s *Server) owned(r *http.Request, id auth.Identity, token string) (fsm.ClaimRec, error) {
	c, err := s.visible(r, id)
	if err != nil {
		return c, err
	}
	if !c.Status.Live() || (token != "" && !s.auth.IsSandboxToken(token, c.ID, tokenGenOf(&c))) {
		return c, errorf(http.StatusNotFound, "%s", errUnknownSandbox)
	}
	return c, nil
}

// handleCheckpoint takes a checkpoint of a sandbox and answers it once taken.
func (s *Server) handleCheckpoint(w http.ResponseWriter, r *http.Request, id auth.Identity) error {
	var req CheckpointRequest
	if err := decodeBody(r, &req, true); err != nil {
		return err
	}
	c, err := s.owned(r, id, req.Token)
	if err != nil {
		return err
	}
	ckID := s.newCheckpointID()
	wt := s.watch(ckID, event.TypeCheckpointTaken, event.TypeCheckpointFailed)
	defer s.unwatch(wt)
	res, err := s.eng.ProposeNew(r.Context(), func(m fsm.Meta) fsm.Command {
		return fsm.Checkpoint{Meta: m, ID: ckID, Claim: c.ID, Tenant: id.Tenant, Name: req.Name, TTLSeconds: int64(s.cfg.CheckpointTTL / time.Second)}
	}, engine.Hooks{})
	if err != nil {
		return s.settled(err, c.ID)
	}
	ctx, cancel := s.waitContext(r.Context(), s.cfg.LifecycleWait)
	defer cancel()
	ev, err := s.next(ctx, wt, res.Seq, event.TypeCheckpointTaken, event.TypeCheckpointFailed)
	if err == nil {
		err = s.durableAt(ctx, ev.Seq)
	}
	if err != nil {
		return s.unfinishedErr(r, c.ID, ckID, err)
	}
	if ev.Type == event.TypeCheckpointFailed {
		msg := "checkpoint failed"
		if p, derr := ev.Decode(); derr == nil {
			msg += ": " + p.(event.CheckpointFailed).Error
		}
		s.zl.Warn().Str("sandbox", c.ID).Str("checkpoint", ckID).Msg("api: " + msg)
		return &httpError{status: http.StatusInternalServerError, id: c.ID, msg: msg}
	}
	var ck fsm.CheckpointRec
	s.eng.View(func(st *fsm.State) { ck, _ = st.Checkpoint(ckID) })
	if ck.ID == "" {
		// Taken, then deleted before this answer: it existed.
		ck = fsm.CheckpointRec{ID: ckID, Name: req.Name, Claim: c.ID, Key: c.Key, Tenant: id.Tenant, Created: ev.Time}
	}
	writeJSON(w, http.StatusOK, CheckpointResponse{Checkpoint: checkpointRecord(&ck)})
	return nil
}

// unfinishedErr is the answer to a checkpoint, fork or promote whose wait
// ended with err: past the bound a 503 saying it goes on; a shutdown or a
// failing log is dispatch's own answer.
func (s *Server) unfinishedErr(r *http.Request, sandbox, what string, err error) error {
	if r.Context().Err() != nil || !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return &httpError{status: http.StatusServiceUnavailable, id: sandbox,
		msg: fmt.Sprintf("sandbox %s: %s not finished within %s; it continues", sandbox, what, s.cfg.LifecycleWait)}
}

// handleCheckpoints lists the checkpoints the caller sees, newest first.
func (s *Server) handleCheckpoints(w http.ResponseWriter, r *http.Request, id auth.Identity) error {
	var list []fsm.CheckpointRec
	if _, err := s.durableRead(r.Context(), func(st *fsm.State) { list = st.Checkpoints(id.Tenant) }); err != nil {
		return err
	}
	out := CheckpointList{Checkpoints: make([]CheckpointRecord, 0, len(list))}
	for i := range list {
		out.Checkpoints = append(out.Checkpoints, checkpointRecord(&list[i]))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// handleDeleteCheckpoint deletes a checkpoint the caller owns (root: any).
// Its snapshot goes once no clone reads it; it is gone from the API at once.
func (s *Server) handleDeleteCheckpoint(w http.ResponseWriter, r *http.Request, id auth.Identity) error {
	ckID := r.PathValue("id")
	if !fsm.ValidCheckpointID(ckID) {
		return errorf(http.StatusNotFound, "%s", errUnknownCheckpoint)
	}
	if _, err := s.eng.ProposeNew(r.Context(), func(m fsm.Meta) fsm.Command {
		return fsm.DeleteCheckpoint{Meta: m, ID: ckID, Tenant: id.Tenant}
	}, engine.Hooks{}); err != nil {
		if rej, ok := fsm.AsRejection(err); ok && rej.Code == fsm.NotFound {
			return errorf(http.StatusNotFound, "%s", errUnknownCheckpoint)
		}
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// handleCheckpointClaim claims a new sandbox cloned from a checkpoint.
func (s *Server) handleCheckpointClaim(w http.ResponseWriter, r *http.Request, id auth.Identity) error {
	start := s.now()
	var req CheckpointClaimRequest
	if err := decodeBody(r, &req, true); err != nil {
		return err
	}
	if req.TTLSeconds < 0 {
		return errorf(http.StatusBadRequest, "ttl_seconds must not be negative")
	}
	ckID := r.PathValue("id")
	if !fsm.ValidCheckpointID(ckID) {
		return errorf(http.StatusNotFound, "%s", errUnknownCheckpoint)
	}
	claimID := s.newClaimID()
	served := s.wait(claimID)
	defer s.unwait(claimID)
	propose := func() error {
		_, err := s.eng.ProposeNew(r.Context(), func(m fsm.Meta) fsm.Command {
			// Served within the time this answer waits (a restore of a
			// large guest may outlast a warm pool's clone default).
			return fsm.Claim{Meta: m, ID: claimID, Tenant: id.Tenant, TTLSeconds: clampTTL(req.TTLSeconds), TokenGen: 1, Checkpoint: ckID,
				ServeTimeoutSeconds: min(int64(s.cfg.ClaimWait/time.Second), fsm.MaxServeTimeout)}
		}, engine.Hooks{})
		return err
	}
	err := propose()
	if rej, ok := fsm.AsRejection(err); ok && rej.Code == fsm.NotFound {
		// Another node's checkpoint: imported here first (checkpointblob.go).
		var addr string
		if addr, err = s.importOrigin(r, ckID); err == nil && addr != "" {
			if err = s.importCheckpoint(r, ckID, addr); err == nil {
				err = propose()
			}
		} else if err == nil {
			err = rej
		}
	}
	if err != nil {
		s.metrics.claim(outcomeOf(err), "", time.Since(start))
		if rej, ok := fsm.AsRejection(err); ok && rej.Code == fsm.NotFound {
			return errorf(http.StatusNotFound, "%s", errUnknownCheckpoint)
		}
		return err
	}
	return s.answerClaim(w, r, claimID, served, nil, start)
}

// handleFork clones a sandbox into count children, all or none.
func (s *Server) handleFork(w http.ResponseWriter, r *http.Request, id auth.Identity) error {
	var req ForkRequest
	if err := decodeBody(r, &req, false); err != nil {
		return err
	}
	limit := s.cfg.MaxForkCount
	if limit <= 0 {
		limit = fsm.DefaultMaxForkCount
	}
	if req.Count < 1 || req.Count > limit {
		return errorf(http.StatusBadRequest, "invalid fork count %d: want 1 to %d", req.Count, limit)
	}
	if req.TTLSeconds < 0 {
		return errorf(http.StatusBadRequest, "ttl_seconds must not be negative")
	}
	c, err := s.owned(r, id, req.Token)
	if err != nil {
		return err
	}
	kids := make([]string, req.Count)
	signal := make(chan struct{}, 1)
	for i := range kids {
		kids[i] = s.newClaimID()
		wt := s.watchOn(kids[i], signal, claimOutcomes...)
		defer s.unwatch(wt)
	}
	_, err = s.eng.ProposeNew(r.Context(), func(m fsm.Meta) fsm.Command {
		// The children fail together when this answer stops waiting for
		// them: a fork nobody waits for is not worth finishing.
		return fsm.Fork{Meta: m, Parent: c.ID, Checkpoint: s.newCheckpointID(), Children: kids, TokenGen: 1,
			TTLSeconds: clampTTL(req.TTLSeconds), ClaimRefPrefix: req.ClaimRefPrefix, MaxCount: limit,
			ServeTimeoutSeconds: min(int64(s.cfg.LifecycleWait/time.Second), fsm.MaxServeTimeout)}
	}, engine.Hooks{})
	if err != nil {
		return s.settled(err, c.ID)
	}
	ctx, cancel := s.waitContext(r.Context(), s.cfg.LifecycleWait)
	defer cancel()
	for {
		var pending, failed int
		var reason string
		_, err := s.durableRead(ctx, func(st *fsm.State) {
			for _, k := range kids {
				kc, _ := st.Claim(k)
				switch {
				case kc.Status == fsm.ClaimPending:
					pending++
				case !kc.Status.Live():
					failed++
					reason = kc.Reason
				}
			}
		})
		if err != nil {
			return s.unfinishedErr(r, c.ID, "fork", err)
		}
		if failed > 0 && pending == 0 {
			s.zl.Warn().Str("sandbox", c.ID).Str("reason", reason).Msg("api: fork failed")
			return &httpError{status: http.StatusInternalServerError, id: c.ID, msg: "fork failed", reason: reason}
		}
		if pending == 0 {
			break
		}
		select {
		case <-signal:
		case <-ctx.Done():
			return s.unfinishedErr(r, c.ID, "fork", ctx.Err())
		}
	}
	out := ForkResponse{Children: make([]ClaimResponse, 0, len(kids))}
	for _, k := range kids {
		kc, _ := s.claim(k)
		out.Children = append(out.Children, s.claimResponse(k, &kc))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}
