package natsembed_test

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sbxlog/sbxlog/eventlog/replication/natsembed"
	"github.com/sbxlog/sbxlog/eventlog/replication/natsembed/natstest"
)

func TestStartRejectsBadOptions(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts natsembed.Options
		want string
	}{
		{"no store", natsembed.Options{}, "StoreDir"},
		{"port range", natsembed.Options{StoreDir: t.TempDir(), Port: 70000}, "port"},
		{"cluster name", natsembed.Options{StoreDir: t.TempDir(), Cluster: &natsembed.ClusterOptions{}}, "cluster name"},
		{"route url", natsembed.Options{StoreDir: t.TempDir(), Cluster: &natsembed.ClusterOptions{Name: "c", Routes: []string{"::bad"}}}, "route"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := natsembed.Start(tc.opts)
			if err == nil {
				s.Shutdown()
				t.Fatal("Start succeeded")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q does not mention %q", err, tc.want)
			}
		})
	}
}

func TestStartPortTaken(t *testing.T) {
	s := natstest.Single(t)
	_, err := natsembed.Start(natsembed.Options{StoreDir: t.TempDir(), Port: s.Port()})
	if !errors.Is(err, natsembed.ErrNotReady) || !strings.Contains(err.Error(), "listen") {
		t.Fatalf("second server on a taken port: err %v, want ErrNotReady saying why", err)
	}
}

// A restarted server comes back on the same port with its store: a client
// that reconnects finds the stream and its messages.
func TestRestartKeepsPortAndStore(t *testing.T) {
	ctx := context.Background()
	s := natstest.Single(t)
	if !strings.HasPrefix(s.ClientURL(), "nats://127.0.0.1:") || s.Port() == 0 {
		t.Fatalf("ClientURL %s port %d", s.ClientURL(), s.Port())
	}
	if got := s.StoreDir(); filepath.Base(got) != "nats" {
		t.Fatalf("StoreDir %s", got)
	}
	nc, js := natstest.Connect(t, s.ClientURL())
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "T", Subjects: []string{"t.>"}, Storage: jetstream.FileStorage}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, "t.a", []byte("one")); err != nil {
		t.Fatal(err)
	}
	port := s.Port()
	s.Shutdown()
	s.Shutdown() // idempotent
	if s.Running() {
		t.Fatal("Running after Shutdown")
	}
	natstest.Eventually(t, 5*time.Second, "client to notice", func() bool { return !nc.IsConnected() })
	if err := s.Restart(); err != nil {
		t.Fatal(err)
	}
	if s.Port() != port {
		t.Fatalf("port %d after restart, was %d", s.Port(), port)
	}
	natstest.Eventually(t, 10*time.Second, "client reconnect", nc.IsConnected)
	st, err := js.Stream(ctx, "T")
	if err != nil {
		t.Fatal(err)
	}
	m, err := st.GetLastMsgForSubject(ctx, "t.a")
	if err != nil {
		t.Fatalf("after restart: %v", err)
	}
	if string(m.Data) != "one" {
		t.Fatalf("after restart: data %q, want one", m.Data)
	}
}

// The loopback cluster forms, holds an R3 stream, and keeps accepting
// publishes when one member is shut down and after it rejoins.
func TestClusterSurvivesOneServer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c := natstest.Cluster(t, 3)
	if n := strings.Count(c.URLs(), ","); n != 2 {
		t.Fatalf("URLs %q", c.URLs())
	}
	for _, s := range c.Servers {
		if s.RouteURL() == "" || !s.Running() {
			t.Fatalf("server %s: route %q running %v", s.Name(), s.RouteURL(), s.Running())
		}
	}
	_, js := natstest.Connect(t, c.URLs())
	st, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "R", Subjects: []string{"r.>"}, Storage: jetstream.FileStorage, Replicas: 3})
	if err != nil {
		t.Fatal(err)
	}
	publish := func(i int) {
		t.Helper()
		for {
			pctx, pcancel := context.WithTimeout(ctx, 2*time.Second)
			_, err := js.Publish(pctx, "r.x", []byte{byte(i)}, jetstream.WithMsgID(string(rune('a'+i))))
			pcancel()
			if err == nil {
				return
			}
			if ctx.Err() != nil {
				t.Fatalf("publish %d: %v", i, err)
			}
		}
	}
	publish(0)
	c.Servers[0].Shutdown()
	publish(1)
	if err := c.Servers[0].Restart(); err != nil {
		t.Fatal(err)
	}
	publish(2)
	natstest.Eventually(t, 20*time.Second, "3 messages on all replicas", func() bool {
		info, err := st.Info(ctx)
		if err != nil || info.State.Msgs != 3 || info.Cluster == nil {
			return false
		}
		for _, r := range info.Cluster.Replicas {
			if !r.Current {
				return false
			}
		}
		return len(info.Cluster.Replicas) == 2
	})
}

func TestFreePorts(t *testing.T) {
	ps, err := natsembed.FreePorts(4)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]bool{}
	for _, p := range ps {
		if p <= 0 || seen[p] {
			t.Fatalf("ports %v", ps)
		}
		seen[p] = true
	}
}
