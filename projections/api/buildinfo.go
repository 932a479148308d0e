package api

import "github.com/prometheus/client_golang/prometheus"

// BuildInfo publishes sbx_build_info{version, revision, go} 1: which build
// serves, for dashboards and alerts that join on it (the node passes what
// cmd/buildinfo read). Called once, at start.
func (m *Metrics) BuildInfo(version, revision, goVersion string) {
	if m == nil {
		return
	}
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "sbx_build_info", Help: "The build serving: module version, VCS revision and Go toolchain; always 1.",
		ConstLabels: prometheus.Labels{"version": version, "revision": revision, "go": goVersion},
	})
	g.Set(1)
	m.reg.MustRegister(g)
}
