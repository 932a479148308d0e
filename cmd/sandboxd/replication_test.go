package main

import (
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
