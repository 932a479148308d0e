// Package natstest starts embedded NATS servers and loopback JetStream
// clusters for tests, in t.TempDir() and stopped by t.Cleanup. Server logs go
// to stderr at warn level when SBX_TEST_NATS_LOG=1, and nowhere otherwise.
package natstest

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/sbxlog/sbxlog/eventlog/replication/natsembed"
)

// Logger is the server logger tests use.
func Logger() zerolog.Logger {
	if os.Getenv("SBX_TEST_NATS_LOG") == "1" {
		return zerolog.New(zerolog.ConsoleWriter{Out: os.Stderr}).Level(zerolog.WarnLevel).With().Timestamp().Logger()
	}
	return zerolog.Nop()
}

// Single starts one standalone JetStream server.
func Single(t testing.TB) *natsembed.Server {
	t.Helper()
	s, err := natsembed.Start(natsembed.Options{StoreDir: filepath.Join(t.TempDir(), "nats"), Logger: Logger()})
	if err != nil {
		t.Fatalf("start nats: %v", err)
	}
	t.Cleanup(s.Shutdown)
	return s
}

// Cluster starts n clustered JetStream servers on loopback and waits for a
// JetStream meta leader.
func Cluster(t testing.TB, n int) *natsembed.Cluster {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := natsembed.StartCluster(ctx, t.TempDir(), n, natsembed.ClusterConfig{Logger: Logger()})
	if err != nil {
		t.Fatalf("start nats cluster: %v", err)
	}
	t.Cleanup(c.Shutdown)
	return c
}

// Connect opens a client connection that reconnects forever and is closed at
// cleanup; opts are added (credentials).
func Connect(t testing.TB, urls string, opts ...nats.Option) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(urls, append([]nats.Option{nats.MaxReconnects(-1), nats.ReconnectWait(50 * time.Millisecond), nats.RetryOnFailedConnect(true)}, opts...)...)
	if err != nil {
		t.Fatalf("connect %s: %v", urls, err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("jetstream: %v", err)
	}
	return nc, js
}

// StreamLeader returns the index in c.Servers of the server leading stream
// name's replicas: the one to kill for the worst case.
func StreamLeader(t testing.TB, c *natsembed.Cluster, js jetstream.JetStream, name string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := js.Stream(ctx, name)
	if err != nil {
		t.Fatalf("stream %s: %v", name, err)
	}
	info, err := st.Info(ctx)
	if err != nil || info.Cluster == nil {
		t.Fatalf("stream %s info: %+v, %v", name, info, err)
	}
	for i, s := range c.Servers {
		if s.Name() == info.Cluster.Leader {
			return i
		}
	}
	t.Fatalf("stream %s: leader %q is none of the servers", name, info.Cluster.Leader)
	return -1
}

// Eventually polls cond every 10 ms until it returns true or d passes.
func Eventually(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
