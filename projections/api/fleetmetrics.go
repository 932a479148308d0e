package api

import "github.com/prometheus/client_golang/prometheus"

// newDigestMismatch is the old daemon's sandboxd_config_digest_mismatch:
// 1 while another live node's tenant set differs from this node's for
// longer than fleet-wide tenants take to spread (the node compares the
// digests its cluster view holds), else 0.
func newDigestMismatch() prometheus.Gauge {
	return prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "sandboxd_config_digest_mismatch",
		Help: "1 while a live node's tenant set digest differs from this node's beyond the propagation bound, else 0.",
	})
}

// SetConfigDigestMismatch sets sandboxd_config_digest_mismatch.
func (m *Metrics) SetConfigDigestMismatch(drift bool) {
	if m == nil {
		return
	}
	v := 0.0
	if drift {
		v = 1
	}
	m.digestMismatch.Set(v)
}
