package main

import "testing"

// TestDashboardConfig: the dashboard is on unless the config says
// "dashboard": false.
func TestDashboardConfig(t *testing.T) {
	write := configWriter(t)
	for _, tc := range []struct {
		body string
		off  bool
	}{{`{}`, false}, {`{"dashboard":true}`, false}, {`{"dashboard":false}`, true}} {
		cfg, err := loadConfig(write(tc.body))
		if err != nil {
			t.Fatalf("%s: %v", tc.body, err)
		}
		if got := cfg.noDashboard(); got != tc.off {
			t.Errorf("%s: dashboard off %v, want %v", tc.body, got, tc.off)
		}
	}
	if _, err := loadConfig(write(`{"dashboard":"no"}`)); err == nil {
		t.Error(`"dashboard": "no" loaded`)
	}
}
