package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"github.com/sbxlog/sbxlog/cmd/sandboxd/node"
)

func TestDefaultNATSPort(t *testing.T) {
	for _, tc := range []struct {
		listen string
		want   int
	}{
		{"127.0.0.1:7777", 8777},
		{":7777", 8777},
		{"[::1]:1", 1001},
		{"127.0.0.1:0", 0},     // a random API port: a random NATS port
		{"127.0.0.1:64536", 0}, // +1000 is out of range
		{"127.0.0.1:http", 0},
		{"nonsense", 0},
	} {
		if got := defaultNATSPort(tc.listen); got != tc.want {
			t.Errorf("defaultNATSPort(%q) = %d, want %d", tc.listen, got, tc.want)
		}
	}
}

func TestNATSConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		c   NATSConfig
		err string // "" valid
	}{
		{NATSConfig{}, ""},
		{NATSConfig{Port: 4222, Sync: true, SyncTimeoutMS: 100}, ""},
		{NATSConfig{URL: "nats://a:4222,nats://b:4222", Replicas: 3}, ""},
		{NATSConfig{Disabled: true}, ""},
		{NATSConfig{Port: -1}, "nats.port"},
		{NATSConfig{Port: 70000}, "nats.port"},
		{NATSConfig{URL: "nats://a:4222", Port: 4222}, "cannot go with nats.url"},
		{NATSConfig{URL: "nats://a:4222", Replicas: 6}, "nats.replicas 6"},
		{NATSConfig{Replicas: 3}, "needs a cluster"},
		{NATSConfig{SyncTimeoutMS: -5}, "sync_timeout_ms"},
		{NATSConfig{Disabled: true, Sync: true}, "nats.sync needs replication"},
	} {
		err := tc.c.validate()
		if (err == nil) != (tc.err == "") || (err != nil && !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("%+v: %v, want %q", tc.c, err, tc.err)
		}
	}
	if d := (NATSConfig{}).syncTimeout(); d != node.DefaultSyncTimeout {
		t.Errorf("default sync timeout %v", d)
	}
}

// The embedded server's default port (listen + 1000) may fall back to a
// free one; a configured port may not (node's TestStartReplicationPortInUse
// checks both against a port in use).
func TestReplicationConfigPortFallback(t *testing.T) {
	for _, tc := range []struct {
		name  string
		nats  NATSConfig
		port  int
		retry bool
	}{
		{"default port", NATSConfig{}, 8777, true},
		{"configured port", NATSConfig{Port: 4222}, 4222, false},
		{"external cluster", NATSConfig{URL: "nats://a:4222"}, 0, false},
	} {
		r := replicationConfig(Config{Listen: "127.0.0.1:7777", NATS: tc.nats}, zerolog.Nop())
		if r.Options.Port != tc.port || r.RetryFreePort != tc.retry {
			t.Errorf("%s: port %d retry %v, want %d %v", tc.name, r.Options.Port, r.RetryFreePort, tc.port, tc.retry)
		}
	}
}

// The default node id is derived from the host name so that it is its own
// subject token (a dotted host name made sandboxd exit with "node id is
// not a valid subject token"); a configured id is kept as it is, dots and
// all.
func TestNodeIDDefaultAndConfigured(t *testing.T) {
	for _, tc := range []struct{ host, want string }{
		{"host.example.com", "host-example-com"},
		{"web_1", "web_1"},
		{"", "node-1"},
		{strings.Repeat("a.", 80), strings.Repeat("a-", 64)},
	} {
		if got := defaultNodeID(tc.host); got != tc.want {
			t.Errorf("defaultNodeID(%q) = %q, want %q", tc.host, got, tc.want)
		}
	}
	old := hostname
	t.Cleanup(func() { hostname = old })
	hostname = func() (string, error) { return "host.example.com", nil }
	cfg := defaultConfig()
	if err := cfg.finish(); err != nil {
		t.Fatalf("dotted host name: %v", err)
	}
	if cfg.NodeID != "host-example-com" || cfg.nodeIDFrom != "host.example.com" {
		t.Fatalf("node id %q from %q", cfg.NodeID, cfg.nodeIDFrom)
	}
	cfg = defaultConfig()
	cfg.NodeID = "host.example.com"
	if err := cfg.finish(); err != nil || cfg.NodeID != "host.example.com" || cfg.nodeIDFrom != "" {
		t.Fatalf("configured dotted node id: %q, %v", cfg.NodeID, err)
	}
	cfg = defaultConfig()
	cfg.NodeID = "bad\nid"
	if err := cfg.finish(); err == nil || !strings.Contains(err.Error(), "node_id") {
		t.Fatalf("node id with a newline: %v", err)
	}
}

// The nats section carries an external server's credentials, the stream
// and the subject prefix to the replication service; credentials without
// a url are refused (the embedded server makes its own).
func TestNATSConfigCredentialsAndLayout(t *testing.T) {
	n := NATSConfig{URL: "nats://a:4222", Stream: "OPS", SubjectPrefix: "ops.sbx"}
	n.User, n.Password = "sbx", "hunter2"
	if err := n.validate(); err != nil {
		t.Fatal(err)
	}
	r := replicationConfig(Config{Listen: "127.0.0.1:7777", NATS: n}, zerolog.Nop())
	if o := r.Options; o.Auth.User != "sbx" || o.Auth.Password != "hunter2" || o.Stream != "OPS" || o.SubjectPrefix != "ops.sbx" {
		t.Fatalf("replication options %+v", o)
	}
	for _, tc := range []struct {
		edit func(*NATSConfig)
		err  string
	}{
		{func(n *NATSConfig) { n.URL = "" }, "embedded server uses the credentials it generates"},
		{func(n *NATSConfig) { n.Token = "t" }, "more than one"},
		{func(n *NATSConfig) { n.SubjectPrefix = "ops.*" }, "subject prefix"},
		{func(n *NATSConfig) { n.Stream = "a.b" }, "stream name"},
	} {
		c := n
		tc.edit(&c)
		if err := c.validate(); err == nil || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("%+v: %v, want %q", c, err, tc.err)
		}
	}
	// The keys are the nats section's own.
	path := filepath.Join(t.TempDir(), "c.json")
	if err := os.WriteFile(path, []byte(`{"nats": {"url": "tls://a:4222", "nkey_seed_file": "/etc/sbx/nats.nk", "tls_ca": "/etc/sbx/ca.pem", "stream": "OPS", "subject_prefix": "ops.sbx"}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := loadConfig(path)
	if err != nil || cfg.NATS.NKeySeedFile != "/etc/sbx/nats.nk" || cfg.NATS.TLSCA != "/etc/sbx/ca.pem" || cfg.NATS.Stream != "OPS" {
		t.Fatalf("loaded %+v, %v", cfg.NATS, err)
	}
}
