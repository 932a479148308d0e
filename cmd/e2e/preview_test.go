package e2e

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sbxlog/sbxlog/projections/api"
	"github.com/sbxlog/sbxlog/projections/apiclient"
)

// Preview on the built sandboxd with chsim: sbxctl preview mints a URL on
// the preview listener (preview_listen), which reaches the simulated
// guest's HTTP server (port 80) through the agent's port_forward with no
// other credential, and is 404 once the claim is released.
func TestPreviewChsim(t *testing.T) {
	dir := shortTempDir(t, "pv")
	data := filepath.Join(dir, "data")
	addr, paddr := freeAddr(t), freeAddr(t)
	cfg := filepath.Join(dir, "sandboxd.json")
	writeJSON(t, cfg, map[string]any{
		"listen": addr, "data_dir": data, "node_id": "e2e", "api_token": "pv-root", "hypervisor": "chsim",
		"preview_listen": paddr, "pools": []any{map[string]any{"template": "default", "warm": 1}}, "nats": map[string]any{"disabled": true},
	})
	startDaemon(t, dir, data, addr, "-config", cfg)
	c, err := apiclient.New(addr, "pv-root", nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cl, err := c.Claim(ctx, api.ClaimRequest{Template: "default"})
	if err != nil {
		t.Fatal(err)
	}
	out, errs, code := sbxctl(t, dir, []string{"SBX_ADDR=" + addr, "SBX_API_TOKEN=" + cl.Token}, "preview", cl.ID, "--port", "80", "--json")
	var pr api.PreviewResponse
	if code != 0 || json.Unmarshal([]byte(out), &pr) != nil || !strings.HasPrefix(pr.URL, "http://"+paddr+"/p/") {
		t.Fatalf("sbxctl preview: %d %q %s", code, out, errs)
	}
	if st, body := httpGet(t, pr.URL+"index.html?q=1"); st != http.StatusOK || !strings.HasPrefix(body, "GET /index.html?q=1 HTTP/1.1\n") {
		t.Fatalf("through the preview: %d %q", st, body)
	}
	if err := c.Release(ctx, cl.ID); err != nil {
		t.Fatal(err)
	}
	if st, body := httpGet(t, pr.URL); st != http.StatusNotFound || !strings.Contains(body, "unknown sandbox") {
		t.Fatalf("after release: %d %q", st, body)
	}
}

// httpGet is GET u's status and body.
func httpGet(t *testing.T, u string) (int, string) {
	t.Helper()
	resp, err := http.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}
