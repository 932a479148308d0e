package api

import (
	"fmt"
	"io"
	"net"
	"net/http"

	"github.com/sbxlog/sbxlog/fsm"
	"github.com/sbxlog/sbxlog/fsm/egress"
	"github.com/sbxlog/sbxlog/fsm/engine"
	"github.com/sbxlog/sbxlog/projections/auth"
)

// PoolInfo is one pool in GET /v1/info: the old daemon's fields (key,
// warm, refilling, target, golden), then sbxlog's.
type PoolInfo struct {
	Key       fsm.PoolKey `json:"key"`
	Warm      int         `json:"warm"`
	Refilling int         `json:"refilling"`
	Target    int         `json:"target"`
	// Golden says whether the pool's golden snapshot is ready (the old
	// daemon's boolean); GoldenState says where it is.
	Golden               bool   `json:"golden"`
	GoldenState          string `json:"golden_state"`
	WarmMax              int    `json:"warm_max"`
	IdleHibernateSeconds int64  `json:"idle_hibernate_seconds"`
	// The pool's archive settings (0: none).
	ArchiveAfterSeconds       int64 `json:"archive_after_seconds,omitempty"`
	ArchiveDeleteAfterSeconds int64 `json:"archive_delete_after_seconds,omitempty"`
	Draining                  bool  `json:"draining,omitempty"`
	AtCapacity                bool  `json:"at_capacity,omitempty"`
	Live                      int   `json:"live"`
}

// Info is GET /v1/info's body (and PUT /v1/pools's answer): the old
// daemon's fields, then sbxlog's.
type Info struct {
	Pools []PoolInfo `json:"pools"`
	// Templates are the promoted templates the caller may see (templates.go).
	Templates []TemplateInfo `json:"templates"`
	// Claimed counts claims holding a running VM (running, hibernating,
	// waking); Hibernated those hibernated.
	Claimed    int `json:"claimed"`
	Hibernated int `json:"hibernated"`
	// Archived counts claims whose snapshot is in the archive store
	// (Hibernated does not count them). Failed is always 0: a claim whose
	// VM cannot be restarted ends (state failed) instead of staying live
	// with its VMM down.
	Archived int `json:"archived"`
	Failed   int `json:"failed,omitempty"`
	// Draining: the node refuses new claims (POST /v1/drain).
	Draining bool `json:"draining,omitempty"`
	// AdvertiseAddr is OwnerAddr when it names a host clients can dial.
	AdvertiseAddr string `json:"advertise_addr,omitempty"`
	// Peers are the other nodes' addresses (GET /v1/peers).
	Peers            []string `json:"peers,omitempty"`
	AtCapacity       bool     `json:"at_capacity,omitempty"`
	AtCapacityReason string   `json:"at_capacity_reason,omitempty"`
	Node             string   `json:"node"`
	OwnerAddr        string   `json:"owner_addr"`
	Hypervisor       string   `json:"hypervisor"`
	Pending          int      `json:"pending"`
	Live             int      `json:"live"`
	MaxClaims        int      `json:"max_claims"`
	LogSeq           uint64   `json:"log_seq"`
	// Replication is the node's replication status (Options.Replication);
	// absent when replication is off, and for every caller but root: it
	// names the NATS server, and the stream there holds every tenant's
	// events.
	Replication any `json:"replication,omitempty"`
}

// atCapacityReason is at_capacity_reason: the fsm records that the node
// is parked at capacity, not the hypervisor's words.
const atCapacityReason = "the hypervisor refused another VM; refills are parked"

func (s *Server) info(id auth.Identity) Info {
	out := Info{Node: s.cfg.Node, OwnerAddr: s.cfg.OwnerAddr, Hypervisor: s.cfg.Hypervisor,
		Pools: []PoolInfo{}, AdvertiseAddr: advertised(s.cfg.OwnerAddr), Peers: s.peers()}
	s.eng.View(func(st *fsm.State) {
		in := st.Info()
		for _, p := range in.Pools {
			spec, _ := st.Pool(p.Key)
			out.Pools = append(out.Pools, PoolInfo{
				Key: p.Key, Warm: p.Warm, Refilling: p.Refilling, Target: p.Target,
				Golden: p.Golden == fsm.GoldenReady, GoldenState: p.Golden.String(), WarmMax: p.WarmMax,
				IdleHibernateSeconds: spec.Spec.IdleHibernateSeconds,
				ArchiveAfterSeconds:  spec.Spec.ArchiveAfterSeconds, ArchiveDeleteAfterSeconds: spec.Spec.ArchiveDeleteAfterSeconds,
				Draining: p.Draining, AtCapacity: p.AtCapacity, Live: p.Live,
			})
		}
		// "claimed" counts claims holding a running VM; hibernating and
		// waking ones are in transit.
		out.Claimed = in.Count(fsm.ClaimRunning) + in.Count(fsm.ClaimHibernating) + in.Count(fsm.ClaimWaking)
		out.Pending = in.Count(fsm.ClaimPending)
		out.Archived = in.CountVMs(fsm.VMArchived)
		out.Hibernated = in.Count(fsm.ClaimHibernated) - out.Archived
		out.Live = in.Live
		out.AtCapacity = in.AtCapacity
		if in.AtCapacity {
			out.AtCapacityReason = atCapacityReason
		}
		out.Draining = st.Draining()
		out.MaxClaims = st.Limits().MaxClaims
		out.LogSeq = st.Applied()
		out.Templates = s.templatesOf(st, id)
	})
	if s.replication != nil && id.Kind == auth.Root {
		out.Replication = s.replication()
	}
	return out
}

// advertised returns addr when clients can dial it: the old daemon left
// advertise_addr out for an address without a host or with an unspecified
// one (":7777", "0.0.0.0:7777").
func advertised(addr string) string {
	host, _, err := net.SplitHostPort(addr)
	if err != nil || host == "" {
		return ""
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		return ""
	}
	return addr
}

func (s *Server) handleInfo(w http.ResponseWriter, r *http.Request, id auth.Identity) error {
	writeJSON(w, http.StatusOK, s.info(id))
	return nil
}

func (s *Server) handleGetPools(w http.ResponseWriter, r *http.Request, _ auth.Identity) error {
	out := PoolsRequest{Pools: []PoolSpec{}}
	s.eng.View(func(st *fsm.State) {
		for _, p := range st.Pools() {
			if p.Draining {
				continue
			}
			out.Pools = append(out.Pools, PoolSpec{
				Template: p.Spec.Template, Net: p.Spec.Net, Size: p.Spec.Size,
				Warm: p.Spec.Warm, WarmMax: p.Spec.WarmMax, IdleHibernateSeconds: p.Spec.IdleHibernateSeconds,
				ArchiveAfterSeconds: p.Spec.ArchiveAfterSeconds, ArchiveDeleteAfterSeconds: p.Spec.ArchiveDeleteAfterSeconds,
				Egress: policyJSON(p.Egress),
			})
		}
	})
	writeJSON(w, http.StatusOK, out)
	return nil
}

// handlePutPools replaces the pool set; pools left out drain.
func (s *Server) handlePutPools(w http.ResponseWriter, r *http.Request, id auth.Identity) error {
	var req PoolsRequest
	if err := decodeBody(r, &req, false); err != nil {
		return err
	}
	if err := req.validate(s.cfg.Archive); err != nil {
		return err
	}
	specs := make([]fsm.PoolSpec, len(req.Pools))
	var pols map[fsm.PoolKey]*egress.Policy
	for i, p := range req.Pools {
		specs[i] = p.Spec()
		// A pool this node cannot serve is refused with the whole change.
		if err := s.checkPool(specs[i].PoolKey, true); err != nil {
			return s.namingKnown(err, id)
		}
		if p.Egress != nil {
			pol := p.Egress.Policy()
			if err := s.checkPolicy(pol, fmt.Sprintf("pool %q", p.Template), true); err != nil {
				return err
			}
			if pols == nil {
				pols = map[fsm.PoolKey]*egress.Policy{}
			}
			pols[specs[i].PoolKey] = &pol
		}
	}
	if _, err := s.eng.ProposeNew(r.Context(), func(m fsm.Meta) fsm.Command { return fsm.ConfigurePools{Meta: m, Pools: specs, Egress: pols} }, engine.Hooks{}); err != nil {
		return err
	}
	// The answer acknowledges the change (writeInfo).
	return s.writeInfo(w, r, id)
}

// handleHealthz answers the old daemon's text: "ok" once the first
// reconcile finished, a short text with 503 before.
func (s *Server) handleHealthz(w http.ResponseWriter, r *http.Request, _ auth.Identity) error {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	select {
	case <-s.ready:
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, "ok")
	default:
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = io.WriteString(w, "starting: the start-up reconcile has not finished")
	}
	return nil
}
