package api

import (
	"cmp"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"time"

	"github.com/sbxlog/sbxlog/eventlog/event"
	"github.com/sbxlog/sbxlog/fsm"
	"github.com/sbxlog/sbxlog/fsm/egress"
	"github.com/sbxlog/sbxlog/fsm/engine"
	"github.com/sbxlog/sbxlog/projections/auth"
)

// ClaimResponse is POST /v1/claim's answer: the old daemon's fields first
// (id, token, deadline, owner_addr, net_route), then sbxlog's. A redirect
// answer is the same 200 with only Redirect set (redirectResponse writes
// it), as the old SDKs decode both into one struct.
type ClaimResponse struct {
	ID        string `json:"id"`
	Token     string `json:"token"`
	Deadline  string `json:"deadline"`
	OwnerAddr string `json:"owner_addr"`
	// NetRoute is how the guest reaches the network (netRoute): "direct"
	// (its own NIC, unlocked), "relay" (the egress proxy) or "none".
	NetRoute string `json:"net_route,omitempty"`
	Template string `json:"template"`
	Net      string `json:"net"`
	Size     string `json:"size"`
	Tier     string `json:"tier"`
	VM       string `json:"vm"`
	// FromCheckpoint: the checkpoint a claim was branched from (POST
	// /v1/checkpoints/{id}/claim), the lineage edge of a checkpoint tree.
	FromCheckpoint string `json:"from_checkpoint,omitempty"`
	// Volumes are the claim's volumes (volumes.go), as the old daemon
	// echoed them.
	Volumes []VolumeJSON `json:"volumes,omitempty"`
	// Redirect, in a redirect answer only (which has no other field),
	// lists nodes with warm capacity for the pool: the client claims
	// there, with no_redirect.
	Redirect []string `json:"redirect,omitempty"`
}

// redirectResponse is the old daemon's redirect answer: 200 with nothing
// but the addresses (its Go client requires 200 and tells the two answers
// apart by the presence of "redirect").
type redirectResponse struct {
	Redirect []string `json:"redirect"`
}

// Sandbox is a claim as GET /v1/sandboxes and GET /v1/sandboxes/{id} show
// it: the old daemon's row (key, tenant, claim_ref, metadata, size, the
// hibernated/archived/failed flags, claimed_at, deadline; token only for
// root asking for one sandbox), then sbxlog's fields.
type Sandbox struct {
	ID            string            `json:"id"`
	Key           fsm.PoolKey       `json:"key"`
	Tenant        string            `json:"tenant,omitempty"`
	ClaimRef      string            `json:"claim_ref,omitempty"`
	Metadata      map[string]string `json:"metadata,omitempty"`
	CPUCount      int               `json:"cpu_count,omitempty"`
	MemTotalBytes int64             `json:"mem_total_bytes,omitempty"`
	Hibernated    bool              `json:"hibernated"`
	// Archived: the sandbox's snapshot is in the archive store (fsm's
	// State.Archived: not while on its way there or back); Hibernated is
	// then false and State "archived".
	Archived bool `json:"archived,omitempty"`
	// OnExpire is "archive" for a claim whose lease's end archives it.
	OnExpire string `json:"on_expire,omitempty"`
	// Failed is the reason of a failed claim.
	Failed    string `json:"failed,omitempty"`
	ClaimedAt string `json:"claimed_at,omitempty"`
	Deadline  string `json:"deadline"`
	// Token is the sandbox token, for root on GET /v1/sandboxes/{id} only.
	Token     string `json:"token,omitempty"`
	State     string `json:"state"`
	Tier      string `json:"tier"`
	VM        string `json:"vm,omitempty"`
	OwnerAddr string `json:"owner_addr"`
	Created   string `json:"created"`
	Reason    string `json:"reason,omitempty"`
	// Volumes are the sandbox's attached volumes (volumes.go).
	Volumes []VolumeJSON `json:"volumes,omitempty"`
}

func rfc3339(ns int64) string {
	if ns == 0 {
		return ""
	}
	return time.Unix(0, ns).UTC().Format(time.RFC3339Nano)
}

// stateArchived is the row state of a hibernated claim whose snapshot is
// in the archive store.
const stateArchived = "archived"

// sandboxOf is c's row; archived says its snapshot is in the archive store
// (fsm.State.Archived).
func (s *Server) sandboxOf(c *fsm.ClaimRec, archived bool) Sandbox {
	sb := Sandbox{
		ID: c.ID, Key: c.Key, Tenant: c.Tenant, ClaimRef: c.ClaimRef, Metadata: c.Metadata,
		Hibernated: c.Status == fsm.ClaimHibernated, ClaimedAt: rfc3339(c.Created), Deadline: rfc3339(c.Deadline),
		State: c.Status.String(), Tier: c.Tier.String(), VM: c.VM, OwnerAddr: s.cfg.OwnerAddr,
		Created: rfc3339(c.Created), Reason: c.Reason, Volumes: volumesJSON(c),
	}
	if z, ok := s.vmSize(c.Key.Size); ok {
		sb.CPUCount, sb.MemTotalBytes = z.VCPUs, int64(z.MemoryMiB)<<20
	}
	if c.Status == fsm.ClaimFailed {
		sb.Failed = cmp.Or(c.Reason, "failed")
	}
	if archived && c.Status == fsm.ClaimHibernated {
		sb.Archived, sb.Hibernated, sb.State = true, false, stateArchived
	}
	if c.OnExpireArchive {
		sb.OnExpire = event.OnExpireArchive
	}
	return sb
}

// Net routes, the old daemon's net_route values.
const (
	routeDirect = "direct" // an egress VM's own NIC, not locked: the guest reaches the bridge's network
	routeRelay  = "relay"  // the egress proxy behind the VM's doors, the guest's only way out
	routeNone   = "none"   // nothing: no NIC, or a locked one with no policy
)

// netRoute is the old daemon's net_route of claim id (c): direct for an
// egress VM whose tap this node does not lock; relay when the VM's proxy
// doors are open and the claim has an egress policy (what the proxy
// serves it); none otherwise (no NIC, or doors that deny everything).
func (s *Server) netRoute(id string, c *fsm.ClaimRec) string {
	if c.Key.Net == "egress" && !s.egress.Locked {
		return routeDirect
	}
	if s.egress.Doors == nil || !s.egress.Doors(c.VM) {
		return routeNone
	}
	var ok bool
	s.eng.View(func(st *fsm.State) { _, ok = st.Egress(id) })
	if ok {
		return routeRelay
	}
	return routeNone
}

// errProvisioning is the old daemon's answer to a claim it could not
// provision (a failed clone or cold boot: an unknown template among them).
const errProvisioning = "provisioning failed"

func (s *Server) handleClaim(w http.ResponseWriter, r *http.Request, id auth.Identity) error {
	start := s.now()
	var req ClaimRequest
	if err := decodeBody(r, &req, false); err != nil {
		return err
	}
	if err := req.normalize(s.cfg.Archive); err != nil {
		return err
	}
	key := fsm.PoolKey{Template: req.Template, Net: req.Net, Size: req.Size}
	redirect := s.redir != nil && !req.NoRedirect
	if req.RequirePromoted && !s.promoted(key) {
		// Only a promoted template may serve it, and this node has none.
		s.metrics.claim("unknown_template", "", time.Since(start))
		return errorf(http.StatusNotFound, "%s", errUnknownTemplate)
	}
	// What this node cannot serve at all is refused before anything is
	// proposed (no claim, no pool left behind), unless a node with warm
	// capacity for the key takes it (the redirect).
	// A promoted template's clones need its golden only, not a template dir:
	// asked only once checkPool refuses, so a claim of a pool this node
	// serves reads the state no more than it did before templates.
	// The pool is read once per claim: whether it is configured here (for
	// checkPool) and how many warm VMs it has (for the redirect below).
	var here poolHere
	if s.pools != nil || redirect {
		here = s.poolHere(key)
	}
	if err := s.checkPool(key, here.pooled); err != nil && !s.promoted(key) {
		if redirect && s.redirectClaim(w, key, start) {
			return nil
		}
		s.metrics.claim(refusalOutcome(err), "", time.Since(start))
		return s.namingKnown(err, id)
	}
	claimID := s.newClaimID()
	noEgress := req.Egress != nil && !*req.Egress
	var env []egress.EnvEntry
	if len(req.Env) > 0 {
		var pol egress.Effective
		s.eng.View(func(st *fsm.State) { pol, _ = st.EgressFor(id.Tenant, key, noEgress) })
		var err error
		if env, _, err = s.sealEnv(claimID, req.Env, pol, false); err != nil {
			return err
		}
	}
	// With no warm VM here, a node that has some for this key is a better
	// answer than a clone: the old daemon's redirect (rule 1, a warm miss).
	// With a warm VM seen here, the claim asks for a warm one only
	// (WarmOnly), so a concurrent claim that took it first makes this one
	// a redirect at commit time rather than a clone; with nowhere to send
	// it, it is proposed again and cloned.
	warmOnly := false
	if redirect {
		if here.warm == 0 && s.redirectClaim(w, key, start) {
			return nil
		}
		warmOnly = here.warm > 0
	}
	// Register the waiter before proposing: the serving event may commit
	// before Propose returns.
	served := s.wait(claimID)
	defer s.unwait(claimID)
	var volWatch *watch
	if len(req.Volumes) > 0 {
		// A claim with volumes answers once they are attached (or failed).
		volWatch = s.watch(claimID, volumeOutcomes...)
		defer s.unwatch(volWatch)
	}
	// A warm claim is running as soon as it is applied: its answer (token,
	// JSON) is built while the fsync is in flight, and sent from Durable:
	// with the local engine before it tells executors and projections about
	// the commit, with synchronous replication once JetStream acknowledged.
	var reply []byte
	var c fsm.ClaimRec
	sent := false
	propose := func(warmOnly bool) error {
		_, err := s.eng.ProposeNew(r.Context(), func(m fsm.Meta) fsm.Command {
			return fsm.Claim{
				Meta: m, ID: claimID, Key: key, Tenant: id.Tenant, ClaimRef: req.ClaimRef,
				Metadata: req.Metadata, TTLSeconds: req.TTLSeconds, TokenGen: 1, NoEgress: noEgress, Env: env,
				Volumes: volumeRequests(req.Volumes), VolumesAttachOnly: req.VolumesAttachOnly, WarmOnly: warmOnly,
				OnExpire: req.OnExpire,
			}
		}, engine.Hooks{
			Prepare: func() {
				if c, _ = s.claim(claimID); c.Status == fsm.ClaimRunning && volWatch == nil {
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
		return err
	}
	err := propose(warmOnly)
	if rej, ok := fsm.AsRejection(err); ok && warmOnly && rej.Msg == fsm.NoWarmMsg {
		if s.redirectClaim(w, key, start) {
			return nil
		}
		err = propose(false)
	}
	if sent {
		// Answered: the claim took effect whatever ProposeNew said after.
		s.metrics.claim("ok", c.Tier.String(), time.Since(start))
		return nil
	}
	if err != nil {
		// A claim refused for quota goes where there is warm capacity
		// instead (the old daemon's rule 3), if anywhere.
		if rej, ok := fsm.AsRejection(err); ok && redirect && rej.Code.HTTPStatus() == http.StatusTooManyRequests && s.redirectClaim(w, key, start) {
			return nil
		}
		s.metrics.claim(outcomeOf(err), "", time.Since(start))
		if errors.Is(err, ErrUnavailable) {
			// Committed here, not confirmed elsewhere: the claim exists.
			s.zl.Warn().Err(err).Str("claim", claimID).Msg("api: claim committed but unavailable")
			return &httpError{status: http.StatusServiceUnavailable, msg: err.Error(), id: claimID}
		}
		return err
	}
	return s.answerClaim(w, r, claimID, served, volWatch, start)
}

// answerClaim answers a claim proposed and not answered from Durable (a
// warm claim behind an Engine that never calls it, or a claim still
// pending): from the state. A pending claim waits for its outcome (served,
// the channel of s.wait) first. Either way the answer waits for the log to
// be durable (with synchronous replication: acknowledged by JetStream) up to
// the state it reports: a claim served while ProposeNew returned may still
// be in its fsync.
func (s *Server) answerClaim(w http.ResponseWriter, r *http.Request, claimID string, served <-chan struct{}, volWatch *watch, start time.Time) error {
	c, _ := s.claim(claimID)
	if c.Status == fsm.ClaimPending {
		ctx, cancel := s.waitContext(r.Context(), s.cfg.ClaimWait)
		defer cancel()
		select {
		case <-served:
		case <-ctx.Done():
		}
	}
	if volWatch != nil {
		ctx, cancel := s.waitContext(r.Context(), s.cfg.ClaimWait)
		defer cancel()
		s.awaitVolumes(ctx, claimID, volWatch, nil)
	}
	c, _, _, err := s.durableState(r.Context(), claimID)
	if err != nil {
		return err
	}
	switch {
	case c.Status == fsm.ClaimPending && s.stopping.Err() != nil:
		// Still pending as the node stops: served or failed after the
		// restart.
		s.metrics.claim("timeout", c.Tier.String(), time.Since(start))
		return &httpError{status: http.StatusServiceUnavailable, id: claimID, msg: ErrShuttingDown.Error()}
	case c.Status == fsm.ClaimPending:
		// Still pending: the client gave up or the wait bound passed. The
		// state will fail it at its serve deadline; say so.
		s.metrics.claim("timeout", c.Tier.String(), time.Since(start))
		return &httpError{status: http.StatusServiceUnavailable, id: claimID,
			msg: fmt.Sprintf("sandbox %s not ready yet (tier %s); it fails at its serve deadline unless served", claimID, c.Tier)}
	case c.Status.Live():
		// Served (and possibly moved on already: hibernating...).
	default:
		// The clone or cold boot failed (a template that does not exist
		// among the reasons), or the claim ended first: the old daemon's
		// 500, with the claim's id and reason for people.
		s.metrics.claim("failed", c.Tier.String(), time.Since(start))
		s.zl.Warn().Str("claim", claimID).Str("tier", c.Tier.String()).Str("reason", c.Reason).Str("state", c.Status.String()).Msg("api: claim not provisioned")
		return &httpError{status: http.StatusInternalServerError, id: claimID, msg: errProvisioning,
			reason: cmp.Or(c.Reason, c.Status.String())}
	}
	s.metrics.claim("ok", c.Tier.String(), time.Since(start))
	writeJSON(w, http.StatusOK, s.claimResponse(claimID, &c))
	return nil
}

// redirectClaim answers a claim of key with the nodes that have warm VMs
// for it, if the cluster view names any; it reports whether it answered.
func (s *Server) redirectClaim(w http.ResponseWriter, key fsm.PoolKey, start time.Time) bool {
	addrs := s.redir.WarmElsewhere(key)
	if len(addrs) == 0 {
		return false
	}
	s.metrics.claim("redirect", "", time.Since(start))
	writeJSON(w, http.StatusOK, redirectResponse{Redirect: addrs})
	return true
}

func (s *Server) claimResponse(id string, c *fsm.ClaimRec) ClaimResponse {
	return ClaimResponse{
		ID: id, Token: s.auth.SandboxToken(id, tokenGenOf(c)),
		Deadline: rfc3339(c.Deadline), OwnerAddr: s.cfg.OwnerAddr, NetRoute: s.netRoute(id, c),
		Template: c.Key.Template, Net: c.Key.Net, Size: c.Key.Size, Tier: c.Tier.String(), VM: c.VM,
		FromCheckpoint: c.FromCheckpoint,
		Volumes:        volumesJSON(c),
	}
}

// poolHere is what a claim needs of its pool in this node's state.
type poolHere struct {
	pooled bool // a pool of the key is configured (not draining)
	warm   int  // its warm VMs
}

// poolHere reads key's pool in one view: a claim asks both questions, and
// State.Pool copies the warm stack on every read.
func (s *Server) poolHere(key fsm.PoolKey) poolHere {
	var h poolHere
	s.eng.View(func(st *fsm.State) {
		if p, ok := st.Pool(key); ok {
			h = poolHere{pooled: !p.Draining, warm: len(p.WarmVMs())}
		}
	})
	return h
}

// refusalOutcome is the sbx_claims_total outcome of a claim checkPool
// refused: unknown_template, as require_promoted's, or unsupported.
func refusalOutcome(err error) string {
	var he *httpError
	if errors.As(err, &he) && he.status == http.StatusNotFound {
		return "unknown_template"
	}
	return "unsupported"
}

func outcomeOf(err error) string {
	if rej, ok := fsm.AsRejection(err); ok {
		return rej.Code.String()
	}
	return "error"
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
		if err := s.locateAway(sid, r); err != nil {
			return c, err
		}
	}
	return c, errorf(http.StatusNotFound, "%s", errUnknownSandbox)
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
	var archived bool
	s.eng.View(func(st *fsm.State) { archived = st.Archived(&c) })
	sb := s.sandboxOf(&c, archived)
	if id.Kind == auth.Root {
		// The old daemon hands root the sandbox token here (its operator
		// client acts as the sandbox with it).
		sb.Token = s.auth.SandboxToken(c.ID, tokenGenOf(&c))
	}
	writeJSON(w, http.StatusOK, sb)
	return nil
}

// handleList answers GET /v1/sandboxes[?claim_ref=&metadata=k=v&state=]:
// live claims (and, with state=, ended ones still retained; state=all:
// every one retained, live or ended) the caller may see, sorted by id.
// stateAll is the list filter of every retained claim, live or ended.
const stateAll = "all"

func (s *Server) handleList(w http.ResponseWriter, r *http.Request, id auth.Identity) error {
	q := r.URL.Query()
	ref := q.Get("claim_ref")
	meta, err := metadataFilter(q["metadata"])
	if err != nil {
		return err
	}
	tenant, byTenant := id.Tenant, id.Kind == auth.Tenant
	if t := q.Get("tenant"); !byTenant && t != "" {
		tenant, byTenant = t, true
	}
	want := q.Get("state")
	if want != "" && want != stateAll && !validClaimState(want) {
		return errorf(http.StatusBadRequest, "unknown state %q: want %s, pending, running, hibernating, hibernated, archived, waking, released, expired or failed", want, stateAll)
	}
	out := []Sandbox{}
	s.eng.View(func(st *fsm.State) {
		for _, cid := range st.ClaimIDs() {
			c, _ := st.Claim(cid)
			// The row's state: an archived claim's is "archived", not
			// "hibernated", for the filter as in the row.
			sb := s.sandboxOf(&c, st.Archived(&c))
			switch {
			case byTenant && c.Tenant != tenant:
			case want == "" && !c.Status.Live():
			case want != "" && want != stateAll && sb.State != want:
			case ref != "" && c.ClaimRef != ref:
			case !metadataMatches(c.Metadata, meta):
			default:
				out = append(out, sb)
			}
		}
	})
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	writeJSON(w, http.StatusOK, map[string]any{"sandboxes": out})
	return nil
}

// metadataFilter parses repeated metadata=key=value parameters, the old
// daemon's rules: each needs a '=' and a non-empty key, and no key twice.
func metadataFilter(pairs []string) (map[string]string, error) {
	if len(pairs) == 0 {
		return nil, nil
	}
	out := make(map[string]string, len(pairs))
	for _, p := range pairs {
		k, v, ok := strings.Cut(p, "=")
		switch {
		case !ok:
			return nil, errorf(http.StatusBadRequest, "metadata filter %q: want key=value", p)
		case k == "":
			return nil, errorf(http.StatusBadRequest, "metadata filter %q: empty key", p)
		}
		if _, dup := out[k]; dup {
			return nil, errorf(http.StatusBadRequest, "metadata filter: key %q given twice", k)
		}
		out[k] = v
	}
	return out, nil
}

// metadataMatches reports whether m holds every pair of want.
func metadataMatches(m, want map[string]string) bool {
	for k, v := range want {
		if got, ok := m[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// validClaimState reports whether name is a claim status's name.
func validClaimState(name string) bool {
	if name == stateArchived {
		return true
	}
	for st := fsm.ClaimPending; st <= fsm.ClaimFailed; st++ {
		if st.String() == name {
			return true
		}
	}
	return false
}
