package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sbxlog/sbxlog/projections/api"
	"github.com/sbxlog/sbxlog/projections/auth"
)

// configWriter returns a function that writes a config file body into a
// temp dir and returns its path.
func configWriter(t *testing.T) func(body string) string {
	dir := t.TempDir()
	return func(body string) string {
		p := filepath.Join(dir, "sandboxd.json")
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
}

// The config's tenants take the old daemon's plaintext token or its hash;
// a plaintext token is hashed at load and kept nowhere.
func TestConfigTenants(t *testing.T) {
	write := configWriter(t)
	cfg, err := loadConfig(write(`{"tenants":[{"name":"acme","token":"plain-secret","max_claims":5,"egress_class":"desk"},` +
		`{"name":"beta","token_sha256":"` + strings.ToUpper(auth.HashToken("b")) + `"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if err := cfg.finish(); err != nil {
		t.Fatal(err)
	}
	want := []auth.TenantConfig{
		{Name: "acme", TokenSHA256: auth.HashToken("plain-secret"), MaxClaims: 5, EgressClass: "desk"},
		{Name: "beta", TokenSHA256: auth.HashToken("b")},
	}
	if len(cfg.Tenants) != 2 || cfg.Tenants[0] != want[0] || cfg.Tenants[1] != want[1] {
		t.Fatalf("tenants %+v, want %+v", cfg.Tenants, want)
	}
	for _, bad := range []string{
		`{"tenants":[{"name":"a","token":"x","token_sha256":"` + auth.HashToken("x") + `"}]}`,
		`{"tenants":[{"name":"a"}]}`,
		`{"tenants":[{"name":"a","token_sha256":"abc"}]}`,
	} {
		cfg, err := loadConfig(write(bad))
		if err != nil {
			t.Fatalf("%s: %v", bad, err)
		}
		if err := cfg.finish(); err == nil || !strings.Contains(err.Error(), "tenants[0]") || strings.Contains(err.Error(), `"x"`) {
			t.Errorf("%s: finish = %v", bad, err)
		}
	}
	// Unknown keys stay an error (the old inline egress policy too).
	if _, err := loadConfig(write(`{"tenants":[{"name":"a","token":"x","egress":{}}]}`)); err == nil {
		t.Error("a tenant with an unknown key loaded")
	}
}

// relay_memory_bytes: 0 is the default; a budget that no relay fits in is
// refused at start, with the floor named.
func TestConfigRelayMemory(t *testing.T) {
	write := configWriter(t)
	for _, tc := range []struct {
		body string
		want int64
		err  string
	}{
		{`{}`, 0, ""},
		{`{"relay_memory_bytes":1073741824}`, 1 << 30, ""},
		{fmt.Sprintf(`{"relay_memory_bytes":%d}`, api.MinRelayMemory), api.MinRelayMemory, ""},
		{fmt.Sprintf(`{"relay_memory_bytes":%d}`, api.MinRelayMemory-1), 0, fmt.Sprintf("at least %d", api.MinRelayMemory)},
		{`{"relay_memory_bytes":-1}`, 0, "relay_memory_bytes -1"},
	} {
		cfg, err := loadConfig(write(tc.body))
		if err != nil {
			t.Fatalf("%s: %v", tc.body, err)
		}
		err = cfg.finish()
		switch {
		case tc.err == "" && err != nil:
			t.Errorf("%s: %v", tc.body, err)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%s: finish = %v, want %q", tc.body, err, tc.err)
		case tc.err == "" && cfg.RelayMemoryBytes != tc.want:
			t.Errorf("%s: relay_memory_bytes %d, want %d", tc.body, cfg.RelayMemoryBytes, tc.want)
		}
	}
}

// The config's volume catalog, with the old daemon's fields; a bad entry
// fails the load with what is wrong.
func TestConfigVolumes(t *testing.T) {
	write := configWriter(t)
	cfg, err := loadConfig(write(`{"volumes":[{"name":"imagenet","path":"/srv/imagenet.img"},{"name":"scratch","path":"/srv/s.img","writable":true,"tenants":["acme"]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if err := cfg.finish(); err != nil {
		t.Fatal(err)
	}
	if len(cfg.Volumes) != 2 || !cfg.Volumes[1].Writable || cfg.Volumes[1].Tenants[0] != "acme" {
		t.Fatalf("volumes %+v", cfg.Volumes)
	}
	for _, bad := range []string{
		`{"volumes":[{"name":"Bad","path":"/x"}]}`,
		`{"volumes":[{"name":"a","path":"relative.img"}]}`,
		`{"volumes":[{"name":"a","path":"/x"},{"name":"a","path":"/y"}]}`,
		`{"volumes":[{"name":"a","path":"/x","size":1}]}`,
	} {
		cfg, err := loadConfig(write(bad))
		if err == nil {
			err = cfg.finish()
		}
		if err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
}
