package node_test

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/sbxlog/sbxlog/cmd/buildinfo"
	"github.com/sbxlog/sbxlog/cmd/sandboxd/node/nodetest"
	"github.com/sbxlog/sbxlog/fsm"
	"github.com/sbxlog/sbxlog/projections/api"
	"github.com/sbxlog/sbxlog/projections/apiclient"
)

// syncBuffer is a bytes.Buffer the node's goroutines may write to.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) lines() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strings.Split(strings.TrimSpace(s.b.String()), "\n")
}

// keysOnce checks that no key appears twice in the JSON object line.
func keysOnce(line string) (dup string, err error) {
	dec := json.NewDecoder(strings.NewReader(line))
	if _, err := dec.Token(); err != nil {
		return "", err
	}
	seen := map[string]bool{}
	for dec.More() {
		k, err := dec.Token()
		if err != nil {
			return "", err
		}
		key := k.(string)
		if seen[key] {
			return key, nil
		}
		seen[key] = true
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return "", err
		}
	}
	return "", nil
}

// Every lifecycle step gets an info line (golden built, pool warm, claim,
// hibernate, wake, expiry, release), and no line names a key twice (issue
// 25 item 5: none of them was logged, and "component" came twice).
func TestLifecycleLines(t *testing.T) {
	var buf syncBuffer
	n, err := nodetest.Start(nodetest.Options{
		Dir: t.TempDir(), RootToken: "root", Log: zerolog.New(&buf).Level(zerolog.InfoLevel).With().Timestamp().Logger(),
		Pools: []fsm.PoolSpec{{PoolKey: fsm.PoolKey{Template: "default", Net: "none", Size: "small"}, Warm: 2}},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := n.Settle(ctx); err != nil {
		t.Fatal(err)
	}
	c, err := apiclient.New(n.URL, "root", nil)
	if err != nil {
		t.Fatal(err)
	}
	a, err := c.Claim(ctx, api.ClaimRequest{Template: "default"})
	if err != nil {
		t.Fatal(err)
	}
	for _, step := range []func(context.Context, string) error{c.Hibernate, c.Wake, c.Release} {
		if err := step(ctx, a.ID); err != nil {
			t.Fatal(err)
		}
	}
	b, err := c.Claim(ctx, api.ClaimRequest{Template: "default", TTLSeconds: 1})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"golden snapshot built":                      "default/none/small",
		"pool warm: its target of warm VMs is ready": "default/none/small",
		"sandbox claimed":                            a.ID,
		"sandbox hibernated":                         a.ID,
		"sandbox woken":                              a.ID,
		"sandbox released":                           a.ID,
		"sandbox expired (its deadline passed)":      b.ID,
	}
	for {
		missing := []string{}
		for msg, id := range want {
			found := false
			for _, l := range buf.lines() {
				found = found || strings.Contains(l, `"message":"`+msg+`"`) && strings.Contains(l, id) && strings.Contains(l, `"level":"info"`)
			}
			if !found {
				missing = append(missing, msg)
			}
		}
		if len(missing) == 0 {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("no info line for %v in:\n%s", missing, strings.Join(buf.lines(), "\n"))
		case <-time.After(20 * time.Millisecond):
		}
	}
	for _, l := range buf.lines() {
		if dup, err := keysOnce(l); err != nil || dup != "" {
			t.Errorf("line %s: key %q twice (%v)", l, dup, err)
		}
	}
}

// /metrics says which build serves (issue 25 item 6).
func TestBuildInfoMetric(t *testing.T) {
	n, err := nodetest.Start(nodetest.Options{Dir: t.TempDir(), RootToken: "root"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Close() })
	c, err := apiclient.New(n.URL, "root", nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	text, err := c.Metrics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	bi := buildinfo.Read()
	want := `sbx_build_info{go="` + bi.Go + `",revision="` + bi.Revision + `",version="` + bi.Version + `"} 1`
	if !strings.Contains(text, want) {
		t.Fatalf("no %s in /metrics", want)
	}
}
