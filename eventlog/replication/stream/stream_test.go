package stream_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sbxlog/sbxlog/eventlog/replication/natsembed/natstest"
	"github.com/sbxlog/sbxlog/eventlog/replication/stream"
)

func TestCheckToken(t *testing.T) {
	for _, tc := range []struct {
		node string
		ok   bool
	}{
		{"node-1", true},
		{"Host_2", true},
		{"", false},
		{"a.b", false},
		{"a*", false},
		{">", false},
		{"a b", false},
		{strings.Repeat("x", 129), false},
	} {
		err := stream.CheckToken(tc.node)
		if (err == nil) != tc.ok || (err != nil && !errors.Is(err, stream.ErrBadNodeID)) {
			t.Errorf("CheckToken(%q) = %v, want ok=%v", tc.node, err, tc.ok)
		}
	}
	if got := stream.Subject("n1"); got != "sbx.ev.n1" {
		t.Fatalf("Subject = %s", got)
	}
	if n, ok := stream.NodeOf("sbx.ev.n1"); !ok || n != "n1" {
		t.Fatalf("NodeOf = %q %v", n, ok)
	}
	if _, ok := stream.NodeOf("sbx.other.n1"); ok {
		t.Fatal("NodeOf accepted a foreign subject")
	}
	if got := stream.MsgID("n1", 42); got != "n1-42" {
		t.Fatalf("MsgID = %s", got)
	}
}

// Any id an operator would set is a node id; its subject token is the id
// itself when it is a plain token (every id accepted before), and otherwise
// escapes each other byte as =XX, reversibly.
func TestNodeIDTokens(t *testing.T) {
	for _, tc := range []struct {
		node, token string
	}{
		{"node-1", "node-1"},
		{"Host_2", "Host_2"},
		{"host.example.com", "host=2Eexample=2Ecom"},
		{"a=b", "a=3Db"},
		{"rack 4/slot*2>", "rack=204=2Fslot=2A2=3E"},
		{"nœud", "n=C5=93ud"},
		{strings.Repeat("x", 128), strings.Repeat("x", 128)},
	} {
		if err := stream.CheckNodeID(tc.node); err != nil {
			t.Errorf("CheckNodeID(%q): %v", tc.node, err)
		}
		if got := stream.Token(tc.node); got != tc.token {
			t.Errorf("Token(%q) = %q, want %q", tc.node, got, tc.token)
		}
		if got, ok := stream.NodeOfToken(tc.token); !ok || got != tc.node {
			t.Errorf("NodeOfToken(%q) = %q, %v, want %q", tc.token, got, ok, tc.node)
		}
		subj := stream.Subject(tc.node)
		if subj != "sbx.ev."+tc.token {
			t.Errorf("Subject(%q) = %q", tc.node, subj)
		}
		if got, ok := stream.NodeOf(subj); !ok || got != tc.node {
			t.Errorf("NodeOf(%q) = %q, %v", subj, got, ok)
		}
		if seq, ok := stream.SeqOfMsgID(tc.node, stream.MsgID(tc.node, 42)); !ok || seq != 42 {
			t.Errorf("SeqOfMsgID(MsgID(%q, 42)) = %d, %v", tc.node, seq, ok)
		}
	}
	for _, bad := range []string{"", "a\nb", "tab\there", "\xff", strings.Repeat("x", 129), strings.Repeat(".", 81)} {
		if err := stream.CheckNodeID(bad); !errors.Is(err, stream.ErrBadNodeID) {
			t.Errorf("CheckNodeID(%q) = %v, want ErrBadNodeID", bad, err)
		}
	}
	// Strings Token never returns are no token: each node has one.
	for _, tok := range []string{"a=2e", "a=2", "a=", "=41", "a.b", "a=0A", "a=ZZ"} {
		if n, ok := stream.NodeOfToken(tok); ok {
			t.Errorf("NodeOfToken(%q) = %q, want refused", tok, n)
		}
	}
}

// The subject prefix and the stream name are the config's.
func TestConfigPrefix(t *testing.T) {
	c := stream.Config{Name: "OPS", SubjectPrefix: "ops.sbx"}
	sc, err := c.StreamConfig()
	if err != nil {
		t.Fatal(err)
	}
	if sc.Name != "OPS" || len(sc.Subjects) != 1 || sc.Subjects[0] != "ops.sbx.*" {
		t.Fatalf("stream config %+v", sc)
	}
	if got := c.Subject("a.b"); got != "ops.sbx.a=2Eb" {
		t.Fatalf("Subject = %s", got)
	}
	if n, ok := c.NodeOf("ops.sbx.a=2Eb"); !ok || n != "a.b" {
		t.Fatalf("NodeOf = %q %v", n, ok)
	}
	if _, ok := c.NodeOf("sbx.ev.a"); ok {
		t.Fatal("NodeOf accepted the default prefix")
	}
	for _, p := range []string{"sbx.ev.", ".sbx", "a..b", "a.*", "a.>", "a b", "a.b>"} {
		if err := (stream.Config{SubjectPrefix: p}).Validate(); err == nil {
			t.Errorf("prefix %q accepted", p)
		}
	}
}

func TestConfigDefaultsAndBadInput(t *testing.T) {
	sc, err := stream.Config{}.StreamConfig()
	if err != nil {
		t.Fatal(err)
	}
	if sc.Name != stream.DefaultName || sc.Replicas != 1 || sc.Duplicates != stream.DefaultDuplicates ||
		sc.Storage != jetstream.FileStorage || sc.Retention != jetstream.LimitsPolicy || len(sc.Subjects) != 1 || sc.Subjects[0] != "sbx.ev.*" {
		t.Fatalf("defaults: %+v", sc)
	}
	for _, c := range []stream.Config{{Name: "a.b"}, {Replicas: 7}, {Replicas: -1}, {Duplicates: time.Millisecond}} {
		if _, err := c.StreamConfig(); err == nil {
			t.Errorf("%+v accepted", c)
		}
	}
}

func TestEnsureCreatesThenAccepts(t *testing.T) {
	ctx := context.Background()
	s := natstest.Single(t)
	_, js := natstest.Connect(t, s.ClientURL())
	// Several nodes starting at once all end with the same stream.
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = stream.Ensure(ctx, js, stream.Config{})
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("Ensure %d: %v", i, err)
		}
	}
	st, err := stream.Ensure(ctx, js, stream.Config{})
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.Config.Storage != jetstream.FileStorage || info.Config.Replicas != 1 || !info.Config.DenyDelete {
		t.Fatalf("created %+v", info.Config)
	}
	// A longer duplicate window than asked for is fine.
	if _, err := stream.Ensure(ctx, js, stream.Config{Duplicates: time.Minute}); err != nil {
		t.Fatalf("shorter requested window: %v", err)
	}
}

// An existing stream whose settings would break replication is refused with
// an error naming the setting; a wider subject filter is accepted.
func TestEnsureRefusesIncompatible(t *testing.T) {
	ctx := context.Background()
	base := func(name string) jetstream.StreamConfig {
		c, err := stream.Config{Name: name}.StreamConfig()
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	for _, tc := range []struct {
		name    string
		mutate  func(*jetstream.StreamConfig)
		setting string // "" = compatible
	}{
		{"wider subjects", func(c *jetstream.StreamConfig) { c.Subjects = []string{"sbx.>"} }, ""},
		{"other subjects", func(c *jetstream.StreamConfig) { c.Subjects = []string{"sbx.ev.a"} }, "subjects"},
		{"memory", func(c *jetstream.StreamConfig) { c.Storage = jetstream.MemoryStorage }, "storage"},
		{"workqueue", func(c *jetstream.StreamConfig) { c.Retention = jetstream.WorkQueuePolicy }, "retention"},
		{"short window", func(c *jetstream.StreamConfig) { c.Duplicates = 5 * time.Second }, "duplicate_window"},
		{"per-subject cap", func(c *jetstream.StreamConfig) { c.MaxMsgsPerSubject = 10 }, "max_msgs_per_subject"},
		{"no ack", func(c *jetstream.StreamConfig) { c.NoAck = true }, "no_ack"},
		{"no atomic batches", func(c *jetstream.StreamConfig) { c.AllowAtomicPublish = false }, "allow_atomic"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name := strings.ReplaceAll(strings.ToUpper(tc.name), " ", "_")
			c := base(name)
			tc.mutate(&c)
			// A server per case: the cases' subjects overlap, and deleting one
			// stream while creating the next races the server's cleanup of
			// its store directory.
			_, js := natstest.Connect(t, natstest.Single(t).ClientURL())
			if _, err := js.CreateStream(ctx, c); err != nil {
				t.Fatal(err)
			}
			_, err := stream.Ensure(ctx, js, stream.Config{Name: name})
			if tc.setting == "" {
				if err != nil {
					t.Fatalf("compatible stream refused: %v", err)
				}
				return
			}
			var ie *stream.IncompatibleError
			if !errors.As(err, &ie) {
				t.Fatalf("err %v, want *IncompatibleError", err)
			}
			if ie.Setting != tc.setting || ie.Stream != name || !strings.Contains(err.Error(), tc.setting) {
				t.Fatalf("error %q names %q, want %q", err, ie.Setting, tc.setting)
			}
		})
	}
	// Replicas are compared too (checked without a cluster: pure Check).
	have, want := base("R"), base("R")
	want.Replicas = 3
	var ie *stream.IncompatibleError
	if err := stream.Check(have, want); !errors.As(err, &ie) || ie.Setting != "replicas" || ie.Have != "1" || ie.Want != "3" {
		t.Fatalf("replicas: %v", err)
	}
	if !strings.Contains(ie.Error(), "nats.replicas") {
		t.Errorf("replicas advice names no setting of sbxlog: %v", ie)
	}
}

// More replicas than configured (an operator raising 3 to 5, a node
// configured for 1 against an R3 stream) and limits an operator added are
// compatible, each with a warning.
func TestCheckAcceptsCompatibleWithWarnings(t *testing.T) {
	cfg := func(replicas int) jetstream.StreamConfig {
		c, err := stream.Config{Replicas: replicas}.StreamConfig()
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	for _, tc := range []struct {
		name   string
		have   func() jetstream.StreamConfig
		want   int
		warned []string
	}{
		{"same", func() jetstream.StreamConfig { return cfg(3) }, 3, nil},
		{"3 to 5", func() jetstream.StreamConfig { return cfg(5) }, 3, []string{"5 replicas"}},
		{"R3 for 1", func() jetstream.StreamConfig { return cfg(3) }, 1, []string{"3 replicas"}},
		{"max_age", func() jetstream.StreamConfig { c := cfg(1); c.MaxAge = time.Hour; return c }, 1, []string{"max_age 1h0m0s"}},
		{"max_bytes", func() jetstream.StreamConfig { c := cfg(1); c.MaxBytes = 1 << 30; return c }, 1, []string{"max_bytes"}},
		{"max_msgs discard new", func() jetstream.StreamConfig {
			c := cfg(1)
			c.MaxMsgs, c.Discard = 10, jetstream.DiscardNew
			return c
		}, 1, []string{"discard new"}},
		{"no direct gets", func() jetstream.StreamConfig { c := cfg(3); c.AllowDirect = false; return c }, 3, []string{"does not allow direct gets"}},
	} {
		have, want := tc.have(), cfg(tc.want)
		if err := stream.Check(have, want); err != nil {
			t.Errorf("%s: refused: %v", tc.name, err)
			continue
		}
		w := stream.Warnings(have, want)
		if len(w) != len(tc.warned) {
			t.Errorf("%s: warnings %q, want %d", tc.name, w, len(tc.warned))
			continue
		}
		for i := range w {
			if !strings.Contains(w[i], tc.warned[i]) {
				t.Errorf("%s: warning %q, want it to name %q", tc.name, w[i], tc.warned[i])
			}
		}
	}
}

// Ends reads each node's last sequence from its last message id; a node
// without messages is 0 and a foreign message id is an error.
func TestEnds(t *testing.T) {
	srv := natstest.Single(t)
	_, js := natstest.Connect(t, srv.ClientURL())
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := stream.Ends(ctx, js, "", nil); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Fatalf("Ends without a stream: %v", err)
	}
	if _, err := stream.Ensure(ctx, js, stream.Config{}); err != nil {
		t.Fatal(err)
	}
	pub := func(node, id string) {
		t.Helper()
		if _, err := js.Publish(ctx, stream.Subject(node), []byte("x"), jetstream.WithMsgID(id)); err != nil {
			t.Fatal(err)
		}
	}
	for seq := uint64(1); seq <= 3; seq++ {
		pub("n-1", stream.MsgID("n-1", seq))
	}
	pub("n2", stream.MsgID("n2", 1))
	for _, tc := range []struct {
		nodes []string
		want  map[string]stream.End
	}{
		// Stream sequences: n-1's three messages, then n2's.
		{nil, map[string]stream.End{"n-1": {Seq: 3, StreamSeq: 3}, "n2": {Seq: 1, StreamSeq: 4}}},
		{[]string{"n2", "n3"}, map[string]stream.End{"n2": {Seq: 1, StreamSeq: 4}, "n3": {}}},
	} {
		got, err := stream.Ends(ctx, js, stream.DefaultName, tc.nodes)
		if err != nil || len(got) != len(tc.want) {
			t.Fatalf("Ends(%v) = %v, %v; want %v", tc.nodes, got, err, tc.want)
		}
		for n, s := range tc.want {
			if got[n] != s {
				t.Errorf("Ends(%v)[%s] = %+v, want %+v", tc.nodes, n, got[n], s)
			}
		}
	}
	pub("n2", "other-7")
	if _, err := stream.Ends(ctx, js, "", []string{"n2"}); err == nil || !strings.Contains(err.Error(), "other-7") {
		t.Fatalf("Ends with a foreign message id: %v", err)
	}
	if _, err := stream.Ends(ctx, js, "", []string{"a\nb"}); !errors.Is(err, stream.ErrBadNodeID) {
		t.Fatalf("Ends with a bad node id: %v", err)
	}
}
