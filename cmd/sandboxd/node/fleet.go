package node

// Fleet-wide tenants. Each node is the single writer of its own log, so a
// tenant change made on one node reaches the others as an event they apply
// themselves: every node watches the tenant sets its cluster view folds
// from the other nodes' logs and, when one is newer than its own (by
// cluster.TenantVersion: the node and time of the API change it comes
// from), proposes that whole set to its own engine (fsm.SetTenants with the
// origin's version, so the adopted events carry the same version and the
// fleet agrees on the newest). A node down during a change replays the
// stream when it returns and adopts then. Sets are compared by digest;
// equal sets are never re-proposed, so the old SDK's per-peer fan-out (the
// same PUT on every node) changes nothing here. A live node whose digest
// still differs after fleetDriftGrace (its set refused here, e.g. for an
// egress class this node lacks) raises sandboxd_config_digest_mismatch.

import (
	"context"
	"sync"
	"time"

	"github.com/sbxlog/sbxlog/eventlog/event"
	"github.com/sbxlog/sbxlog/fsm"
	"github.com/sbxlog/sbxlog/projections/api"
	"github.com/sbxlog/sbxlog/projections/cluster"
)

// fleetCheck is how often the fleet's tenant sets are compared when no
// tenant event arrived (a node's liveness changes without one).
const fleetCheck = 250 * time.Millisecond

// fleetDriftGrace is how long a live node's differing digest is taken for
// propagation in flight before it counts as drift.
const fleetDriftGrace = 3 * time.Second

// fleetTenants keeps the node's tenant set the fleet's newest.
type fleetTenants struct {
	n       *Node
	view    *cluster.View
	self    string
	metrics *api.Metrics
	// startSeq is the log's last sequence at start: until the view holds
	// this node's own log that far, its idea of this node's version is
	// stale and nothing is adopted.
	startSeq uint64

	kick chan struct{}
	mu   sync.Mutex
	own  cluster.TenantVersion // from this node's commits since start
	// refused is the last version whose adoption this node refused (logged
	// once).
	refused cluster.TenantVersion
	// differs maps a node to when its digest was first seen to differ.
	differs map[string]time.Time
}

func newFleetTenants(n *Node, metrics *api.Metrics) *fleetTenants {
	return &fleetTenants{n: n, view: n.Repl.View, self: n.cfg.NodeID, metrics: metrics, startSeq: n.Log.LastSeq(),
		kick: make(chan struct{}, 1), differs: map[string]time.Time{}}
}

// onCommit records this node's own API tenant changes (from the commit
// observer: they reach the view only once replicated).
func (f *fleetTenants) onCommit(evs []event.Event) {
	for i := range evs {
		if v, ok := cluster.TenantVersionOf(&evs[i]); ok {
			f.mu.Lock()
			if f.own.Less(v) {
				f.own = v
			}
			f.mu.Unlock()
		}
	}
}

// run compares and adopts until stop closes.
func (f *fleetTenants) run(stop <-chan struct{}) {
	t := time.NewTicker(fleetCheck / 5)
	defer t.Stop()
	var gen uint64
	last := time.Time{}
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		now := f.n.cfg.Clock.Now()
		// A tenant event anywhere is acted on within a tick; otherwise
		// every fleetCheck.
		if g := f.view.TenantGen(); g == gen && now.Sub(last) < fleetCheck {
			continue
		} else {
			gen = g
		}
		last = now
		f.step(now)
	}
}

// step adopts the newest set when it is not this node's, then updates the
// mismatch gauge.
func (f *fleetTenants) step(now time.Time) {
	if f.view.Position(f.self) < f.startSeq {
		return
	}
	sets := f.view.TenantSets()
	f.mu.Lock()
	own := f.own
	f.mu.Unlock()
	var others []cluster.TenantSet
	for _, s := range sets {
		if s.Node == f.self {
			if own.Less(s.Version) {
				own = s.Version
			}
			continue
		}
		others = append(others, s)
	}
	var cur []fsm.TenantRec
	f.n.Engine.View(func(st *fsm.State) { cur = st.Tenants() })
	digest := fsm.TenantDigest(cur)
	if best, ok := cluster.NewestTenants(others); ok && own.Less(best.Version) && best.Digest != digest {
		f.adopt(best)
		f.n.Engine.View(func(st *fsm.State) { cur = st.Tenants() })
		digest = fsm.TenantDigest(cur)
	}
	f.gauge(now, others, digest)
}

func (f *fleetTenants) adopt(best cluster.TenantSet) {
	specs := make([]fsm.TenantSpec, len(best.Tenants))
	for i, t := range best.Tenants {
		specs[i] = fsm.TenantSpec{Name: t.Name, TokenSHA256: t.TokenSHA256, MaxClaims: t.MaxClaims, EgressClass: t.EgressClass}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	origin := &event.TenantOrigin{Node: best.Version.Node, Time: best.Version.Time}
	_, err := f.n.Engine.Propose(ctx, fsm.SetTenants{Meta: f.n.Engine.Meta(), Tenants: specs, Origin: origin})
	f.mu.Lock()
	defer f.mu.Unlock()
	if err != nil {
		if f.refused != best.Version {
			f.refused = best.Version
			f.n.zl.Warn().Err(err).Str("from_node", best.Node).Str("origin", best.Version.Node).Int("tenants", len(specs)).
				Msg("fleet tenants: the fleet's newest tenant set is refused here; the digests differ (sandboxd_config_digest_mismatch)")
		}
		return
	}
	if f.own.Less(best.Version) {
		f.own = best.Version
	}
	f.n.zl.Info().Str("from_node", best.Node).Str("origin", best.Version.Node).Int("tenants", len(specs)).Msg("fleet tenants: adopted the fleet's newest tenant set")
}

// gauge raises the mismatch gauge when a live node's digest has differed
// from digest for longer than fleetDriftGrace.
func (f *fleetTenants) gauge(now time.Time, others []cluster.TenantSet, digest string) {
	live := map[string]bool{}
	for _, ns := range f.view.Nodes() {
		live[ns.Node] = ns.Live
	}
	drift := false
	seen := map[string]bool{}
	for _, s := range others {
		if !live[s.Node] || s.Digest == digest {
			continue
		}
		seen[s.Node] = true
		since, ok := f.differs[s.Node]
		if !ok {
			f.differs[s.Node], since = now, now
		}
		drift = drift || now.Sub(since) >= fleetDriftGrace
	}
	for n := range f.differs {
		if !seen[n] {
			delete(f.differs, n)
		}
	}
	f.metrics.SetConfigDigestMismatch(drift)
}
