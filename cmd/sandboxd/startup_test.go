package main

import (
	"context"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sbxlog/sbxlog/cmd/sandboxd/node/nodetest"
)

// writeConfig writes cfg as a config file and returns its path.
func writeConfig(t *testing.T, cfg map[string]any) string {
	t.Helper()
	b, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "sandboxd.json")
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// A first start that fails on its pools ("size":"huge") writes nothing:
// the data dir holds no log, so the fixed config's pools apply on the next
// start (issue 25 item 7: the identity was recorded, the fixed pools then
// ignored). A pool without net or size takes the claims' defaults.
func TestPoisonedFirstStart(t *testing.T) {
	data := filepath.Join(t.TempDir(), "data")
	bad := writeConfig(t, map[string]any{"data_dir": data, "pools": []any{map[string]any{"template": "default", "size": "huge", "warm": 1}}})
	if code := run([]string{"-config", bad, "-no-nats"}); code != 2 {
		t.Fatalf("bad pool: exit %d, want 2 (refused before start)", code)
	}
	if _, err := os.Stat(filepath.Join(data, "log")); !os.IsNotExist(err) {
		t.Fatalf("the failed start left a log behind: %v", err)
	}
	cfg, err := loadConfig(writeConfig(t, map[string]any{"data_dir": data, "pools": []any{map[string]any{"template": "default", "warm": 1}}}))
	if err != nil {
		t.Fatal(err)
	}
	if err := cfg.finish(); err != nil {
		t.Fatal(err)
	}
	if p := cfg.Pools[0]; p.Net != "none" || p.Size != "small" {
		t.Fatalf("pool without net and size: %+v", p)
	}
}

// listen is checked before anything starts: a port out of range is a
// config error, a taken one the first thing Start reports, before NATS and
// the log (issue 25 item 7 and "Also").
func TestListenCheckedFirst(t *testing.T) {
	for _, l := range []string{"127.0.0.1:99999", "127.0.0.1:http", "127.0.0.1"} {
		cfg := defaultConfig()
		cfg.Listen = l
		if err := cfg.finish(); err == nil || !strings.Contains(err.Error(), "listen") {
			t.Errorf("listen %q: %v", l, err)
		}
	}
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	data := filepath.Join(t.TempDir(), "data")
	if code := run([]string{"-listen", taken.Addr().String(), "-data", data, "-hypervisor", "chsim"}); code != 1 {
		t.Fatalf("taken port: exit %d, want 1", code)
	}
	for _, d := range []string{"log", "nats"} {
		if _, err := os.Stat(filepath.Join(data, d)); !os.IsNotExist(err) {
			t.Fatalf("a taken port still set up %s: %v", d, err)
		}
	}
}

// A second node on one data dir is refused at once, naming the first's
// pid; once the first stops, the dir is free again.
func TestSecondNodeOnOneDataDir(t *testing.T) {
	dir := t.TempDir()
	first, err := nodetest.Start(nodetest.Options{Dir: dir, RootToken: "root"})
	if err != nil {
		t.Fatal(err)
	}
	_, err = nodetest.Start(nodetest.Options{Dir: dir, RootToken: "root"})
	if err == nil || !strings.Contains(err.Error(), "another sandboxd holds") || !strings.Contains(err.Error(), "(pid ") {
		t.Fatalf("second node: %v", err)
	}
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	again, err := nodetest.Start(nodetest.Options{Dir: dir, RootToken: "root"})
	if err != nil {
		t.Fatalf("after the first stopped: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = again.Settle(ctx)
	_ = again.Close()
}

// A config file that names no token still gets the generated root token
// (it used to turn root off: every call 401); a named one is kept.
func TestConfigFileKeepsTokenGeneration(t *testing.T) {
	for _, tc := range []struct {
		file      map[string]any
		tok, path string
	}{
		{map[string]any{"data_dir": "/srv/sbx"}, "", "/srv/sbx/api.token"},
		{map[string]any{"data_dir": "/srv/sbx", "api_token": "t0k"}, "t0k", ""},
		{map[string]any{"data_dir": "/srv/sbx", "api_token_file": "/etc/sbx.token"}, "", "/etc/sbx.token"},
	} {
		cfg, err := loadConfig(writeConfig(t, tc.file))
		if err != nil {
			t.Fatal(err)
		}
		cfg.defaultToken()
		if cfg.APIToken != tc.tok || cfg.APITokenFile != tc.path {
			t.Errorf("%v: token %q, file %q; want %q, %q", tc.file, cfg.APIToken, cfg.APITokenFile, tc.tok, tc.path)
		}
	}
}

// -config defaults to $SBX_CONFIG.
func TestDefaultConfigPath(t *testing.T) {
	t.Setenv("SBX_CONFIG", "/x/sandboxd.json")
	if p := defaultConfigPath(); p != "/x/sandboxd.json" {
		t.Fatalf("defaultConfigPath = %q", p)
	}
	t.Setenv("SBX_CONFIG", "")
	if _, err := os.Stat(systemConfig); err != nil && defaultConfigPath() != "" {
		t.Fatalf("no $SBX_CONFIG and no %s: %q", systemConfig, defaultConfigPath())
	}
}

// A data dir this process cannot use fails the start at once with a
// message naming the dir and what is wrong with it (issue 25 "Also": it
// was reported as the token file's error, the first file written there),
// and nothing starts. Tests run as root, which permission bits do not
// stop: a path through a regular file needs no privilege; a read-only
// tmpfs mount is tried where this process may mount.
func TestUnusableDataDir(t *testing.T) {
	tmp := t.TempDir()
	file := filepath.Join(tmp, "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []struct{ name, dir, want string }{
		{"a file in its path", filepath.Join(file, "data"), "a part of its path is not a directory"},
	}
	ro := filepath.Join(tmp, "ro")
	if err := os.Mkdir(ro, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", ro, "tmpfs", unix.MS_RDONLY, ""); err != nil {
		t.Logf("read-only case skipped: cannot mount a tmpfs here: %v", err)
	} else {
		t.Cleanup(func() { _ = unix.Unmount(ro, unix.MNT_DETACH) })
		cases = append(cases,
			struct{ name, dir, want string }{"a read-only mount", ro, "is not writable by this process"},
			struct{ name, dir, want string }{"under a read-only mount", filepath.Join(ro, "data"), "is not writable by this process"})
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := defaultConfig()
			cfg.DataDir, cfg.Listen, cfg.Hypervisor = tc.dir, "127.0.0.1:0", "chsim"
			cfg.NATS.Disabled = true
			if err := cfg.finish(); err != nil {
				t.Fatal(err)
			}
			cfg.defaultToken()
			n, _, err := start(context.Background(), cfg)
			if err == nil {
				_ = n.Stop()
				t.Fatalf("started on %s", tc.dir)
			}
			if msg := err.Error(); !strings.HasPrefix(msg, "data dir "+tc.dir+" ") || !strings.Contains(msg, tc.want) {
				t.Fatalf("error %q, want it to start with %q and say %q", msg, "data dir "+tc.dir, tc.want)
			}
		})
	}
}
