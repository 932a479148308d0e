package api

import (
	"fmt"
	"net/http"

	"github.com/sbxlog/sbxlog/fsm"
	"github.com/sbxlog/sbxlog/fsm/engine"
	"github.com/sbxlog/sbxlog/projections/auth"
)

// PoolInfo is one pool in GET /v1/info.
type PoolInfo struct {
	Key                  string `json:"key"`
	Template             string `json:"template"`
	Net                  string `json:"net"`
	Size                 string `json:"size"`
	Warm                 int    `json:"warm"`
	Refilling            int    `json:"refilling"`
	Target               int    `json:"target"`
	WarmMax              int    `json:"warm_max"`
	IdleHibernateSeconds int64  `json:"idle_hibernate_seconds"`
	Golden               string `json:"golden"`
	Draining             bool   `json:"draining,omitempty"`
	AtCapacity           bool   `json:"at_capacity,omitempty"`
	Live                 int    `json:"live"`
}

// Info is GET /v1/info's body (and PUT /v1/pools's answer).
type Info struct {
	Node       string     `json:"node"`
	OwnerAddr  string     `json:"owner_addr"`
	Hypervisor string     `json:"hypervisor"`
	Pools      []PoolInfo `json:"pools"`
	Claimed    int        `json:"claimed"`
	Pending    int        `json:"pending"`
	Hibernated int        `json:"hibernated"`
	Live       int        `json:"live"`
	MaxClaims  int        `json:"max_claims"`
	AtCapacity bool       `json:"at_capacity,omitempty"`
	Draining   bool       `json:"draining,omitempty"`
	LogSeq     uint64     `json:"log_seq"`
	// Replication is the node's replication status (Options.Replication);
	// absent when replication is off, and for every caller but root: it
	// names the NATS server, and the stream there holds every tenant's
	// events.
	Replication any `json:"replication,omitempty"`
}

func (s *Server) info(id auth.Identity) Info {
	out := Info{Node: s.cfg.Node, OwnerAddr: s.cfg.OwnerAddr, Hypervisor: s.cfg.Hypervisor, Pools: []PoolInfo{}}
	s.eng.View(func(st *fsm.State) {
		in := st.Info()
		for _, p := range in.Pools {
			spec, _ := st.Pool(p.Key)
			out.Pools = append(out.Pools, PoolInfo{
				Key: p.Key.String(), Template: p.Key.Template, Net: p.Key.Net, Size: p.Key.Size,
				Warm: p.Warm, Refilling: p.Refilling, Target: p.Target, WarmMax: p.WarmMax,
				IdleHibernateSeconds: spec.Spec.IdleHibernateSeconds, Golden: p.Golden.String(),
				Draining: p.Draining, AtCapacity: p.AtCapacity, Live: p.Live,
			})
		}
		// "claimed" counts claims holding a running VM (the old daemon's
		// meaning); hibernating and waking ones are in transit.
		out.Claimed = in.Count(fsm.ClaimRunning) + in.Count(fsm.ClaimHibernating) + in.Count(fsm.ClaimWaking)
		out.Pending = in.Count(fsm.ClaimPending)
		out.Hibernated = in.Count(fsm.ClaimHibernated)
		out.Live = in.Live
		out.AtCapacity = in.AtCapacity
		out.Draining = st.Draining()
		out.MaxClaims = st.Limits().MaxClaims
		out.LogSeq = st.Applied()
	})
	if s.replication != nil && id.Kind == auth.Root {
		out.Replication = s.replication()
	}
	return out
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
	if err := req.validate(); err != nil {
		return err
	}
	specs := make([]fsm.PoolSpec, len(req.Pools))
	for i, p := range req.Pools {
		specs[i] = fsm.PoolSpec{
			PoolKey: fsm.PoolKey{Template: p.Template, Net: p.Net, Size: p.Size},
			Warm:    p.Warm, WarmMax: p.WarmMax, IdleHibernateSeconds: p.IdleHibernateSeconds,
		}
	}
	if _, err := s.eng.ProposeNew(r.Context(), func(m fsm.Meta) fsm.Command { return fsm.ConfigurePools{Meta: m, Pools: specs} }, engine.Hooks{}); err != nil {
		return err
	}
	// The answer reports the state at its log_seq: it acknowledges the
	// change, so it goes out once the log is durable up to there.
	out := s.info(id)
	if err := s.log.WaitDurable(r.Context(), out.LogSeq); err != nil {
		return fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) handleHealthz(w http.ResponseWriter, r *http.Request, _ auth.Identity) error {
	if err := decodeBody(r, &struct{}{}, true); err != nil {
		return err
	}
	select {
	case <-s.ready:
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	default:
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "starting", "error": "reconcile has not finished"})
	}
	return nil
}
