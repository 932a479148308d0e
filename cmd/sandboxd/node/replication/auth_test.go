package replication_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sbxlog/sbxlog/cmd/sandboxd/node/replication"
	"github.com/sbxlog/sbxlog/eventlog/replication/natsauth"
	"github.com/sbxlog/sbxlog/eventlog/replication/natsembed/natstest"
	"github.com/sbxlog/sbxlog/eventlog/replication/repltest"
	"github.com/sbxlog/sbxlog/eventlog/replication/stream"
	"github.com/sbxlog/sbxlog/fsm"
	"github.com/sbxlog/sbxlog/fsm/fsmtest"
)

// The embedded server's credentials are generated into the data dir on the
// first start (mode 0600) and kept: a client without them is refused, the
// service's own clients replicate with them, and a restart uses the same
// seed.
func TestEmbeddedServerNeedsGeneratedCredentials(t *testing.T) {
	dir := t.TempDir()
	l := repltest.OpenLogAt(t, filepath.Join(dir, "log"), "n1")
	n := fsmtest.NewNode(t, l, fsm.PoolSpec{PoolKey: k1, Warm: 1})
	s := start(t, replication.Options{Log: l, DataDir: dir, OwnerAddr: "127.0.0.1:7777"})
	seedFile := filepath.Join(dir, natsauth.SeedFileName)
	fi, err := os.Stat(seedFile)
	if err != nil || fi.Mode().Perm() != 0o600 || s.SeedFile != seedFile {
		t.Fatalf("seed file %s: %v, %v (service says %q)", seedFile, fi, err, s.SeedFile)
	}
	seed, _ := os.ReadFile(seedFile)

	nc, err := nats.Connect(s.URL, nats.Timeout(2*time.Second), nats.NoReconnect())
	if err == nil {
		nc.Close()
	}
	if !errors.Is(err, nats.ErrAuthorization) {
		t.Fatalf("client without credentials: %v, want refused", err)
	}
	n.Release(n.Claim(k1))
	waitReplicated(t, s, l.LastSeq())
	st := s.Status()
	if st.Credentials != "nkey seed file "+seedFile || strings.Contains(st.Credentials, strings.TrimSpace(string(seed))) {
		t.Fatalf("status credentials %q", st.Credentials)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	n.Release(n.Claim(k1))
	s2 := start(t, replication.Options{Log: l, DataDir: dir, OwnerAddr: "127.0.0.1:7777"})
	waitReplicated(t, s2, l.LastSeq())
	if again, _ := os.ReadFile(seedFile); string(again) != string(seed) {
		t.Fatal("the seed changed across a restart")
	}
	_, js := natstest.Connect(t, s2.URL, seedOptions(t, s2)...)
	repltest.RequireSubjectIs(t, js, stream.DefaultName, "n1", repltest.LocalEvents(t, l))
}

// A node id an operator would set (a dotted host name) replicates under its
// subject token, with its journals and its address, and the stream name and
// subject prefix are the options'.
func TestDottedNodeIDAndOwnLayout(t *testing.T) {
	dir := t.TempDir()
	const node = "host.example.com"
	l := repltest.OpenLogAt(t, filepath.Join(dir, "log"), node)
	n := fsmtest.NewNode(t, l, fsm.PoolSpec{PoolKey: k1, Warm: 1})
	s := start(t, replication.Options{Log: l, DataDir: dir, OwnerAddr: "127.0.0.1:7777", Stream: "OPS_LOGS", SubjectPrefix: "ops.sbx"})
	n.Release(n.Claim(k1))
	waitReplicated(t, s, l.LastSeq())
	natstest.Eventually(t, 10*time.Second, "journals, view and address", func() bool {
		st := s.Status()
		return len(st.Nodes) == 1 && st.Nodes[0].Node == node && st.Nodes[0].Applied == l.LastSeq() &&
			len(st.Addresses) == 1 && st.Addresses[0].Node == node &&
			fileLines(filepath.Join(dir, "audit.jsonl")) == int(l.LastSeq()) && fileHas(filepath.Join(dir, "usage.jsonl"), `"ev":"summary"`)
	})
	st := s.Status()
	if st.Stream != "OPS_LOGS" || st.Subject != "ops.sbx.host=2Eexample=2Ecom" || len(st.Stopped) != 0 {
		t.Fatalf("status %+v", st)
	}
	_, js := natstest.Connect(t, s.URL, seedOptions(t, s)...)
	got := repltest.ReadSubjectIn(t, js, stream.Config{Name: "OPS_LOGS", SubjectPrefix: "ops.sbx"}, node)
	if len(got) != int(l.LastSeq()) || got[0].Event.Node != node {
		t.Fatalf("subject holds %d messages, the log %d", len(got), l.LastSeq())
	}
}
