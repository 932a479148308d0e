package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/sbxlog/sbxlog/eventlog/event"
	"github.com/sbxlog/sbxlog/executors/layout"
	"github.com/sbxlog/sbxlog/executors/transport"
	"github.com/sbxlog/sbxlog/fsm"
	"github.com/sbxlog/sbxlog/fsm/engine"
	"github.com/sbxlog/sbxlog/projections/auth"
	"github.com/sbxlog/sbxlog/projections/origin"
)

// Checkpoint transport (issue 24): a checkpoint taken on one node is
// claimable on another.
//
// GET /v1/checkpoints/{id}/blob streams a checkpoint this node holds
// (package executors/transport's tar: head, files, digests), root only as
// the old daemon's peer route: the stream carries no tenant scoping, and
// its caller is a peer presenting the fleet's root token. HEAD is the
// probe: 200 when this node holds it claimable, 404 otherwise.
//
// A claim of a checkpoint this node does not hold, whose id's tag names
// another node (checkpoint ids carry their origin's tag as claim ids do),
// imports it first: the claim proposes fsm.ImportCheckpoint with the
// origin's address from the cluster view and waits for the import's
// outcome (concurrent claims share one import), then claims from the
// local copy. From then on this node holds the checkpoint as its own. An
// import the origin answers 404 is the claim's 404; one that failed
// otherwise (origin unreachable, a blob refused) is a 502 naming why.

// CheckpointBlobs is where the blob route reads checkpoints: the node's
// store and its snapshot format (transport.FormatOf its hypervisor).
type CheckpointBlobs struct {
	Roots  layout.Roots
	Format string
}

// openHeldBlob opens, for a root caller, the checkpoint of the path if this
// node holds it claimable (durably) and its store dir is still there; else
// the route's 404. Both blob routes answer from it, so the probe's 200
// promises exactly what the GET then streams.
func (s *Server) openHeldBlob(r *http.Request, id auth.Identity) (*transport.Blob, error) {
	if err := rootOnly(id); err != nil {
		return nil, err
	}
	ckID := r.PathValue("id")
	var ck fsm.CheckpointRec
	if fsm.ValidCheckpointID(ckID) {
		if _, err := s.durableRead(r.Context(), func(st *fsm.State) { ck, _ = st.Checkpoint(ckID) }); err != nil {
			return nil, err
		}
	}
	if ck.ID == "" || !ck.Listed() || s.blobs == nil {
		return nil, errorf(http.StatusNotFound, "%s", errUnknownCheckpoint)
	}
	dir, err := s.blobs.Roots.SnapshotIn(layout.CheckpointStore, ck.SnapshotDir)
	if err != nil {
		return nil, err
	}
	b, err := transport.Open(dir, transport.Head{ID: ck.ID, Format: s.blobs.Format, Key: ck.Key, Name: ck.Name, Tenant: ck.Tenant,
		SandboxID: ck.Claim, CreatedNS: ck.Created, ExpiresNS: ck.Expires})
	if errors.Is(err, transport.ErrNoCheckpoint) {
		// Removed since the state was read (its delete ran meanwhile).
		return nil, errorf(http.StatusNotFound, "%s", errUnknownCheckpoint)
	}
	return b, err
}

// handleCheckpointBlob streams a checkpoint this node holds (root only).
// Its files are open before the first byte is written and no lock is held
// while it streams.
func (s *Server) handleCheckpointBlob(w http.ResponseWriter, r *http.Request, id auth.Identity) error {
	b, err := s.openHeldBlob(r, id)
	if err != nil {
		return err
	}
	defer b.Close()
	w.Header().Set("Content-Type", "application/x-tar")
	w.WriteHeader(http.StatusOK)
	if n, err := b.WriteTo(w); err != nil {
		// The status is sent: the receiver sees a cut stream and refuses it.
		s.zl.Warn().Err(err).Str("checkpoint", b.Head().ID).Int64("bytes", n).Msg("api: checkpoint blob cut off")
	}
	return nil
}

// handleCheckpointProbe answers whether this node holds a checkpoint
// claimable (root only): 200 or 404, no body.
func (s *Server) handleCheckpointProbe(w http.ResponseWriter, r *http.Request, id auth.Identity) error {
	b, err := s.openHeldBlob(r, id)
	if err != nil {
		return err
	}
	b.Close()
	w.WriteHeader(http.StatusOK)
	return nil
}

// importOrigin returns the address to import checkpoint ckID from: the
// one its import in flight uses (one a restart resumes, before the view
// knows any node), else the address of the node its tag names; "" when it
// names this node or no node the view knows. A view that is behind and
// knows none is a 503: the origin may be a node it has not seen yet.
func (s *Server) importOrigin(r *http.Request, ckID string) (string, error) {
	var ck fsm.CheckpointRec
	s.eng.View(func(st *fsm.State) { ck, _ = st.Checkpoint(ckID) })
	if ck.Status == fsm.CheckpointImporting {
		return ck.Source, nil
	}
	ol, ok := s.redir.(OriginLocator)
	tag := origin.IDTag(ckID)
	if !ok || tag == "" || tag == s.idTag || r.Header.Get(origin.ProbeHeader) != "" {
		return "", nil
	}
	for _, o := range ol.Origins(tag) {
		if o.Addr != "" && !o.Withdrawn {
			return o.Addr, nil
		}
	}
	if loc, ok := s.redir.(OwnerLocator); ok {
		if l := loc.LocateOwner(ckID); l.ViewBehind {
			return "", &httpError{status: http.StatusServiceUnavailable, retryAfter: "1",
				msg: fmt.Sprintf("checkpoint %s is not on this node, and the cluster view has not been current since %s: its origin cannot be named; retry", ckID, stamp(l.ViewSince))}
		}
	}
	return "", nil
}

// importCheckpoint makes checkpoint ckID, which this node does not hold,
// this node's by importing it from the node at addr, and returns once it
// is claimable here (nil) or the import failed.
func (s *Server) importCheckpoint(r *http.Request, ckID, addr string) error {
	wt := s.watch(ckID, event.TypeCheckpointImported, event.TypeCheckpointImportFailed)
	defer s.unwatch(wt)
	res, err := s.eng.ProposeNew(r.Context(), func(m fsm.Meta) fsm.Command {
		return fsm.ImportCheckpoint{Meta: m, ID: ckID, Origin: addr}
	}, engine.Hooks{})
	if err != nil {
		if rej, ok := fsm.AsRejection(err); ok && rej.Code == fsm.NotFound {
			return errorf(http.StatusNotFound, "%s", errUnknownCheckpoint)
		}
		return err
	}
	var held bool
	s.eng.View(func(st *fsm.State) {
		ck, ok := st.Checkpoint(ckID)
		held = ok && ck.Listed()
	})
	if held {
		// Imported by an earlier claim: this request's was a no-op.
		return nil
	}
	ctx, cancel := s.waitContext(r.Context(), s.cfg.ClaimWait)
	defer cancel()
	ev, err := s.next(ctx, wt, res.Seq, event.TypeCheckpointImported, event.TypeCheckpointImportFailed)
	if err != nil {
		if r.Context().Err() == nil && errors.Is(err, context.DeadlineExceeded) {
			return &httpError{status: http.StatusServiceUnavailable, retryAfter: "5",
				msg: fmt.Sprintf("checkpoint %s: its import from %s not finished within %s; it continues", ckID, addr, s.cfg.ClaimWait)}
		}
		return err
	}
	if ev.Type == event.TypeCheckpointImported {
		return nil
	}
	p, derr := ev.Decode()
	failed, ok := p.(event.CheckpointImportFailed)
	if derr != nil || !ok {
		return fmt.Errorf("checkpoint %s: import failed (unreadable outcome)", ckID)
	}
	s.zl.Warn().Str("checkpoint", ckID).Str("origin", addr).Str("reason", failed.Reason).Str("error", failed.Error).Msg("api: checkpoint import failed")
	if failed.Reason == fsm.ImportNotFound {
		return errorf(http.StatusNotFound, "%s", errUnknownCheckpoint)
	}
	return errorf(http.StatusBadGateway, "checkpoint %s: import from %s failed (%s): %s", ckID, addr, failed.Reason, failed.Error)
}
