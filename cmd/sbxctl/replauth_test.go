package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sbxlog/sbxlog/eventlog"
	"github.com/sbxlog/sbxlog/eventlog/replication/natsauth"
	"github.com/sbxlog/sbxlog/eventlog/replication/natsembed"
	"github.com/sbxlog/sbxlog/eventlog/replication/natsembed/natstest"
)

// follow --once and audit --once into a fresh output whose durable
// consumer already exists (an earlier run into another output) get the
// whole stream, not "events 1..0".
func TestReplOnceFreshOutputUnderExistingDurable(t *testing.T) {
	srv := natstest.Single(t)
	url := srv.ClientURL()
	n := startReplNode(t, url, "n1")
	n.record(t, 60)
	last := n.log.LastSeq()
	for _, dir := range []string{t.TempDir(), t.TempDir()} {
		replica := filepath.Join(dir, "replica")
		code, out, errs := run("follow", "--nats", url, "--node", "n1", "--data", replica, "--once")
		if code != 0 {
			t.Fatalf("follow: exit %d\n%s%s", code, out, errs)
		}
		l, err := eventlog.Open(replica, eventlog.Options{ReadOnly: true})
		if err != nil {
			t.Fatal(err)
		}
		got := l.LastSeq()
		_ = l.Close()
		if got != last || !strings.Contains(out, "events 1..") {
			t.Fatalf("follow into a fresh replica: holds %d of %d events; printed %q", got, last, out)
		}
		auditFile := filepath.Join(dir, "audit.jsonl")
		if code, out, errs := run("audit", "--nats", url, "--out", auditFile, "--once"); code != 0 {
			t.Fatalf("audit: exit %d\n%s%s", code, out, errs)
		}
		if got := len(jsonLines(t, auditFile)); uint64(got) != last {
			t.Fatalf("audit into a fresh file: %d records, the log %d events", got, last)
		}
	}
}

// Against a server that needs credentials (as sandboxd's embedded one
// does), the replication commands find the seed sandboxd generated in
// data/nats.nk under their working directory, or take --nkey; without
// credentials they are refused with a hint.
func TestReplCommandsFindCredentials(t *testing.T) {
	work := t.TempDir()
	seed, pub, err := natsauth.NewUserSeed()
	if err != nil {
		t.Fatal(err)
	}
	srv, err := natsembed.Start(natsembed.Options{StoreDir: filepath.Join(work, "nats"), NKeys: []string{pub}, Logger: natstest.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	elsewhere := filepath.Join(t.TempDir(), "seed.nk")
	if err := os.WriteFile(elsewhere, seed, 0o600); err != nil {
		t.Fatal(err)
	}
	opts, err := natsauth.Config{NKeySeedFile: elsewhere}.Options()
	if err != nil {
		t.Fatal(err)
	}
	n := startReplNode(t, srv.ClientURL(), "n1", opts...)
	n.record(t, 30)
	t.Chdir(work)

	out := filepath.Join(work, "a1.jsonl")
	code, _, errs := run("audit", "--nats", srv.ClientURL(), "--out", out, "--once")
	if code != 1 || !strings.Contains(errs, "Authorization Violation") && !strings.Contains(errs, "authorization violation") || !strings.Contains(errs, "data/nats.nk") {
		t.Fatalf("without credentials: exit %d %q, want refused with a hint", code, errs)
	}
	if code, _, errs := run("audit", "--nats", srv.ClientURL(), "--out", out, "--once", "--nkey", elsewhere); code != 0 || uint64(len(jsonLines(t, out))) != n.log.LastSeq() {
		t.Fatalf("with --nkey: exit %d %s", code, errs)
	}
	if err := os.MkdirAll(filepath.Join(work, "data"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(work, "data", natsauth.SeedFileName), seed, 0o600); err != nil {
		t.Fatal(err)
	}
	out2 := filepath.Join(work, "a2.jsonl")
	if code, _, errs := run("audit", "--nats", srv.ClientURL(), "--out", out2, "--once", "--durable", "other"); code != 0 || uint64(len(jsonLines(t, out2))) != n.log.LastSeq() {
		t.Fatalf("with data/nats.nk: exit %d %s", code, errs)
	}
	if code, _, errs := run("audit", "--nats", srv.ClientURL(), "--out", out2, "--once", "--nkey", filepath.Join(work, "none.nk")); code != 1 || !strings.Contains(errs, "seed") {
		t.Fatalf("a named seed file that is missing: exit %d %q", code, errs)
	}
}
