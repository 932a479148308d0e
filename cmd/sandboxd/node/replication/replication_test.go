package replication_test

import (
	"bufio"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sbxlog/sbxlog/cmd/sandboxd/node/replication"
	"github.com/sbxlog/sbxlog/eventlog/event"
	"github.com/sbxlog/sbxlog/eventlog/replication/natsauth"
	"github.com/sbxlog/sbxlog/eventlog/replication/natsembed/natstest"
	"github.com/sbxlog/sbxlog/eventlog/replication/replicator"
	"github.com/sbxlog/sbxlog/eventlog/replication/repltest"
	"github.com/sbxlog/sbxlog/eventlog/replication/stream"
	"github.com/sbxlog/sbxlog/fsm"
	"github.com/sbxlog/sbxlog/fsm/fsmtest"
)

var (
	k1 = event.PoolKey{Template: "tpl", Net: "none", Size: "small"}
	k2 = event.PoolKey{Template: "tpl", Net: "none", Size: "medium"}
)

func start(t *testing.T, o replication.Options) *replication.Service {
	t.Helper()
	o.TTL = 3 * time.Second
	o.Logger = natstest.Logger()
	s, err := replication.Start(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func lines(t *testing.T, path string) []string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		out = append(out, sc.Text())
	}
	return out
}

func waitReplicated(t *testing.T, s *replication.Service, seq uint64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if err := s.WaitReplicated(ctx, seq); err != nil {
		t.Fatalf("wait replicated %d: %v (%+v)", seq, err, s.Status())
	}
}

// Embedded mode: the node's server, replicator and journals run under its
// data dir, and a restart of the whole service resumes without duplicates.
func TestEmbeddedNodeRestarts(t *testing.T) {
	dir := t.TempDir()
	l := repltest.OpenLogAt(t, filepath.Join(dir, "log"), "n1")
	n := fsmtest.NewNode(t, l, fsm.PoolSpec{PoolKey: k1, Warm: 2})
	s := start(t, replication.Options{Log: l, DataDir: dir, OwnerAddr: "127.0.0.1:7777"})
	if s.Server == nil || !strings.HasPrefix(s.URL, "nats://127.0.0.1:") {
		t.Fatalf("embedded server %v at %s", s.Server, s.URL)
	}
	c := n.Claim(k1)
	n.Release(c)
	waitReplicated(t, s, l.LastSeq())
	natstest.Eventually(t, 10*time.Second, "journals and view", func() bool {
		st := s.Status()
		return len(st.Nodes) == 1 && st.Nodes[0].Applied == l.LastSeq() && len(st.Addresses) == 1 &&
			fileHas(filepath.Join(dir, "usage.jsonl"), `"ev":"summary"`) && fileLines(filepath.Join(dir, "audit.jsonl")) == int(l.LastSeq())
	})
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	usageBefore := lines(t, filepath.Join(dir, "usage.jsonl"))

	c = n.Claim(k1)
	n.Release(c)
	s2 := start(t, replication.Options{Log: l, DataDir: dir, OwnerAddr: "127.0.0.1:7777"})
	waitReplicated(t, s2, l.LastSeq())
	natstest.Eventually(t, 10*time.Second, "journals after restart", func() bool {
		return fileLines(filepath.Join(dir, "audit.jsonl")) == int(l.LastSeq()) &&
			fileLines(filepath.Join(dir, "usage.jsonl")) == 2*len(usageBefore)
	})
	_, js := natstest.Connect(t, s2.URL, seedOptions(t, s2)...)
	repltest.RequireSubjectIs(t, js, stream.DefaultName, "n1", repltest.LocalEvents(t, l))
	if st := s2.Status(); len(st.Stopped) != 0 || st.Replicator.State != replicator.StateRunning || !st.Embedded {
		t.Fatalf("status %+v", st)
	}
}

// seedOptions are the client options of the embedded server's generated
// credentials.
func seedOptions(t *testing.T, s *replication.Service) []nats.Option {
	t.Helper()
	opts, err := natsauth.Config{NKeySeedFile: s.SeedFile}.Options()
	if err != nil {
		t.Fatal(err)
	}
	return opts
}

func fileHas(path, s string) bool {
	b, _ := os.ReadFile(path)
	return strings.Contains(string(b), s)
}

func fileLines(path string) int {
	b, _ := os.ReadFile(path)
	return strings.Count(string(b), "\n")
}

// Two nodes on one NATS: a claim for a key only the other node has warm is
// redirected there; a third process reusing a node id is refused while the
// node it impersonates keeps its subject.
func TestSharedNATSRedirectAndSecondWriter(t *testing.T) {
	srv := natstest.Single(t)
	url := srv.ClientURL()
	a := fsmtest.NewNode(t, repltest.OpenLog(t, "node-a"), fsm.PoolSpec{PoolKey: k1, Warm: 0}, fsm.PoolSpec{PoolKey: k2, Warm: 1})
	b := fsmtest.NewNode(t, repltest.OpenLog(t, "node-b"), fsm.PoolSpec{PoolKey: k1, Warm: 2})
	sa := start(t, replication.Options{Log: a.Log, DataDir: t.TempDir(), OwnerAddr: "a.example:7777", URL: url, Replicas: 1})
	sb := start(t, replication.Options{Log: b.Log, DataDir: t.TempDir(), OwnerAddr: "b.example:7777", URL: url, Replicas: 1})
	onB := b.Claim(k1)

	natstest.Eventually(t, 15*time.Second, "a's view of b", func() bool {
		r := sa.Redirect(k1)
		return len(r.Redirect) == 1 && r.Redirect[0] == "b.example:7777" && sa.View.Position("node-b") == b.Log.LastSeq()
	})
	if r := sb.Redirect(k1); len(r.Redirect) != 0 {
		t.Fatalf("b redirects a claim it can serve itself: %v", r)
	}
	natstest.Eventually(t, 15*time.Second, "b's view of a", func() bool {
		r := sb.Redirect(k2)
		return len(r.Redirect) == 1 && r.Redirect[0] == "a.example:7777"
	})
	if node, addr, ok, err := sa.View.OwnerAddr(onB); !ok || err != nil || node != "node-b" || addr != "b.example:7777" {
		t.Fatalf("owner of %s from a: %s %s %v %v", onB, node, addr, ok, err)
	}

	// An impostor of node-b with its own log.
	imp := fsmtest.NewNode(t, repltest.OpenLog(t, "node-b"), fsm.PoolSpec{PoolKey: k1, Warm: 1})
	si := start(t, replication.Options{Log: imp.Log, DataDir: t.TempDir(), OwnerAddr: "imp.example:7777", URL: url, Replicas: 1, NoAudit: true, NoUsage: true})
	natstest.Eventually(t, 15*time.Second, "impostor refused", func() bool {
		return si.Status().Stopped["replicator"] != ""
	})
	if err := si.WaitReplicated(context.Background(), 1); !errors.Is(err, replicator.ErrSecondWriter) {
		t.Fatalf("impostor WaitReplicated: %v", err)
	}
	b.Release(onB)
	waitReplicated(t, sb, b.Log.LastSeq())
	_, js := natstest.Connect(t, url)
	repltest.RequireSubjectIs(t, js, stream.DefaultName, "node-b", repltest.LocalEvents(t, b.Log))
}

func TestStartRejectsBadOptions(t *testing.T) {
	l := repltest.OpenLog(t, "n1")
	for name, o := range map[string]replication.Options{
		"no log":     {DataDir: t.TempDir(), OwnerAddr: "x:1"},
		"no dir":     {Log: l, OwnerAddr: "x:1"},
		"no address": {Log: l, DataDir: t.TempDir()},
	} {
		if s, err := replication.Start(o); err == nil {
			_ = s.Close()
			t.Errorf("%s: accepted", name)
		}
	}
	// The embedded port is taken.
	srv := natstest.Single(t)
	if s, err := replication.Start(replication.Options{Log: l, DataDir: t.TempDir(), OwnerAddr: "x:1", Port: srv.Port()}); err == nil {
		_ = s.Close()
		t.Fatal("started on a taken port")
	}
}
