package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"time"

	"github.com/sbxlog/sbxlog/fsm"
	"github.com/sbxlog/sbxlog/fsm/engine"
	"github.com/sbxlog/sbxlog/projections/auth"
)

// ClaimResponse is POST /v1/claim's answer.
type ClaimResponse struct {
	ID        string `json:"id"`
	Token     string `json:"token"`
	Deadline  string `json:"deadline"`
	OwnerAddr string `json:"owner_addr"`
	Template  string `json:"template"`
	Net       string `json:"net"`
	Size      string `json:"size"`
	Tier      string `json:"tier"`
	VM        string `json:"vm"`
}

// Sandbox is a claim as GET /v1/sandboxes shows it.
type Sandbox struct {
	ID        string            `json:"id"`
	State     string            `json:"state"`
	Template  string            `json:"template"`
	Net       string            `json:"net"`
	Size      string            `json:"size"`
	Tier      string            `json:"tier"`
	VM        string            `json:"vm,omitempty"`
	Tenant    string            `json:"tenant,omitempty"`
	ClaimRef  string            `json:"claim_ref,omitempty"`
	Metadata  map[string]string `json:"metadata,omitempty"`
	Created   string            `json:"created"`
	Deadline  string            `json:"deadline"`
	OwnerAddr string            `json:"owner_addr"`
	Reason    string            `json:"reason,omitempty"`
}

func rfc3339(ns int64) string {
	if ns == 0 {
		return ""
	}
	return time.Unix(0, ns).UTC().Format(time.RFC3339Nano)
}

func (s *Server) sandboxOf(c *fsm.ClaimRec) Sandbox {
	return Sandbox{
		ID: c.ID, State: c.Status.String(), Template: c.Key.Template, Net: c.Key.Net, Size: c.Key.Size,
		Tier: c.Tier.String(), VM: c.VM, Tenant: c.Tenant, ClaimRef: c.ClaimRef, Metadata: c.Metadata,
		Created: rfc3339(c.Created), Deadline: rfc3339(c.Deadline), OwnerAddr: s.cfg.OwnerAddr, Reason: c.Reason,
	}
}

func (s *Server) handleClaim(w http.ResponseWriter, r *http.Request, id auth.Identity) error {
	start := s.now()
	var req ClaimRequest
	if err := decodeBody(r, &req, false); err != nil {
		return err
	}
	if _, err := req.normalize(); err != nil {
		return err
	}
	key := fsm.PoolKey{Template: req.Template, Net: req.Net, Size: req.Size}
	claimID := newClaimID()
	// With no warm VM here, a node that has some for this key is a better
	// answer than a clone: the old daemon's redirect.
	if s.redir != nil && !req.NoRedirect {
		var warm int
		s.eng.View(func(st *fsm.State) {
			if p, ok := st.Pool(key); ok {
				warm = len(p.WarmVMs())
			}
		})
		if warm == 0 {
			if addrs := s.redir.WarmElsewhere(key); len(addrs) > 0 {
				s.metrics.claim("redirect", "", time.Since(start))
				writeJSON(w, http.StatusTemporaryRedirect, map[string][]string{"redirect": addrs})
				return nil
			}
		}
	}
	// Register the waiter before proposing: the serving event may commit
	// before Propose returns.
	served := s.wait(claimID)
	defer s.unwait(claimID)
	// A warm claim is running as soon as it is applied: its answer (token,
	// JSON) is built while the fsync is in flight, and sent from Durable:
	// with the local engine before it tells executors and projections about
	// the commit, with synchronous replication once JetStream acknowledged.
	var reply []byte
	var c fsm.ClaimRec
	sent := false
	_, err := s.eng.ProposeNew(r.Context(), func(m fsm.Meta) fsm.Command {
		return fsm.Claim{
			Meta: m, ID: claimID, Key: key, Tenant: id.Tenant, ClaimRef: req.ClaimRef,
			Metadata: req.Metadata, TTLSeconds: req.TTLSeconds, TokenGen: 1,
		}
	}, engine.Hooks{
		Prepare: func() {
			if c, _ = s.claim(claimID); c.Status == fsm.ClaimRunning {
				reply = encodeJSON(s.claimResponse(claimID, &c))
			}
		},
		Durable: func() {
			if reply != nil {
				writeRawNow(w, http.StatusOK, reply)
				sent = true
			}
		},
	})
	if sent {
		// Answered: the claim took effect whatever ProposeNew said after.
		s.metrics.claim("ok", c.Tier.String(), time.Since(start))
		return nil
	}
	if err != nil {
		s.metrics.claim(outcomeOf(err), "", time.Since(start))
		if errors.Is(err, ErrUnavailable) {
			// Committed here, not confirmed elsewhere: the claim exists.
			s.zl.Warn().Err(err).Str("claim", claimID).Msg("api: claim committed but unavailable")
			return &httpError{status: http.StatusServiceUnavailable, msg: err.Error(), id: claimID}
		}
		return err
	}
	// Not answered from Durable (a warm claim behind an Engine that never
	// calls it, or a claim still pending): answer from the state, once the
	// log is durable up to what the answer reports.
	c, _ = s.claim(claimID)
	if c.Status == fsm.ClaimPending {
		ctx, cancel := context.WithTimeout(r.Context(), s.cfg.ClaimWait)
		defer cancel()
		select {
		case <-served:
		case <-ctx.Done():
		}
		if c, err = s.durableClaim(r.Context(), claimID); err != nil {
			return err
		}
	}
	switch c.Status {
	case fsm.ClaimRunning:
	case fsm.ClaimPending:
		// Still pending: the client gave up or the wait bound passed. The
		// state will fail it at its serve deadline; say so.
		s.metrics.claim("timeout", c.Tier.String(), time.Since(start))
		return &httpError{status: http.StatusServiceUnavailable, id: claimID,
			msg: fmt.Sprintf("sandbox %s not ready yet (tier %s); it fails at its serve deadline unless served", claimID, c.Tier)}
	default:
		s.metrics.claim("failed", c.Tier.String(), time.Since(start))
		return &httpError{status: http.StatusServiceUnavailable, id: claimID,
			msg: fmt.Sprintf("sandbox %s could not be served (tier %s): %s", claimID, c.Tier, c.Reason)}
	}
	s.metrics.claim("ok", c.Tier.String(), time.Since(start))
	writeJSON(w, http.StatusOK, s.claimResponse(claimID, &c))
	return nil
}

func (s *Server) claimResponse(id string, c *fsm.ClaimRec) ClaimResponse {
	return ClaimResponse{
		ID: id, Token: s.auth.SandboxToken(id, uint64(max(c.TokenGen, 1))),
		Deadline: rfc3339(c.Deadline), OwnerAddr: s.cfg.OwnerAddr,
		Template: c.Key.Template, Net: c.Key.Net, Size: c.Key.Size, Tier: c.Tier.String(), VM: c.VM,
	}
}

func outcomeOf(err error) string {
	if rej, ok := fsm.AsRejection(err); ok {
		return rej.Code.String()
	}
	return "error"
}

// durableClaim reads claim id once the log is durable up to the state it
// was read from: an answer built from it acknowledges nothing a crash could
// take back (the state runs ahead of the log by the fsync in flight).
func (s *Server) durableClaim(ctx context.Context, id string) (fsm.ClaimRec, error) {
	var c fsm.ClaimRec
	var applied uint64
	s.eng.View(func(st *fsm.State) { c, _ = st.Claim(id); applied = st.Applied() })
	if err := s.log.WaitDurable(ctx, applied); err != nil {
		return c, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	return c, nil
}

func (s *Server) claim(id string) (fsm.ClaimRec, bool) {
	var c fsm.ClaimRec
	var ok bool
	s.eng.View(func(st *fsm.State) { c, ok = st.Claim(id) })
	return c, ok
}

// visible finds a claim the caller may see; anything else is 404, so a
// tenant cannot probe for other tenants' ids.
func (s *Server) visible(r *http.Request, id auth.Identity) (fsm.ClaimRec, error) {
	sid := r.PathValue("id")
	c, ok := s.claim(sid)
	if ok && (id.Kind == auth.Root || (id.Kind == auth.Tenant && c.Tenant == id.Tenant) || (id.Kind == auth.Sandbox && id.SandboxID == sid)) {
		return c, nil
	}
	if !ok && id.Kind == auth.Root && s.redir != nil {
		if addr, found := s.redir.OwnerOf(sid); found {
			return c, &ownedElsewhere{addr: addr}
		}
	}
	return c, errorf(http.StatusNotFound, "unknown sandbox %q", sid)
}

type ownedElsewhere struct{ addr string }

func (o *ownedElsewhere) Error() string { return "owned by " + o.addr }

func (s *Server) handleGet(w http.ResponseWriter, r *http.Request, id auth.Identity) error {
	c, err := s.visible(r, id)
	if oe, ok := err.(*ownedElsewhere); ok {
		writeJSON(w, http.StatusOK, map[string]string{"id": r.PathValue("id"), "owner_addr": oe.addr})
		return nil
	}
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, s.sandboxOf(&c))
	return nil
}

// handleList answers GET /v1/sandboxes[?claim_ref=&metadata=k=v&state=]:
// live claims (and, with state=, ended ones still retained) the caller may
// see, sorted by id.
func (s *Server) handleList(w http.ResponseWriter, r *http.Request, id auth.Identity) error {
	q := r.URL.Query()
	ref := q.Get("claim_ref")
	var mk, mv string
	if m := q.Get("metadata"); m != "" {
		var ok bool
		if mk, mv, ok = strings.Cut(m, "="); !ok || mk == "" {
			return errorf(http.StatusBadRequest, "metadata filter %q: want key=value", m)
		}
	}
	want := q.Get("state")
	if want != "" && !validClaimState(want) {
		return errorf(http.StatusBadRequest, "unknown state %q: want pending, running, hibernating, hibernated, waking, released, expired or failed", want)
	}
	out := []Sandbox{}
	s.eng.View(func(st *fsm.State) {
		for _, cid := range st.ClaimIDs() {
			c, _ := st.Claim(cid)
			switch {
			case id.Kind == auth.Tenant && c.Tenant != id.Tenant:
			case want == "" && !c.Status.Live():
			case want != "" && c.Status.String() != want:
			case ref != "" && c.ClaimRef != ref:
			case mk != "" && c.Metadata[mk] != mv:
			default:
				out = append(out, s.sandboxOf(&c))
			}
		}
	})
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	writeJSON(w, http.StatusOK, map[string]any{"sandboxes": out})
	return nil
}

// validClaimState reports whether name is a claim status's name.
func validClaimState(name string) bool {
	for st := fsm.ClaimPending; st <= fsm.ClaimFailed; st++ {
		if st.String() == name {
			return true
		}
	}
	return false
}
