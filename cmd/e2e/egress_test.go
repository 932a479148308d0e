package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestEgressSecrets runs the built sandboxd (chsim,
// embedded NATS with the audit and usage journals: everything a node
// writes) with the old config's egress keys: a secret registry (one node
// secret from the environment, one claim-only), a pool policy naming it,
// an egress class and a tenant naming that. Host-only secrets go in at
// claim, by PUT env and by PATCH env; a sandbox is hibernated (a memory
// snapshot) and the node restarted (a state snapshot). GET env hides the
// host-only values throughout; the guest entry survives the restart (the
// sealed values open again); and no secret value is in any file of the
// data dir, in the op-log stream /v1/events or in the daemon's log.
func TestEgressSecrets(t *testing.T) {
	const root = "e2e-egress-root"
	secrets := map[string]string{
		"node":  "node-gh-token-7e1f0c9a55d2",
		"claim": "claim-gw-key-51b0e2d7aa3c",
		"put":   "put-api-key-c8a94f3e0b17",
		"patch": "patch-api-key-0d3e6b8c2f45",
	}
	t.Setenv("E2E_GH_TOKEN", secrets["node"])
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	addr := freeAddr(t)
	cfg := filepath.Join(dir, "sandboxd.json")
	writeJSON(t, cfg, map[string]any{
		"listen": addr, "data_dir": data, "node_id": "e2e-egress", "api_token": root, "hypervisor": "chsim",
		"secrets": []any{
			map[string]any{"name": "gh", "header": "Authorization", "value_env": "E2E_GH_TOKEN"},
			map[string]any{"name": "GW_KEY", "header": "X-Api-Key"},
		},
		"pools": []any{map[string]any{"template": "e2e", "warm": 1, "egress": map[string]any{
			"allow": []any{map[string]any{"host": "api.github.com", "secret": "gh"}, map[string]any{"host": "gw.example.com", "secret": "GW_KEY"}, map[string]any{"host": "*"}},
		}}},
		"egress_classes":        []any{map[string]any{"name": "desk", "egress": map[string]any{"allow": []any{map[string]any{"host": "*.example.com"}}}}},
		"egress_internal_allow": []any{"10.8.0.1/32:18090"},
		"tenants":               []any{map[string]any{"name": "acme", "token": "e2e-egress-acme-token", "egress_class": "desk"}},
	})
	d := startDaemon(t, dir, data, addr, "-config", cfg)
	call := func(method, path, body string, want int) []byte {
		t.Helper()
		return apiCall(t, http.DefaultClient, addr, root, method, path, body, want)
	}
	claim := func(body string) string {
		t.Helper()
		var cr struct{ ID string }
		if err := json.Unmarshal(call("POST", "/v1/claim", body, http.StatusOK), &cr); err != nil || cr.ID == "" {
			t.Fatalf("claim: %v", err)
		}
		return cr.ID
	}
	a := claim(`{"template":"e2e","env":{"GW_KEY":{"value":"` + secrets["claim"] + `","guest":false},"MODE":{"value":"guest-visible-mode"}}}`)
	b := claim(`{"template":"e2e"}`)
	call("PUT", "/v1/sandboxes/"+b+"/env", `{"env":{"GW_KEY":{"value":"`+secrets["put"]+`","guest":false}}}`, http.StatusNoContent)
	call("PATCH", "/v1/sandboxes/"+a+"/env", `{"env":{"E2E_GH_TOKEN":{"value":"`+secrets["patch"]+`","guest":false}}}`, http.StatusNoContent)
	call("POST", "/v1/sandboxes/"+b+"/hibernate", "", http.StatusNoContent)
	hidden := func() {
		t.Helper()
		for _, id := range []string{a, b} {
			got := string(call("GET", "/v1/sandboxes/"+id+"/env", "", http.StatusOK))
			for _, s := range secrets {
				if strings.Contains(got, s) {
					t.Fatalf("GET env of %s shows a host-only value: %s", id, got)
				}
			}
			if !strings.Contains(got, `"GW_KEY":{"value":"","guest":false}`) {
				t.Fatalf("GET env of %s: %s", id, got)
			}
		}
	}
	hidden()
	var logs []string
	d.stop(t)
	logs = append(logs, d.stderr.String())

	d = startDaemon(t, dir, data, addr, "-config", cfg)
	hidden()
	if got := string(call("GET", "/v1/sandboxes/"+a+"/env", "", http.StatusOK)); !strings.Contains(got, `"MODE":{"value":"guest-visible-mode"}`) {
		t.Fatalf("the guest entry after a restart: %s", got)
	}
	// The op-log stream, as a client reads it.
	events := string(func() []byte {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "GET", "http://"+addr+"/v1/events?from=1", nil)
		req.Header.Set("Authorization", "Bearer "+root)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var buf bytes.Buffer
		_, _ = io.Copy(&buf, resp.Body) // ends at the timeout: a live stream
		return buf.Bytes()
	}())
	if !strings.Contains(events, "claim_env_changed") || !strings.Contains(events, `"sealed"`) {
		t.Fatalf("the stream lacks the sealed env events:\n%s", tail(events, 4096))
	}
	d.stop(t)
	logs = append(logs, d.stderr.String())

	for name, s := range secrets {
		if strings.Contains(events, s) {
			t.Errorf("/v1/events holds the %s secret in the clear", name)
		}
		for _, l := range logs {
			if strings.Contains(l, s) {
				t.Errorf("the daemon's log holds the %s secret in the clear", name)
			}
		}
	}
	seen := grepDataDir(t, data, secrets)
	// The journals were fed the env events (so the walk read them).
	if audit, err := os.ReadFile(filepath.Join(data, "audit.jsonl")); err != nil || !bytes.Contains(audit, []byte("claim_env_changed")) {
		t.Errorf("audit.jsonl has no claim_env_changed record (%v)", err)
	}
	// What was walked: the op log, its state snapshot, the stream's store,
	// the journals.
	for _, want := range []string{"log/", "nats/", "audit.jsonl", "usage.jsonl", "env.key"} {
		if !strings.Contains(strings.Join(seen, "\n"), want) {
			t.Errorf("no %s in the data dir (files: %v)", want, seen)
		}
	}
}

// apiCall sends method path with body (none when "") and the bearer token
// to the API at addr through hc, fails t unless the answer is want, and
// returns its body.
func apiCall(t *testing.T, hc *http.Client, addr, token, method, path, body string, want int) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://"+addr+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != want {
		t.Fatalf("%s %s %s: %d %s, want %d", method, path, body, resp.StatusCode, b, want)
	}
	return b
}

// grepDataDir reads every regular file under data and fails t for each
// one holding a value of secrets (name -> value) in the clear; it returns
// the paths read, relative to data (at least 5, or t fails).
func grepDataDir(t *testing.T, data string, secrets map[string]string) []string {
	t.Helper()
	var seen []string
	err := filepath.WalkDir(data, func(path string, e fs.DirEntry, err error) error {
		if err != nil || !e.Type().IsRegular() {
			return err
		}
		raw, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		seen = append(seen, strings.TrimPrefix(path, data+"/"))
		for name, s := range secrets {
			if bytes.Contains(raw, []byte(s)) {
				t.Errorf("%s holds the %s secret in the clear", path, name)
			}
		}
		return nil
	})
	if err != nil || len(seen) < 5 {
		t.Fatalf("walked %d files of %s: %v", len(seen), data, err)
	}
	return seen
}
