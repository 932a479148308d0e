package api

import (
	"cmp"
	"net/http"
	"time"

	"github.com/sbxlog/sbxlog/eventlog/event"
	"github.com/sbxlog/sbxlog/fsm"
	"github.com/sbxlog/sbxlog/fsm/engine"
	"github.com/sbxlog/sbxlog/projections/auth"
)

// Promoted templates, as the old daemon had them:
//
//   - POST /v1/sandboxes/{id}/promote {"token", "template"}: the node's API
//     token in the header (root or a tenant), the sandbox's own token in the
//     body as the ownership proof (root, and the sandbox's own tenant, may
//     leave it out and act by id).
//     Answers once the template's golden is in the store: 200 {"key",
//     "content_digest"}; the fsm's refusals (400 name, 404 sandbox, 409 a
//     configured pool's key, another tenant's template, an egress-lane or
//     busy sandbox), 500 "promote failed: ..." when the snapshot failed.
//   - DELETE /v1/templates?template=&net=&size=[&digest=]: 204; 404 unknown
//     (or another tenant's), 409 a configured pool's key, 412 another digest.
//   - PUT /v1/templates/labels?template=&net=&size=[&digest=] {"labels"}:
//     replaces the labels, with DELETE's answers and 400 bad labels.
//   - GET /v1/info lists them under "templates" (a tenant sees its own).
//
// GET /v1/store (root) is sbxlog's: every snapshot dir the state references,
// with its owner, and the retired ones waiting for collection.

// PromoteRequest is POST .../promote's body.
type PromoteRequest struct {
	Token    string `json:"token,omitempty"`
	Template string `json:"template"`
}

// TemplateKey is a template's key in answers.
type TemplateKey struct {
	Template string `json:"template"`
	Net      string `json:"net"`
	Size     string `json:"size"`
}

// PromoteResponse is its answer.
type PromoteResponse struct {
	Key           TemplateKey `json:"key"`
	ContentDigest string      `json:"content_digest"`
}

// TemplateInfo is one template of GET /v1/info's "templates".
type TemplateInfo struct {
	Key           TemplateKey       `json:"key"`
	ContentDigest string            `json:"content_digest"`
	Tenant        string            `json:"tenant,omitempty"`
	CPUCount      int               `json:"cpu_count"`
	MemTotalBytes int64             `json:"mem_total_bytes"`
	CreatedAt     string            `json:"created_at"`
	Labels        map[string]string `json:"labels,omitempty"`
}

// RebuildRequest is POST /v1/pools/rebuild's body: a configured pool's key
// (net and size default like a claim's).
type RebuildRequest struct {
	Template string `json:"template"`
	Net      string `json:"net,omitempty"`
	Size     string `json:"size,omitempty"`
}

// handleRebuild (root) rebuilds a configured pool's golden: 204 once the
// request is durable; the old golden is collected once its clones are gone.
func (s *Server) handleRebuild(w http.ResponseWriter, r *http.Request, id auth.Identity) error {
	if err := rootOnly(id); err != nil {
		return err
	}
	var req RebuildRequest
	if err := decodeBody(r, &req, false); err != nil {
		return err
	}
	k := keyWithDefaults(req.Template, req.Net, req.Size)
	if _, err := s.eng.ProposeNew(r.Context(), func(m fsm.Meta) fsm.Command { return fsm.RebuildGolden{Meta: m, Key: k} }, engine.Hooks{}); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// LabelsRequest is PUT /v1/templates/labels's body.
type LabelsRequest struct {
	Labels map[string]string `json:"labels"`
}

// StoreSnapshot is one row of GET /v1/store.
type StoreSnapshot struct {
	Dir   string `json:"dir"`
	Kind  string `json:"kind"`
	Owner string `json:"owner"`
	// Mappers counts the VMs restored from it that still run.
	Mappers int `json:"mappers,omitempty"`
}

// StoreResponse is GET /v1/store's body.
type StoreResponse struct {
	Snapshots []StoreSnapshot `json:"snapshots"`
}

func keyJSON(k fsm.PoolKey) TemplateKey {
	return TemplateKey{Template: k.Template, Net: k.Net, Size: k.Size}
}

// callerTenant is the tenant a command is made for: empty for root.
func callerTenant(id auth.Identity) string {
	if id.Kind == auth.Tenant {
		return id.Tenant
	}
	return ""
}

// promoteEvents are the events that settle a promote (or end its claim).
var promoteEvents = []event.Type{event.TypePromoted, event.TypePromoteFailed, event.TypeClaimFailed, event.TypeClaimReleased, event.TypeClaimExpired}

func (s *Server) handlePromote(w http.ResponseWriter, r *http.Request, id auth.Identity) error {
	var req PromoteRequest
	if err := decodeBody(r, &req, false); err != nil {
		return err
	}
	sid := r.PathValue("id")
	c, ok := s.claim(sid)
	// The body token proves ownership; root, and the sandbox's own tenant
	// (sbxlog's extension, as for release), may act by id without one.
	byID := id.Kind == auth.Root || id.Kind == auth.Tenant && c.Tenant == id.Tenant
	if !ok || !c.Status.Live() || (req.Token == "" && !byID) ||
		(req.Token != "" && !s.auth.IsSandboxToken(req.Token, c.ID, tokenGenOf(&c))) {
		return errorf(http.StatusNotFound, "%s", errUnknownSandbox)
	}
	wt := s.watch(c.ID, promoteEvents...)
	defer s.unwatch(wt)
	res, err := s.eng.ProposeNew(r.Context(), func(m fsm.Meta) fsm.Command {
		return fsm.Promote{Meta: m, Claim: c.ID, Template: req.Template, Tenant: callerTenant(id)}
	}, engine.Hooks{})
	if err != nil {
		return s.settled(err, c.ID)
	}
	ctx, cancel := s.waitContext(r.Context(), s.cfg.LifecycleWait)
	defer cancel()
	ev, err := s.next(ctx, wt, res.Seq, promoteEvents...)
	if err == nil {
		err = s.durableAt(ctx, ev.Seq)
	}
	if err != nil {
		return s.unfinishedErr(r, c.ID, "promote", err)
	}
	p, err := ev.Decode()
	if err != nil {
		return err
	}
	switch p := p.(type) {
	case event.Promoted:
		writeJSON(w, http.StatusOK, PromoteResponse{Key: keyJSON(p.Key), ContentDigest: p.Digest})
		return nil
	case event.PromoteFailed:
		s.zl.Warn().Str("sandbox", c.ID).Str("reason", p.Error).Msg("api: promote failed")
		return &httpError{status: http.StatusInternalServerError, id: c.ID, msg: "promote failed: " + p.Error}
	}
	return errorf(http.StatusNotFound, "%s", errUnknownSandbox)
}

// promoted reports whether key is a promoted template's.
func (s *Server) promoted(key fsm.PoolKey) bool {
	var ok bool
	s.eng.View(func(st *fsm.State) { _, ok = st.Template(key) })
	return ok
}

// templateQuery reads a template's key (net and size default like a
// claim's) and the optional digest from the query.
func templateQuery(r *http.Request) (fsm.PoolKey, string, error) {
	q := r.URL.Query()
	k := keyWithDefaults(q.Get("template"), q.Get("net"), q.Get("size"))
	if k.Template == "" {
		return k, "", errorf(http.StatusBadRequest, "template is required")
	}
	return k, q.Get("digest"), nil
}

// keyWithDefaults is a pool key with net and size defaulted as a claim's
// (ClaimRequest.normalize): none and small.
func keyWithDefaults(template, net, size string) fsm.PoolKey {
	return fsm.PoolKey{Template: template, Net: cmp.Or(net, "none"), Size: cmp.Or(size, "small")}
}

func (s *Server) handleDeleteTemplate(w http.ResponseWriter, r *http.Request, id auth.Identity) error {
	if err := decodeBody(r, &struct{}{}, true); err != nil {
		return err
	}
	k, digest, err := templateQuery(r)
	if err != nil {
		return err
	}
	if _, err := s.eng.ProposeNew(r.Context(), func(m fsm.Meta) fsm.Command {
		return fsm.DeleteTemplate{Meta: m, Key: k, Tenant: callerTenant(id), Digest: digest}
	}, engine.Hooks{}); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) handleTemplateLabels(w http.ResponseWriter, r *http.Request, id auth.Identity) error {
	var req LabelsRequest
	if err := decodeBody(r, &req, false); err != nil {
		return err
	}
	k, digest, err := templateQuery(r)
	if err != nil {
		return err
	}
	if _, err := s.eng.ProposeNew(r.Context(), func(m fsm.Meta) fsm.Command {
		return fsm.SetTemplateLabels{Meta: m, Key: k, Tenant: callerTenant(id), Digest: digest, Labels: req.Labels}
	}, engine.Hooks{}); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// templatesOf lists the promoted templates tenant may see (all for root).
func templatesOf(st *fsm.State, id auth.Identity) []TemplateInfo {
	out := []TemplateInfo{}
	for _, t := range st.Templates() {
		if id.Kind != auth.Root && t.Tenant != id.Tenant {
			continue
		}
		z, _ := fsm.SizeNamed(t.Key.Size)
		out = append(out, TemplateInfo{Key: keyJSON(t.Key), ContentDigest: t.Digest, Tenant: t.Tenant,
			CPUCount: z.VCPUs, MemTotalBytes: int64(z.MemoryMiB) << 20,
			CreatedAt: time.Unix(0, t.Created).UTC().Format(time.RFC3339), Labels: t.Labels})
	}
	return out
}

func (s *Server) handleStore(w http.ResponseWriter, r *http.Request, id auth.Identity) error {
	if err := rootOnly(id); err != nil {
		return err
	}
	out := StoreResponse{Snapshots: []StoreSnapshot{}}
	s.eng.View(func(st *fsm.State) {
		for _, ref := range st.SnapshotRefs() {
			out.Snapshots = append(out.Snapshots, StoreSnapshot{Dir: ref.Dir, Kind: string(ref.Kind), Owner: ref.Owner, Mappers: st.Mappers(ref.Dir)})
		}
	})
	writeJSON(w, http.StatusOK, out)
	return nil
}
