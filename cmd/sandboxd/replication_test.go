package main

import (
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"github.com/sbxlog/sbxlog/eventlog"
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
	if d := (NATSConfig{}).syncTimeout(); d != defaultSyncTimeout {
		t.Errorf("default sync timeout %v", d)
	}
}

// The embedded server's default port (listen + 1000) taken by someone else
// falls back to a free one; a configured port that is taken is an error.
func TestStartReplicationPortInUse(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	port := taken.Addr().(*net.TCPAddr).Port
	if port <= 1000 {
		t.Skipf("port %d leaves no listen port 1000 below it", port)
	}
	for _, tc := range []struct {
		name string
		nats NATSConfig
		ok   bool
	}{
		{"default port taken", NATSConfig{}, true},
		{"configured port taken", NATSConfig{Port: port}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			l, err := eventlog.Open(filepath.Join(dir, "log"), eventlog.Options{NodeID: "n1"})
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			cfg := Config{Listen: fmt.Sprintf("127.0.0.1:%d", port-1000), OwnerAddr: "127.0.0.1:1", NATS: tc.nats}
			svc, err := startReplication(cfg, dir, l, zerolog.Nop())
			if !tc.ok {
				if err == nil {
					_ = svc.Close()
					t.Fatal("started on a port in use")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer svc.Close()
			if svc.Server == nil || svc.Server.Port() == port || svc.Server.Port() == 0 || svc.URL != svc.Server.ClientURL() {
				t.Fatalf("embedded server %v at %s (port %d was taken)", svc.Server, svc.URL, port)
			}
		})
	}
}
