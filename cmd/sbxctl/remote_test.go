package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sbxlog/sbxlog/cmd/sandboxd/node/nodetest"
	"github.com/sbxlog/sbxlog/fsm"
	"github.com/sbxlog/sbxlog/projections/auth"
)

const rootToken = "root-token"

var defaultKey = fsm.PoolKey{Template: "default", Net: "none", Size: "small"}

// startNode runs an in-process node (hypervisor faked) with a "default"
// pool of warm VMs and points the commands at it through the environment.
func startNode(t *testing.T, warm int) *nodetest.Node { return startNodeWith(t, warm, nil) }

// startNodeWith is startNode with its options changed by mod.
func startNodeWith(t *testing.T, warm int, mod func(*nodetest.Options)) *nodetest.Node {
	t.Helper()
	opts := nodetest.Options{
		Dir:       t.TempDir(),
		RootToken: rootToken,
		Tenants:   []auth.TenantConfig{{Name: "acme", TokenSHA256: auth.HashToken("acme-token")}},
		Pools:     []fsm.PoolSpec{{PoolKey: defaultKey, Warm: warm}},
	}
	if mod != nil {
		mod(&opts)
	}
	n, err := nodetest.Start(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Close() })
	settle(t, n)
	t.Setenv(envAddr, n.URL)
	t.Setenv(envToken, rootToken)
	t.Setenv(envTokenFile, "")
	return n
}

// settle waits until the node has nothing left to do and all is durable.
func settle(t *testing.T, n *nodetest.Node) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := n.Settle(ctx); err != nil {
		t.Fatal(err)
	}
}

// run runs sbxctl in-process.
func sbx(args ...string) (code int, stdout, stderr string) {
	var out, errb bytes.Buffer
	code = dispatch(args, &out, &errb)
	return code, out.String(), errb.String()
}

// mustRun runs sbxctl and fails the test unless it exits 0.
func mustRun(t *testing.T, args ...string) string {
	t.Helper()
	code, out, errs := sbx(args...)
	if code != 0 {
		t.Fatalf("sbxctl %s: exit %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), code, out, errs)
	}
	return out
}

func mustJSON(t *testing.T, v any, args ...string) {
	t.Helper()
	out := mustRun(t, append(args, "--json")...)
	if err := json.Unmarshal([]byte(out), v); err != nil {
		t.Fatalf("sbxctl %s --json: %v\n%s", strings.Join(args, " "), err, out)
	}
}

func claimRec(n *nodetest.Node, id string) fsm.ClaimRec {
	var c fsm.ClaimRec
	n.Engine.View(func(st *fsm.State) { c, _ = st.Claim(id) })
	return c
}

func TestUsageErrors(t *testing.T) {
	startNode(t, 0)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"claim"}, "--template is required"},
		{[]string{"claim", "--template", "x", "extra"}, "want 0 argument(s)"},
		{[]string{"claim", "--template", "x", "--meta", "novalue"}, "want key=value"},
		{[]string{"claim", "--template", "x", "--ttl", "1.5s"}, "whole seconds"},
		{[]string{"release"}, "want at least one ID, or --all"},
		{[]string{"renew", "sb_0000000000000000"}, "--ttl is required"},
		{[]string{"pools", "set"}, "give --file or --template"},
		{[]string{"pools", "set", "--template", "x"}, "--warm is required"},
		{[]string{"pools", "set", "--template", "x", "--warm", "1", "--file", "f"}, "exclude each other"},
		{[]string{"events", "--view", "nope"}, "--view \"nope\""},
		{[]string{"info", "--addr", "ftp://x"}, "want http://host:port"},
	} {
		code, _, errs := sbx(tc.args...)
		if code != 2 || !strings.Contains(errs, tc.want) {
			t.Errorf("sbxctl %s: exit %d, stderr %q; want 2 and %q", strings.Join(tc.args, " "), code, errs, tc.want)
		}
	}
	if code, _, _ := sbx("info", "-h"); code != 0 {
		t.Errorf("-h: exit %d", code)
	}
}

func TestAPIErrorsExitOne(t *testing.T) {
	startNode(t, 0)
	code, _, errs := sbx("get", "sb_0000000000000000")
	if code != 1 || !strings.Contains(errs, "404") || !strings.Contains(errs, "unknown sandbox") {
		t.Fatalf("unknown id: exit %d, %q", code, errs)
	}
	t.Setenv(envToken, "")
	code, _, errs = sbx("info")
	if code != 1 || !strings.Contains(errs, "401") || !strings.Contains(errs, "hint: no token") {
		t.Fatalf("no token: exit %d, %q", code, errs)
	}
	code, _, errs = sbx("info", "--token", "wrong")
	if code != 1 || !strings.Contains(errs, "401") || strings.Contains(errs, "hint") {
		t.Fatalf("wrong token: exit %d, %q", code, errs)
	}
	// A tenant may not change pools.
	f := filepath.Join(t.TempDir(), "pools.json")
	if err := os.WriteFile(f, []byte(`{"pools":[]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	code, _, errs = sbx("pools", "set", "--token", "acme-token", "--file", f)
	if code != 1 || !strings.Contains(errs, "403") {
		t.Fatalf("tenant pools set: exit %d, %q", code, errs)
	}
}

// TestTokenSources: --token, then $SBX_API_TOKEN, then the token file
// (--token-file, $SBX_API_TOKEN_FILE, or ./data/api.token).
func TestTokenSources(t *testing.T) {
	startNode(t, 0)
	dir := t.TempDir()
	good := filepath.Join(dir, "root.token")
	if err := os.WriteFile(good, []byte(rootToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(dir, "bad.token")
	if err := os.WriteFile(bad, []byte("wrong\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "data"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, defaultTokenFile), []byte(rootToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Chdir(dir)
	for _, tc := range []struct {
		name            string
		env, envFile    string
		args            []string
		code            int
		stderrSubstring string
	}{
		{"flag wins over env", "wrong", "", []string{"--token", rootToken}, 0, ""},
		{"env wins over file", "wrong", good, nil, 1, "401"},
		{"env file", "", good, nil, 0, ""},
		{"flag file wins over env file", "", bad, []string{"--token-file", good}, 0, ""},
		{"default ./data/api.token", "", "", nil, 0, ""},
		{"named file missing", "", "", []string{"--token-file", filepath.Join(dir, "nope")}, 2, "token file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(envToken, tc.env)
			t.Setenv(envTokenFile, tc.envFile)
			code, _, errs := sbx(append([]string{"info"}, tc.args...)...)
			if code != tc.code || !strings.Contains(errs, tc.stderrSubstring) {
				t.Fatalf("exit %d, stderr %q; want %d with %q", code, errs, tc.code, tc.stderrSubstring)
			}
		})
	}
}

func TestParseInterleaved(t *testing.T) {
	for _, tc := range []struct {
		args []string
		pos  string
		j    bool
	}{
		{[]string{"ID", "--json"}, "ID", true},
		{[]string{"--json", "ID"}, "ID", true},
		{[]string{"A", "B"}, "A B", false},
		{[]string{"--", "--json"}, "--json", false},
	} {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		j := fs.Bool("json", false, "")
		pos, err := parseInterleaved(fs, tc.args)
		if err != nil || strings.Join(pos, " ") != tc.pos || *j != tc.j {
			t.Errorf("%q: pos %q json %v err %v; want %q %v", tc.args, pos, *j, err, tc.pos, tc.j)
		}
	}
}
