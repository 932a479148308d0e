package api

import (
	"slices"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sbxlog/sbxlog/eventlog/event"
	"github.com/sbxlog/sbxlog/fsm"
)

// The old daemon's sandboxd_* families, beside the sbx_* ones, for the
// dashboards and alerts written against it: the same names, label names,
// types and help texts, for the facts sbxlog has. Gauges are read from the
// state at scrape time; counters count commits from OnCommit, so, as the
// old daemon's, they start at zero when the daemon starts (a restart's
// replay is not counted again). The store recipes' counters (forks,
// checkpoints, promotes, archives, unarchives, archive deletes) count their
// events as the old daemon counted its operations (oldstore.go).

var (
	oldClaimed      = prometheus.NewDesc("sandboxd_claimed", "live claims on this node", nil, nil)
	oldHibernated   = prometheus.NewDesc("sandboxd_hibernated", "claims currently hibernated", nil, nil)
	oldArchived     = prometheus.NewDesc("sandboxd_archived", "claims archived to the checkpoint store", nil, nil)
	oldFailed       = prometheus.NewDesc("sandboxd_failed", "claims whose VMM is down and not restarted", nil, nil)
	oldDraining     = prometheus.NewDesc("sandboxd_draining", "1 while the node is cordoned for maintenance", nil, nil)
	oldTenantClaims = prometheus.NewDesc("sandboxd_tenant_claims", "live claims per configured tenant", []string{"tenant"}, nil)
	oldPoolWarm     = prometheus.NewDesc("sandboxd_pool_warm", "claim-ready VMs per pool", []string{"template", "net", "size"}, nil)
	oldPoolTarget   = prometheus.NewDesc("sandboxd_pool_target", "warm watermark per pool", []string{"template", "net", "size"}, nil)
	oldClaims       = prometheus.NewDesc("sandboxd_claims_total", "claims served, by provisioning tier", []string{"tier"}, nil)
	oldClaimSecs    = prometheus.NewDesc("sandboxd_claim_seconds_total", "time spent serving claims", nil, nil)
	oldWakeSecs     = prometheus.NewDesc("sandboxd_wake_seconds_total", "time spent waking", nil, nil)
	oldWakes        = prometheus.NewDesc("sandboxd_wakes_total", "transparent wakes", nil, nil)
	oldHibernates   = prometheus.NewDesc("sandboxd_hibernates_total", "hibernate transitions", nil, nil)
	oldReleases     = prometheus.NewDesc("sandboxd_releases_total", "claims released", nil, nil)
	oldReaps        = prometheus.NewDesc("sandboxd_reaps_total", "claims reaped at deadline", nil, nil)
	oldForks        = prometheus.NewDesc("sandboxd_forks_total", "fork operations", nil, nil)
	oldCheckpoints  = prometheus.NewDesc("sandboxd_checkpoints_total", "checkpoints captured", nil, nil)
	oldPromotes     = prometheus.NewDesc("sandboxd_promotes_total", "templates promoted", nil, nil)
	oldArchives     = prometheus.NewDesc("sandboxd_archives_total", "claims archived to the store", nil, nil)
	oldUnarchives   = prometheus.NewDesc("sandboxd_unarchives_total", "archived claims restored", nil, nil)
	oldArchiveDels  = prometheus.NewDesc("sandboxd_archive_deletes_total", "archived checkpoints purged at retention", nil, nil)
)

// oldStoreDescs are the store recipes' counters, in oldStore's order.
var oldStoreDescs = []*prometheus.Desc{oldForks, oldCheckpoints, oldPromotes, oldArchives, oldUnarchives, oldArchiveDels}

// oldTiers are sandboxd_claims_total's tiers, every one always served.
var oldTiers = []fsm.Tier{fsm.TierWarm, fsm.TierClone, fsm.TierCold}

// oldMetrics collects the sandboxd_* families.
type oldMetrics struct {
	eng Engine

	mu           sync.Mutex
	claims       map[fsm.Tier]float64
	claimSeconds float64
	wakeSeconds  float64
	wakes        float64
	hibernates   float64
	releases     float64
	reaps        float64
	// store counts the store recipes (oldstore.go).
	store oldStore
	// wakeAt is when each wake in flight was requested (event time, ns).
	wakeAt map[string]int64
}

func newOldMetrics(eng Engine) *oldMetrics {
	return &oldMetrics{eng: eng, claims: map[fsm.Tier]float64{}, wakeAt: map[string]int64{}, store: newOldStore()}
}

func (o *oldMetrics) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{oldClaimed, oldHibernated, oldArchived, oldFailed, oldDraining, oldTenantClaims,
		oldPoolWarm, oldPoolTarget, oldClaims, oldClaimSecs, oldWakeSecs, oldWakes, oldHibernates, oldReleases, oldReaps} {
		ch <- d
	}
	for _, d := range oldStoreDescs {
		ch <- d
	}
}

func (o *oldMetrics) Collect(ch chan<- prometheus.Metric) {
	var in fsm.Info
	var tenants map[string]int
	var draining bool
	o.eng.View(func(st *fsm.State) { in, tenants, draining = st.Info(), st.TenantsLive(), st.Draining() })
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	// The old daemon counted every claim it held, hibernated ones included.
	gauge(oldClaimed, float64(in.Live))
	gauge(oldHibernated, float64(in.Count(fsm.ClaimHibernated)))
	gauge(oldArchived, float64(in.CountVMs(fsm.VMArchived)))
	// sbxlog ends a claim whose VMM died once its restarts are spent: the
	// failed claims the state still retains are the old daemon's failed.
	gauge(oldFailed, float64(in.Count(fsm.ClaimFailed)))
	gauge(oldDraining, b2f(draining))
	for name, n := range tenants {
		gauge(oldTenantClaims, float64(n), name)
	}
	for _, p := range in.Pools {
		if p.Draining {
			continue // the old daemon hid removed pools
		}
		gauge(oldPoolWarm, float64(p.Warm), p.Key.Template, p.Key.Net, p.Key.Size)
		gauge(oldPoolTarget, float64(p.Target), p.Key.Template, p.Key.Net, p.Key.Size)
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	counter := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, labels...)
	}
	for _, t := range oldTiers {
		counter(oldClaims, o.claims[t], t.String())
	}
	counter(oldClaimSecs, o.claimSeconds)
	counter(oldWakeSecs, o.wakeSeconds)
	counter(oldWakes, o.wakes)
	counter(oldHibernates, o.hibernates)
	counter(oldReleases, o.releases)
	counter(oldReaps, o.reaps)
	for i, d := range oldStoreDescs {
		counter(d, o.store.n[i])
	}
}

// onCommit counts a durable commit's events. A claim counts once served:
// a warm claim at its creation (it runs at once, so it took no time in the
// log's clock), a clone or cold one at claim_served, its seconds from its
// creation to then. A wake's seconds run from wake_requested to woken.
func (o *oldMetrics) onCommit(evs []event.Event) {
	type served struct {
		tier fsm.Tier
		secs float64
	}
	var claims []served
	archivedIn := archivedInState(o.eng, evs)
	isClaim := func(e event.Event) bool { return e.Type == event.TypeClaimCreated || e.Type == event.TypeClaimServed }
	if slices.ContainsFunc(evs, isClaim) {
		// The tier and creation time are the claim's record's: one read
		// of the state per commit, and only for commits about claims.
		o.eng.View(func(st *fsm.State) {
			for i := range evs {
				e := &evs[i]
				if !isClaim(*e) {
					continue
				}
				c, ok := st.Claim(e.AggID)
				switch {
				case !ok:
				case e.Type == event.TypeClaimCreated && c.Tier == fsm.TierWarm:
					claims = append(claims, served{tier: fsm.TierWarm})
				case e.Type == event.TypeClaimServed:
					claims = append(claims, served{tier: c.Tier, secs: float64(max(e.Time-c.Created, 0)) / 1e9})
				}
			}
		})
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, c := range claims {
		o.claims[c.tier]++
		o.claimSeconds += c.secs
	}
	for i := range evs {
		o.store.count(&evs[i], archivedIn)
	}
	for i := range evs {
		e := &evs[i]
		switch e.Type {
		case event.TypeWakeRequested:
			o.wakeAt[e.AggID] = e.Time
		case event.TypeWoken:
			o.wakes++
			if at, ok := o.wakeAt[e.AggID]; ok {
				o.wakeSeconds += float64(max(e.Time-at, 0)) / 1e9
			}
			delete(o.wakeAt, e.AggID)
		case event.TypeWakeFailed, event.TypeClaimFailed:
			delete(o.wakeAt, e.AggID)
		case event.TypeHibernated:
			o.hibernates++
		case event.TypeClaimReleased:
			o.releases++
			delete(o.wakeAt, e.AggID)
		case event.TypeClaimExpired:
			o.reaps++
			delete(o.wakeAt, e.AggID)
		}
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
