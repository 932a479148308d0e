package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sbxlog/sbxlog/projections/api"
)

// TestMakeRunThenClaim is acceptance 4 of the sandboxd issue: what `make
// run` does on a fresh clone (sandboxd with no config and no token, in a
// directory without ./data), then `sbxctl claim --template default` from
// the same directory with no token set anywhere, and `sbxctl events` shows
// the claim. The only difference from `make run` is the port: a free one
// instead of 7777, given to both with their address flags.
func TestMakeRunThenClaim(t *testing.T) {
	dir := t.TempDir()
	addr := freeAddr(t)
	d := startDaemon(t, dir, filepath.Join(dir, "data"), addr, "-listen", addr)

	tokenFile := filepath.Join(dir, "data", "api.token")
	if fi, err := os.Stat(tokenFile); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("root token file: %v, %v", fi, err)
	}
	if log := d.stderr.String(); !strings.Contains(log, "root API token generated into "+tokenFile) {
		t.Fatalf("sandboxd does not say where the root token is:\n%s", log)
	}

	out, errs, code := sbxctl(t, dir, nil, "claim", "--template", "default", "--addr", addr, "--json")
	if code != 0 {
		t.Fatalf("sbxctl claim: exit %d\n%s%s", code, out, errs)
	}
	var cl api.ClaimResponse
	if err := json.Unmarshal([]byte(out), &cl); err != nil || !strings.HasPrefix(cl.ID, "sb_") || cl.Template != "default" || cl.Size != "small" || cl.Net != "none" {
		t.Fatalf("claim answer %q: %v", out, err)
	}

	out, errs, code = sbxctl(t, dir, nil, "events", "--from", "1", "--addr", addr, "--json")
	if code != 0 {
		t.Fatalf("sbxctl events: exit %d\n%s", code, errs)
	}
	var created bool
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var e api.EventJSON
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			t.Fatalf("events line %q: %v", line, err)
		}
		created = created || e.Type == "claim_created" && e.Aggregate.ID == cl.ID
	}
	if !created {
		t.Fatalf("sbxctl events shows no claim_created for %s:\n%s", cl.ID, out)
	}
	// The table a person sees names it too.
	if out, _, code := sbxctl(t, dir, nil, "events", "--addr", addr); code != 0 || !strings.Contains(out, "claim_created") || !strings.Contains(out, "claim/"+cl.ID) {
		t.Fatalf("sbxctl events table (exit %d):\n%s", code, out)
	}
	if out, _, code := sbxctl(t, dir, nil, "ls", "--addr", addr); code != 0 || !strings.Contains(out, cl.ID) {
		t.Fatalf("sbxctl ls (exit %d):\n%s", code, out)
	}
	// Elsewhere there is no token file: sbxctl says how to get a token.
	_, errs, code = sbxctl(t, t.TempDir(), nil, "ls", "--addr", addr)
	if code != 1 || !strings.Contains(errs, "401") || !strings.Contains(errs, "api.token") {
		t.Fatalf("sbxctl without a token (exit %d): %s", code, errs)
	}
}
