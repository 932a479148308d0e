package api

import (
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/sbxlog/sbxlog/eventlog/event"
	"github.com/sbxlog/sbxlog/executors/scheduler"
	"github.com/sbxlog/sbxlog/fsm"
	"github.com/sbxlog/sbxlog/projections/auth"
)

// Metrics is the daemon's Prometheus registry. A nil *Metrics ignores
// everything, so tests can run a Server without one.
type Metrics struct {
	reg        *prometheus.Registry
	claims     *prometheus.CounterVec
	claimLat   *prometheus.HistogramVec
	appendLat  prometheus.Histogram
	opDur      *prometheus.HistogramVec
	stepDur    *prometheus.HistogramVec
	retries    *prometheus.CounterVec
	queue      *prometheus.GaugeVec
	sse        prometheus.Gauge
	replicated prometheus.Gauge
	relayMem   *prometheus.GaugeVec
	relayRefs  *prometheus.CounterVec
	old        *oldMetrics // the old daemon's sandboxd_* families
	// digestMismatch is sandboxd_config_digest_mismatch (fleetmetrics.go).
	digestMismatch prometheus.Gauge
	egress         egressMetrics
}

var _ scheduler.Observer = (*Metrics)(nil)

// latencyBuckets span 50 µs (a warm claim) to 60 s (a cold boot).
var latencyBuckets = prometheus.ExponentialBucketsRange(50e-6, 60, 24)

// NewMetrics builds the registry. eng feeds the per-pool gauges and the
// old daemon's, read at scrape time so they cost nothing between scrapes;
// the old daemon's counters are fed by OnCommit.
func NewMetrics(eng Engine) *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		claims: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sbx_claims_total", Help: "Claims by outcome (ok, failed, timeout, redirect, or a rejection code) and serving tier.",
		}, []string{"outcome", "tier"}),
		claimLat: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "sbx_claim_seconds", Help: "POST /v1/claim latency by serving tier, durable append included.", Buckets: latencyBuckets,
		}, []string{"tier"}),
		appendLat: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "sbx_log_append_seconds", Help: "Op log append latency (queue to durable).", Buckets: latencyBuckets,
		}),
		opDur: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "sbx_executor_op_seconds", Help: "Executor operation duration by kind and outcome, retries included.", Buckets: latencyBuckets,
		}, []string{"kind", "outcome"}),
		stepDur: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "sbx_executor_step_seconds", Help: "Executor recipe step duration.", Buckets: latencyBuckets,
		}, []string{"kind", "step"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sbx_executor_retries_total", Help: "Executor attempts that failed and will be retried.",
		}, []string{"kind"}),
		queue: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "sbx_executor_queue", Help: "Executor operations waiting and running.",
		}, []string{"state"}),
		sse: prometheus.NewGauge(prometheus.GaugeOpts{Name: "sbx_events_clients", Help: "Open /v1/events streams."}),
		replicated: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sbx_replicated_seq", Help: "Highest log sequence acknowledged by JetStream.",
		}),
		relayMem: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "sbx_relay_memory_bytes", Help: "The relay memory budget (state budget) and what open relays reserve from it (state reserved).",
		}, []string{"state"}),
		relayRefs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sbx_relay_refused_total", Help: "Relays refused before they opened, by reason (memory: the relay memory budget was spent).",
		}, []string{"reason"}),
		old:            newOldMetrics(eng),
		digestMismatch: newDigestMismatch(),
	}
	m.reg.MustRegister(m.digestMismatch)
	m.reg.MustRegister(m.claims, m.claimLat, m.appendLat, m.opDur, m.stepDur, m.retries, m.queue, m.sse, m.replicated, m.relayMem, m.relayRefs,
		&poolCollector{eng: eng}, m.old, prometheus.NewGoCollector(), prometheus.NewProcessCollector(prometheus.ProcessCollectorOpts{}))
	m.egress = newEgressMetrics(m.reg)
	return m
}

// OnCommit counts a durable commit's events into the old daemon's
// counters. The node feeds it every commit in log order, as it feeds
// Server.OnCommit.
func (m *Metrics) OnCommit(evs []event.Event) {
	if m != nil {
		m.old.onCommit(evs)
	}
}

func (m *Metrics) claim(outcome, tier string, d time.Duration) {
	if m == nil {
		return
	}
	m.claims.WithLabelValues(outcome, tier).Inc()
	if outcome == "ok" {
		m.claimLat.WithLabelValues(tier).Observe(d.Seconds())
	}
}

func (m *Metrics) sseClients(d float64) {
	if m != nil {
		m.sse.Add(d)
	}
}

// relayMemoryBudget records the relay memory budget.
func (m *Metrics) relayMemoryBudget(n int64) {
	if m != nil {
		m.relayMem.WithLabelValues("budget").Set(float64(n))
	}
}

// relayMemoryReserved adds delta to the bytes open relays reserve.
func (m *Metrics) relayMemoryReserved(delta int64) {
	if m != nil {
		m.relayMem.WithLabelValues("reserved").Add(float64(delta))
	}
}

// relayRefused counts a relay refused before it opened.
func (m *Metrics) relayRefused(reason string) {
	if m != nil {
		m.relayRefs.WithLabelValues(reason).Inc()
	}
}

// ObserveAppend records one op log append's latency.
func (m *Metrics) ObserveAppend(d time.Duration) {
	if m != nil {
		m.appendLat.Observe(d.Seconds())
	}
}

// SetReplicated records the replicator's acknowledged sequence.
func (m *Metrics) SetReplicated(seq uint64) {
	if m != nil {
		m.replicated.Set(float64(seq))
	}
}

// OpDone implements scheduler.Observer.
func (m *Metrics) OpDone(kind fsm.IntentKind, outcome scheduler.Outcome, d time.Duration) {
	if m != nil {
		m.opDur.WithLabelValues(string(kind), string(outcome)).Observe(d.Seconds())
	}
}

// Retry implements scheduler.Observer.
func (m *Metrics) Retry(kind fsm.IntentKind, _ error) {
	if m != nil {
		m.retries.WithLabelValues(string(kind)).Inc()
	}
}

// Step implements scheduler.Observer.
func (m *Metrics) Step(kind fsm.IntentKind, step string, d time.Duration) {
	if m != nil {
		m.stepDur.WithLabelValues(string(kind), step).Observe(d.Seconds())
	}
}

// Queue implements scheduler.Observer.
func (m *Metrics) Queue(waiting, running int) {
	if m != nil {
		m.queue.WithLabelValues("waiting").Set(float64(waiting))
		m.queue.WithLabelValues("running").Set(float64(running))
	}
}

// poolCollector reads warm and target per pool at scrape time.
type poolCollector struct{ eng Engine }

var (
	warmDesc   = prometheus.NewDesc("sbx_pool_warm", "Warm VMs ready to claim.", []string{"pool"}, nil)
	targetDesc = prometheus.NewDesc("sbx_pool_target", "Warm target of the pool.", []string{"pool"}, nil)
	refillDesc = prometheus.NewDesc("sbx_pool_refilling", "Refill clones in flight.", []string{"pool"}, nil)
	liveDesc   = prometheus.NewDesc("sbx_claims_live", "Live claims by state.", []string{"state"}, nil)
)

func (c *poolCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- warmDesc
	ch <- targetDesc
	ch <- refillDesc
	ch <- liveDesc
}

func (c *poolCollector) Collect(ch chan<- prometheus.Metric) {
	var in fsm.Info
	c.eng.View(func(st *fsm.State) { in = st.Info() })
	for _, p := range in.Pools {
		k := p.Key.String()
		ch <- prometheus.MustNewConstMetric(warmDesc, prometheus.GaugeValue, float64(p.Warm), k)
		ch <- prometheus.MustNewConstMetric(targetDesc, prometheus.GaugeValue, float64(p.Target), k)
		ch <- prometheus.MustNewConstMetric(refillDesc, prometheus.GaugeValue, float64(p.Refilling), k)
	}
	for _, st := range []fsm.ClaimStatus{fsm.ClaimPending, fsm.ClaimRunning, fsm.ClaimHibernating, fsm.ClaimHibernated, fsm.ClaimWaking} {
		ch <- prometheus.MustNewConstMetric(liveDesc, prometheus.GaugeValue, float64(in.Count(st)), st.String())
	}
}

// metricsOpen reports whether /metrics takes no token: when configured so,
// or, as with the old daemon, when the node has no root token to ask for.
func (s *Server) metricsOpen() bool {
	return s.cfg.MetricsAuth == MetricsAuthNone || !s.auth.HasRoot()
}

func (s *Server) handleMetrics(w http.ResponseWriter, r *http.Request, _ auth.Identity) error {
	if s.metrics == nil {
		return errorf(http.StatusNotFound, "metrics disabled")
	}
	promhttp.HandlerFor(s.metrics.reg, promhttp.HandlerOpts{}).ServeHTTP(w, r)
	return nil
}
