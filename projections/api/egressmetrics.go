package api

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sbxlog/sbxlog/executors/egressmeter"
)

// The egress proxy's counters, fed by the accounting meter as decisions
// and bytes happen: every decision counted by door, outcome and reason,
// the bytes by direction. Per sandbox figures are the usage journal's
// (egress_bytes records), not labels here.

var _ egressmeter.Observer = (*Metrics)(nil)

type egressMetrics struct {
	decisions *prometheus.CounterVec
	bytes     *prometheus.CounterVec
}

func newEgressMetrics(reg *prometheus.Registry) egressMetrics {
	m := egressMetrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sbx_egress_decisions_total", Help: "Egress proxy decisions by door (http, connect, socks, inner), decision (allow, deny) and deny reason.",
		}, []string{"door", "decision", "reason"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sbx_egress_bytes_total", Help: "Payload bytes the egress proxy moved: tx guest to destination, rx back.",
		}, []string{"direction"}),
	}
	reg.MustRegister(m.decisions, m.bytes)
	return m
}

// EgressDecision implements egressmeter.Observer.
func (m *Metrics) EgressDecision(door string, allowed bool, reason string) {
	if m == nil {
		return
	}
	decision := "deny"
	if allowed {
		decision = "allow"
	}
	m.egress.decisions.WithLabelValues(door, decision, reason).Inc()
}

// EgressBytes implements egressmeter.Observer.
func (m *Metrics) EgressBytes(tx, rx int64) {
	if m == nil {
		return
	}
	if tx > 0 {
		m.egress.bytes.WithLabelValues("tx").Add(float64(tx))
	}
	if rx > 0 {
		m.egress.bytes.WithLabelValues("rx").Add(float64(rx))
	}
}
