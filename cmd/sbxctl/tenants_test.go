package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/sbxlog/sbxlog/fsm"
	"github.com/sbxlog/sbxlog/projections/api"
)

func TestTenantsCommands(t *testing.T) {
	n := startNode(t, 1)
	mustRun(t, "tenants", "put", "beta", "--tenant-token", "beta-token", "--max-claims", "2")
	out := mustRun(t, "tenants", "put", "gamma", "--generate")
	tok := regexp.MustCompile(`token (sbxt_[0-9a-f]{48})`).FindStringSubmatch(out)
	if tok == nil {
		t.Fatalf("put --generate: %q", out)
	}
	// The generated token is a tenant's: it claims.
	t.Setenv(envToken, tok[1])
	mustRun(t, "claim", "--template", "default")
	t.Setenv(envToken, rootToken)

	var l api.TenantList
	mustJSON(t, &l, "tenants")
	if len(l.Tenants) != 3 || l.Tenants[1] != (api.TenantJSON{Name: "beta", MaxClaims: 2}) || l.Tenants[2].Claims != 1 {
		t.Fatalf("tenants --json: %+v", l)
	}
	if table := mustRun(t, "tenants", "ls", "--limit", "1"); !strings.Contains(table, "acme") || !strings.Contains(table, "more: sbxctl tenants --after acme") {
		t.Fatalf("tenants ls --limit 1:\n%s", table)
	}

	f := filepath.Join(t.TempDir(), "tenants.json")
	if err := os.WriteFile(f, []byte(`{"tenants":[{"name":"acme"},{"name":"delta","token":"delta-token"}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if out := mustRun(t, "tenants", "set", "--file", f); !strings.Contains(out, "delta") || strings.Contains(out, "beta ") {
		t.Fatalf("tenants set:\n%s", out)
	}
	// gamma was left out: removed, listed while its claim lives.
	if out := mustRun(t, "tenants"); !regexp.MustCompile(`gamma\s+-\s+-\s+1\s+removed`).MatchString(out) {
		t.Fatalf("removed gamma not listed:\n%s", out)
	}
	mustRun(t, "tenants", "rm", "delta")
	if code, _, errs := sbx("tenants", "rm", "delta"); code != 1 || !strings.Contains(errs, "unknown tenant") {
		t.Fatalf("second rm: exit %d %q", code, errs)
	}
	if code, _, _ := sbx("tenants", "put", "x", "--tenant-token", "a", "--generate"); code != 2 {
		t.Fatalf("exclusive token flags: exit %d", code)
	}
	var names []string
	n.Engine.View(func(st *fsm.State) {
		for _, tr := range st.Tenants() {
			names = append(names, tr.Name)
		}
	})
	if strings.Join(names, ",") != "acme" {
		t.Fatalf("state tenants %v", names)
	}
}

func TestDrainCommands(t *testing.T) {
	startNode(t, 1)
	if out := mustRun(t, "drain"); !strings.Contains(out, "DRAINING") {
		t.Fatalf("drain:\n%s", out)
	}
	if code, _, errs := sbx("claim", "--template", "default"); code != 1 || !strings.Contains(errs, "node claim quota reached: node draining") {
		t.Fatalf("claim while draining: exit %d %q", code, errs)
	}
	var in api.Info
	mustJSON(t, &in, "uncordon")
	if in.Draining {
		t.Fatalf("uncordon: %+v", in)
	}
	mustRun(t, "claim", "--template", "default")
}
