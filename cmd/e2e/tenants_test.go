package e2e

import (
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestTenantsAndDrainEndToEnd runs the built sandboxd (chsim, embedded
// NATS: the op log, its snapshots, the stream's store, everything a node
// writes) with a config tenant given the old daemon's way, a plaintext
// token; adds a tenant with sbxctl; drains; restarts. The tenants and the
// drain survive the restart, and neither raw token is in any file of the
// data dir or in the daemon's log.
func TestTenantsAndDrainEndToEnd(t *testing.T) {
	const root, cfgToken, apiToken = "e2e-root-token", "e2e-config-tenant-token-4c1d", "e2e-api-tenant-token-93ab"
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	addr := freeAddr(t)
	cfg := filepath.Join(dir, "sandboxd.json")
	writeJSON(t, cfg, map[string]any{
		"listen": addr, "data_dir": data, "node_id": "e2e-tenants", "api_token": root, "hypervisor": "chsim",
		"pools":   []any{map[string]any{"template": "e2e", "warm": 0}},
		"tenants": []any{map[string]any{"name": "cfg", "token": cfgToken, "max_claims": 1}},
	})
	asRoot := []string{"SBX_ADDR=" + addr, "SBX_API_TOKEN=" + root}
	run := func(env []string, args ...string) string {
		t.Helper()
		out, errs, code := sbxctl(t, dir, env, args...)
		if code != 0 {
			t.Fatalf("sbxctl %s: exit %d\n%s%s", strings.Join(args, " "), code, out, errs)
		}
		return out
	}
	var logs []string
	d := startDaemon(t, dir, data, addr, "-config", cfg)
	run(asRoot, "tenants", "put", "api", "--tenant-token", apiToken, "--max-claims", "2")
	run([]string{"SBX_ADDR=" + addr, "SBX_API_TOKEN=" + cfgToken}, "claim", "--template", "e2e")
	if out := run(asRoot, "drain"); !strings.Contains(out, "DRAINING") {
		t.Fatalf("drain:\n%s", out)
	}
	d.stop(t)
	logs = append(logs, d.stderr.String())

	d = startDaemon(t, dir, data, addr, "-config", cfg)
	if out := run(asRoot, "info"); !strings.Contains(out, "DRAINING") {
		t.Fatalf("info after a restart:\n%s", out)
	}
	out := run(asRoot, "tenants")
	if !strings.Contains(out, "api ") || !strings.Contains(out, "cfg ") {
		t.Fatalf("tenants after a restart:\n%s", out)
	}
	asAPI := []string{"SBX_ADDR=" + addr, "SBX_API_TOKEN=" + apiToken}
	if _, errs, code := sbxctl(t, dir, asAPI, "claim", "--template", "e2e"); code != 1 || !strings.Contains(errs, "node claim quota reached: node draining") {
		t.Fatalf("claim on a drained node after a restart: exit %d %s", code, errs)
	}
	run(asRoot, "uncordon")
	run(asAPI, "claim", "--template", "e2e")
	d.stop(t)
	logs = append(logs, d.stderr.String())

	for _, tok := range []string{cfgToken, apiToken} {
		for _, l := range logs {
			if strings.Contains(l, tok) {
				t.Errorf("the daemon's log holds the raw token %q", tok)
			}
		}
	}
	files := 0
	err := filepath.WalkDir(data, func(path string, e fs.DirEntry, err error) error {
		if err != nil || !e.Type().IsRegular() {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		files++
		for _, tok := range []string{cfgToken, apiToken} {
			if bytes.Contains(b, []byte(tok)) {
				t.Errorf("%s holds the raw token %q", path, tok)
			}
		}
		return nil
	})
	if err != nil || files < 5 {
		t.Fatalf("walked %d files of %s: %v", files, data, err)
	}
	if _, err := os.Stat(filepath.Join(data, "nats")); err != nil {
		t.Fatalf("no NATS store in the data dir: %v", err)
	}
}
