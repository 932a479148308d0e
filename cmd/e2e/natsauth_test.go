package e2e

// sandboxd's embedded NATS with the credentials it generates (issue 15):
// on a host whose name has dots, from a fresh directory as `make run`
// does, with sbxctl's replication commands run from the same directory.

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sbxlog/sbxlog/cmd/sandboxd/node/replication"
	"github.com/sbxlog/sbxlog/projections/api"
)

// TestNATSAuthDots (a short name: unix socket paths under t.TempDir() must
// stay below 108 bytes).
func TestNATSAuthDots(t *testing.T) {
	dir := t.TempDir()
	addr := freeAddr(t)
	// A UTS namespace of its own, named like a real host.
	wrap := []string{"unshare", "--uts", "sh", "-c", `hostname host.example.com && exec "$0" "$@"`}
	d := startWrappedDaemon(t, dir, filepath.Join(dir, "data"), addr, wrap, "-listen", addr)
	if log := d.stderr.String(); !strings.Contains(log, `using \"host-example-com\", derived from the host name`) {
		t.Fatalf("sandboxd does not say how it chose its node id:\n%s", log)
	}
	seed := filepath.Join(dir, "data", "nats.nk")
	if fi, err := os.Stat(seed); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("NATS seed file: %v, %v", fi, err)
	}
	token, err := os.ReadFile(filepath.Join(dir, "data", "api.token"))
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequest("GET", "http://"+addr+"/v1/info", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(token)))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var in struct {
		api.Info
		Replication *replication.Status `json:"replication"`
	}
	err = json.NewDecoder(resp.Body).Decode(&in)
	resp.Body.Close()
	if err != nil || in.Replication == nil || in.Node != "host-example-com" {
		t.Fatalf("info %+v: %v", in, err)
	}
	url := in.Replication.URL
	if in.Replication.Subject != "sbx.ev.host-example-com" || strings.Contains(in.Replication.Credentials, "SU") {
		t.Fatalf("replication status %+v", in.Replication)
	}

	nc, err := nats.Connect(url, nats.Timeout(2*time.Second), nats.NoReconnect())
	if err == nil {
		nc.Close()
	}
	if !errors.Is(err, nats.ErrAuthorization) {
		t.Fatalf("a client without credentials: %v, want refused", err)
	}

	// sbxctl from the same directory finds data/nats.nk.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		out, errs, code := sbxctl(t, dir, nil, "follow", "--nats", url, "--node", "host-example-com", "--data", filepath.Join(dir, "replica"), "--once")
		if code != 0 {
			t.Fatalf("sbxctl follow: exit %d\n%s%s", code, out, errs)
		}
		// The node's first events (identity, pools) are in the stream
		// once the replicator caught up; until then the replica may be
		// empty.
		if !strings.Contains(out, "events 1..0") {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("the replica stays empty: %s", out)
		}
		time.Sleep(100 * time.Millisecond)
	}
	auditFile := filepath.Join(dir, "audit-central.jsonl")
	out, errs, code := sbxctl(t, dir, nil, "audit", "--nats", url, "--out", auditFile, "--once")
	if code != 0 || !strings.Contains(out, "host-example-com at ") {
		t.Fatalf("sbxctl audit: exit %d\n%s%s", code, out, errs)
	}
	if b, err := os.ReadFile(auditFile); err != nil || !strings.Contains(string(b), `"node":"host-example-com"`) {
		t.Fatalf("audit journal: %v\n%s", err, b)
	}
	// Elsewhere, without the seed, it is refused and told where to look.
	_, errs, code = sbxctl(t, t.TempDir(), nil, "audit", "--nats", url, "--out", filepath.Join(dir, "x.jsonl"), "--once")
	if code != 1 || !strings.Contains(errs, "data/nats.nk") {
		t.Fatalf("sbxctl audit without credentials: exit %d\n%s", code, errs)
	}
}
