package main

import (
	"strings"
	"testing"
)

// TestMetricsAuthConfig: metrics_auth takes root (the default) or none.
func TestMetricsAuthConfig(t *testing.T) {
	for _, tc := range []struct {
		value string
		ok    bool
	}{{"", true}, {"root", true}, {"none", true}, {"tenant", false}, {"Root", false}} {
		cfg := defaultConfig()
		cfg.MetricsAuth = tc.value
		err := cfg.finish()
		if tc.ok && err != nil {
			t.Errorf("metrics_auth %q: %v", tc.value, err)
		}
		if !tc.ok && (err == nil || !strings.Contains(err.Error(), "metrics_auth")) {
			t.Errorf("metrics_auth %q: %v, want an error naming metrics_auth", tc.value, err)
		}
	}
}
