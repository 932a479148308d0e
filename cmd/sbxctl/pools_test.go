package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sbxlog/sbxlog/fsm"
	"github.com/sbxlog/sbxlog/fsm/egress"
	"github.com/sbxlog/sbxlog/projections/api"
)

// pools returns the node's configured (not draining) pools as specs.
func statePools(n interface {
	View(func(*fsm.State))
}) map[string]fsm.PoolSpec {
	out := map[string]fsm.PoolSpec{}
	n.View(func(st *fsm.State) {
		for _, p := range st.Pools() {
			if !p.Draining {
				out[p.Spec.PoolKey.String()] = p.Spec
			}
		}
	})
	return out
}

func TestPoolsAndInfoCommands(t *testing.T) {
	n := startNode(t, 1)

	var got api.PoolsRequest
	mustJSON(t, &got, "pools", "get")
	if len(got.Pools) != 1 || got.Pools[0].Template != "default" || got.Pools[0].Warm != 1 {
		t.Fatalf("pools get: %+v", got)
	}
	if out := mustRun(t, "pools", "get"); !strings.Contains(out, "default   none  small  1") {
		t.Fatalf("pools get table:\n%s", out)
	}

	// Flags add a pool and keep the others.
	var in api.Info
	mustJSON(t, &in, "pools", "set", "--template", "py", "--size", "medium", "--warm", "2", "--idle-hibernate", "10m")
	sp := statePools(n.Engine)
	if len(sp) != 2 || sp["py/none/medium"].Warm != 2 || sp["py/none/medium"].IdleHibernateSeconds != 600 || sp["default/none/small"].Warm != 1 {
		t.Fatalf("after pools set --template py: %+v", sp)
	}
	if len(in.Pools) != 2 {
		t.Fatalf("pools set answer: %+v", in)
	}
	// Changing warm keeps the idle setting unless given, and the pool's
	// egress policy.
	f0 := filepath.Join(t.TempDir(), "pools.json")
	if err := os.WriteFile(f0, []byte(`{"pools":[{"template":"default","warm":1},{"template":"py","size":"medium","warm":2,"idle_hibernate_seconds":600,"egress":{"allow":[{"host":"*.github.com"}]}}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	mustRun(t, "pools", "set", "--file", f0)
	mustRun(t, "pools", "set", "--template", "py", "--size", "medium", "--warm", "3")
	if p := statePools(n.Engine)["py/none/medium"]; p.Warm != 3 || p.IdleHibernateSeconds != 600 {
		t.Fatalf("after warm change: %+v", p)
	}
	var pol *egress.Policy
	n.Engine.View(func(st *fsm.State) { pol = st.PoolEgress(fsm.PoolKey{Template: "py", Net: "none", Size: "medium"}) })
	if pol == nil || pol.Allow[0].Host != "*.github.com" {
		t.Fatalf("the flags dropped the pool's egress policy: %+v", pol)
	}
	settle(t, n)
	info := mustRun(t, "info")
	if !strings.Contains(info, "py/none/medium") || !strings.Contains(info, "ready") || !strings.Contains(info, "hypervisor in-process-fake") {
		t.Fatalf("info table:\n%s", info)
	}
	mustRun(t, "pools", "set", "--template", "default", "--drain")
	if sp := statePools(n.Engine); len(sp) != 1 || sp["py/none/medium"].Warm != 3 {
		t.Fatalf("after --drain default: %+v", sp)
	}
	if code, _, errs := sbx("pools", "set", "--template", "default", "--drain"); code != 1 || !strings.Contains(errs, "no pool default/none/small") {
		t.Fatalf("second drain: exit %d %q", code, errs)
	}

	// A file replaces the set; pools get --json is valid input.
	dir := t.TempDir()
	f := filepath.Join(dir, "pools.json")
	if err := os.WriteFile(f, []byte(`{"pools":[{"template":"go","warm":1},{"template":"node","net":"none","size":"large","warm":0}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	mustRun(t, "pools", "set", "--file", f)
	sp = statePools(n.Engine)
	if len(sp) != 2 || sp["go/none/small"].Warm != 1 || sp["node/none/large"].Warm != 0 {
		t.Fatalf("after --file: %+v", sp)
	}
	saved := mustRun(t, "pools", "get", "--json")
	mustRun(t, "pools", "set", "--file", f) // unchanged: a no-op
	stdin = strings.NewReader(saved)
	t.Cleanup(func() { stdin = os.Stdin })
	mustRun(t, "pools", "set", "--file", "-")
	if sp2 := statePools(n.Engine); len(sp2) != 2 || sp2["go/none/small"] != sp["go/none/small"] {
		t.Fatalf("round trip through pools get --json: %+v vs %+v", sp2, sp)
	}

	for _, tc := range []struct{ body, want string }{
		{`{"pools":[{"template":"x","warm":1,"wram_max":2}]}`, "unknown field"},
		{`{}`, "no \"pools\" list"},
		{`{"pools":[{"template":"-x","warm":1}]}`, "400"},
	} {
		if err := os.WriteFile(f, []byte(tc.body), 0o600); err != nil {
			t.Fatal(err)
		}
		if code, _, errs := sbx("pools", "set", "--file", f); code != 1 || !strings.Contains(errs, tc.want) {
			t.Errorf("pools set --file %s: exit %d %q, want 1 and %q", tc.body, code, errs, tc.want)
		}
	}
}
