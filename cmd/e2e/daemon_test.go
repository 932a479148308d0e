package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sbxlog/sbxlog/projections/api"
	"github.com/sbxlog/sbxlog/projections/apiclient"
)

// collector reads one event stream in the background.
type collector struct {
	mu    sync.Mutex
	evs   []apiclient.Event
	err   error
	done  chan struct{}
	close func()
}

// collect opens /v1/events with o and keeps reading until the test ends.
// The stream must stay up: any end before the test closes it is an error.
func collect(t *testing.T, c *apiclient.Client, o apiclient.EventsOptions) *collector {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	s, err := c.Events(ctx, o)
	if err != nil {
		cancel()
		t.Fatalf("open /v1/events %+v: %v", o, err)
	}
	col := &collector{done: make(chan struct{})}
	col.close = func() { cancel(); s.Close(); <-col.done }
	go func() {
		defer close(col.done)
		for {
			ev, err := s.Next()
			col.mu.Lock()
			if err != nil {
				col.err = err
				col.mu.Unlock()
				return
			}
			col.evs = append(col.evs, ev)
			col.mu.Unlock()
		}
	}()
	t.Cleanup(col.close)
	return col
}

// waitFor polls the collected events until cond holds.
func (col *collector) waitFor(t *testing.T, what string, cond func([]apiclient.Event) bool) []apiclient.Event {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		col.mu.Lock()
		evs, err := slices.Clone(col.evs), col.err
		col.mu.Unlock()
		if cond(evs) {
			return evs
		}
		if err != nil {
			t.Fatalf("event stream ended (%v) while waiting for %s; %d events", err, what, len(evs))
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiting for %s: %d events so far", what, len(evs))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func decode(t *testing.T, ev apiclient.Event) api.EventJSON {
	t.Helper()
	le, err := ev.LogEvent()
	if err != nil {
		t.Fatalf("event %s %s: %v: %s", ev.ID, ev.Event, err, ev.Data)
	}
	return le
}

// typesOf lists, in order, the types of the events about aggregate id.
func typesOf(t *testing.T, evs []apiclient.Event, id string) []string {
	var out []string
	for _, ev := range evs {
		if decode(t, ev).Aggregate.ID == id {
			out = append(out, ev.Event)
		}
	}
	return out
}

func hasEvent(t *testing.T, evs []apiclient.Event, typ, id string) bool {
	for _, ev := range evs {
		if ev.Event == typ && decode(t, ev).Aggregate.ID == id {
			return true
		}
	}
	return false
}

// vmsSettled reports whether every VM whose destroy was requested is gone.
func vmsSettled(t *testing.T, evs []apiclient.Event) bool {
	pending := map[string]bool{}
	for _, ev := range evs {
		switch ev.Event {
		case "vm_destroy_requested":
			pending[decode(t, ev).Aggregate.ID] = true
		case "vm_destroyed":
			delete(pending, decode(t, ev).Aggregate.ID)
		}
	}
	return len(pending) == 0
}

// poolOf returns the pool key's entry of an info body.
func poolOf(in *api.Info, key string) (api.PoolInfo, bool) {
	for _, p := range in.Pools {
		if p.Key.String() == key {
			return p, true
		}
	}
	return api.PoolInfo{}, false
}

// waitInfo polls /v1/info until cond holds.
func waitInfo(t *testing.T, ctx context.Context, c *apiclient.Client, what string, cond func(*api.Info) bool) *api.Info {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		in, err := c.Info(ctx)
		if err != nil {
			t.Fatalf("info: %v", err)
		}
		if cond(in) {
			return in
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiting for %s: info %+v", what, in)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// checkSandboxes compares GET /v1/sandboxes with the expected id -> state.
func checkSandboxes(t *testing.T, ctx context.Context, c *apiclient.Client, stage string, want map[string]string) {
	t.Helper()
	got, err := c.Sandboxes(ctx, apiclient.ListOptions{})
	if err != nil {
		t.Fatalf("%s: list: %v", stage, err)
	}
	gotMap := map[string]string{}
	for _, sb := range got {
		gotMap[sb.ID] = sb.State
	}
	if fmt.Sprint(gotMap) != fmt.Sprint(want) {
		t.Fatalf("%s: /v1/sandboxes %v, want %v", stage, gotMap, want)
	}
}

// waitState polls GET /v1/sandboxes/{id} until it is in state want.
func waitState(t *testing.T, ctx context.Context, c *apiclient.Client, id, want string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		sb, err := c.Sandbox(ctx, id)
		if err != nil {
			t.Fatalf("get %s: %v", id, err)
		}
		if sb.State == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s is %s, want %s", id, sb.State, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestDaemonEndToEnd is acceptance 1 of the sandboxd issue: the built
// sandboxd with chsim, driven over HTTP through pools, golden, warm fill, a
// warm claim, a clone-tier claim, hibernate, wake and release, checking
// /v1/info and /v1/sandboxes at each stage, the exact event sequence of
// every aggregate involved, a second stream resumed from the middle, and
// that the stream equals the op log on disk.
func TestDaemonEndToEnd(t *testing.T) {
	const root = "e2e-root-token"
	const key = "e2e/none/small"
	n := startChsimNode(t, root)
	dir, data, addr, d, c := n.dir, n.data, n.addr, n.daemon, n.c
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	all := collect(t, c, apiclient.EventsOptions{From: 1})

	// Start: no pools, nothing claimed.
	in, err := c.Info(ctx)
	if err != nil || in.Node != "e2e" || in.Hypervisor != "chsim" || in.OwnerAddr != addr || len(in.Pools) != 0 || in.Live != 0 {
		t.Fatalf("info at start: %+v, %v", in, err)
	}
	checkSandboxes(t, ctx, c, "start", map[string]string{})

	// Pools: the golden is built, then the pool fills.
	in, err = c.SetPools(ctx, api.PoolsRequest{Pools: []api.PoolSpec{{Template: "e2e", Warm: 1}}})
	if p, ok := poolOf(in, key); err != nil || !ok || p.Target != 1 {
		t.Fatalf("PUT pools: %+v, %v", in, err)
	}
	waitInfo(t, ctx, c, "golden and warm fill", func(in *api.Info) bool {
		p, _ := poolOf(in, key)
		return p.Golden && p.GoldenState == "ready" && p.Warm == 1 && p.Refilling == 0
	})

	// A warm claim.
	a, err := c.Claim(ctx, api.ClaimRequest{Template: "e2e", ClaimRef: "a", Metadata: map[string]string{"e2e": "warm"}})
	if err != nil || a.Tier != "warm" || a.VM == "" || a.OwnerAddr != addr {
		t.Fatalf("warm claim: %+v, %v", a, err)
	}
	checkSandboxes(t, ctx, c, "after the warm claim", map[string]string{a.ID: "running"})
	if in, err := c.Info(ctx); err != nil || in.Claimed != 1 || in.Live != 1 {
		t.Fatalf("info after the warm claim: %+v, %v", in, err)
	}
	// A second stream resumes after the warm claim's event, and follows the
	// rest live.
	evs := all.waitFor(t, "the warm claim's event", func(evs []apiclient.Event) bool { return hasEvent(t, evs, "claim_created", a.ID) })
	var mid uint64
	for _, ev := range evs {
		if ev.Event == "claim_created" {
			mid, _ = ev.Seq()
		}
	}
	resumed := collect(t, c, apiclient.EventsOptions{LastEventID: strconv.FormatUint(mid, 10)})
	waitInfo(t, ctx, c, "refill after the warm claim", func(in *api.Info) bool {
		p, _ := poolOf(in, key)
		return p.Warm == 1 && p.Refilling == 0
	})

	// The clone tier: with warm 0 the pool holds no warm VM (the refilled
	// one is trimmed), so a claim clones from the golden on demand.
	in, err = c.SetPools(ctx, api.PoolsRequest{Pools: []api.PoolSpec{{Template: "e2e", Warm: 0}}})
	if p, ok := poolOf(in, key); err != nil || !ok || p.Target != 0 || p.Warm != 0 {
		t.Fatalf("PUT pools warm 0: %+v, %v", in, err)
	}
	waitInfo(t, ctx, c, "an empty pool", func(in *api.Info) bool {
		p, _ := poolOf(in, key)
		return p.Warm == 0 && p.Refilling == 0
	})
	b, err := c.Claim(ctx, api.ClaimRequest{Template: "e2e", ClaimRef: "b"})
	if err != nil || b.Tier != "clone" || b.VM == "" {
		t.Fatalf("clone-tier claim: %+v, %v", b, err)
	}
	checkSandboxes(t, ctx, c, "after the clone claim", map[string]string{a.ID: "running", b.ID: "running"})
	if in, err := c.Info(ctx); err != nil || in.Claimed != 2 || in.Live != 2 {
		t.Fatalf("info after the clone claim: %+v, %v", in, err)
	}

	// Hibernate and wake the clone.
	if err := c.Hibernate(ctx, b.ID); err != nil {
		t.Fatalf("hibernate: %v", err)
	}
	waitState(t, ctx, c, b.ID, "hibernated")
	checkSandboxes(t, ctx, c, "hibernated", map[string]string{a.ID: "running", b.ID: "hibernated"})
	if in, err := c.Info(ctx); err != nil || in.Claimed != 1 || in.Hibernated != 1 || in.Live != 2 {
		t.Fatalf("info while hibernated: %+v, %v", in, err)
	}
	if err := c.Wake(ctx, b.ID); err != nil {
		t.Fatalf("wake: %v", err)
	}
	waitState(t, ctx, c, b.ID, "running")
	checkSandboxes(t, ctx, c, "woken", map[string]string{a.ID: "running", b.ID: "running"})
	if in, err := c.Info(ctx); err != nil || in.Claimed != 2 || in.Hibernated != 0 {
		t.Fatalf("info after wake: %+v, %v", in, err)
	}

	// Release both.
	for _, id := range []string{a.ID, b.ID} {
		if err := c.Release(ctx, id); err != nil {
			t.Fatalf("release %s: %v", id, err)
		}
	}
	checkSandboxes(t, ctx, c, "released", map[string]string{})
	if rel, err := c.Sandboxes(ctx, apiclient.ListOptions{State: "released"}); err != nil || len(rel) != 2 {
		t.Fatalf("released list: %+v, %v", rel, err)
	}
	if in, err := c.Info(ctx); err != nil || in.Live != 0 || in.Claimed != 0 {
		t.Fatalf("info after release: %+v, %v", in, err)
	}

	// The stream: wait for every VM to be gone, then the node is quiet.
	evs = all.waitFor(t, "every VM destroyed", func(evs []apiclient.Event) bool {
		return hasEvent(t, evs, "vm_destroyed", a.VM) && hasEvent(t, evs, "vm_destroyed", b.VM) && vmsSettled(t, evs)
	})
	end := uint64(len(evs))
	for i, ev := range evs {
		le := decode(t, ev)
		if seq, ok := ev.Seq(); !ok || seq != uint64(i+1) || le.Seq != seq || le.Type != ev.Event {
			t.Fatalf("event %d: id %s event %s data seq %d type %s", i+1, ev.ID, ev.Event, le.Seq, le.Type)
		}
	}
	for _, tc := range []struct {
		what, id string
		want     []string
	}{
		{"warm claim", a.ID, []string{"claim_created", "claim_released"}},
		{"clone claim", b.ID, []string{"claim_created", "claim_served", "hibernate_requested", "hibernated", "wake_requested", "woken", "claim_released"}},
		{"warm claim's VM", a.VM, []string{"vm_clone_requested", "vm_cloned", "vm_destroy_requested", "vm_destroyed"}},
		{"clone claim's VM", b.VM, []string{"vm_clone_requested", "vm_cloned", "vm_destroy_requested", "vm_destroyed"}},
		{"golden", key, []string{"golden_build_requested", "golden_built"}},
		{"node", "node", []string{"node_configured", "pools_configured", "pools_configured"}},
	} {
		if got := typesOf(t, evs, tc.id); !slices.Equal(got, tc.want) {
			t.Errorf("%s %s: events %v, want %v", tc.what, tc.id, got, tc.want)
		}
	}
	// Served by the tier the reply named, in the claim's event too.
	for _, cl := range []*api.ClaimResponse{a, b} {
		for _, ev := range evs {
			if le := decode(t, ev); ev.Event == "claim_created" && le.Aggregate.ID == cl.ID {
				var p struct{ Tier, VM string }
				if err := json.Unmarshal(le.Payload, &p); err != nil || p.Tier != cl.Tier || p.VM != cl.VM {
					t.Errorf("claim_created of %s: %s, reply said tier %s vm %s", cl.ID, le.Payload, cl.Tier, cl.VM)
				}
			}
		}
	}

	// The resumed stream: exactly the rest, no gap, no duplicate.
	rest := resumed.waitFor(t, "the resumed stream to reach the end", func(r []apiclient.Event) bool {
		return len(r) > 0 && r[len(r)-1].ID == strconv.FormatUint(end, 10)
	})
	if uint64(len(rest)) != end-mid {
		t.Fatalf("resumed after %d: %d events, want %d", mid, len(rest), end-mid)
	}
	for i, ev := range rest {
		want := evs[mid+uint64(i)]
		if ev.ID != want.ID || ev.Event != want.Event || !bytes.Equal(ev.Data, want.Data) {
			t.Fatalf("resumed event %d: %s %s, want %s %s", i, ev.ID, ev.Event, want.ID, want.Event)
		}
	}

	// /metrics counts one claim per tier.
	m, err := c.Metrics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, tier := range []string{"warm", "clone"} {
		re := regexp.MustCompile(`(?m)^sbx_claims_total\{outcome="ok",tier="` + tier + `"\} 1$`)
		if !re.MatchString(m) {
			t.Errorf("/metrics lacks one ok %s claim", tier)
		}
	}

	// Stop the daemon with both streams open: SIGTERM ends them rather
	// than waiting out the HTTP shutdown timeout (10 s) for them.
	stopStart := time.Now()
	d.stop(t)
	if took := time.Since(stopStart); took > 8*time.Second {
		t.Errorf("SIGTERM with open event streams took %v", took)
	}
	for _, col := range []*collector{all, resumed} {
		<-col.done // the server ended the stream
	}
	// The op log on disk holds exactly what was streamed.
	out, errs, code := sbxctl(t, dir, nil, "log", "dump", "--json", "--data", filepath.Join(data, "log"))
	if code != 0 {
		t.Fatalf("sbxctl log dump: exit %d: %s", code, errs)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if uint64(len(lines)) != end {
		t.Fatalf("log on disk has %d events, the stream %d", len(lines), end)
	}
	for i, line := range lines {
		var le struct {
			Seq   uint64 `json:"seq"`
			Type  string `json:"type"`
			AggID string `json:"agg_id"`
			OpID  string `json:"op_id"`
		}
		if err := json.Unmarshal([]byte(line), &le); err != nil {
			t.Fatalf("dump line %d: %v", i, err)
		}
		s := decode(t, evs[i])
		if le.Seq != s.Seq || le.Type != s.Type || le.AggID != s.Aggregate.ID || le.OpID != s.OpID {
			t.Fatalf("log seq %d: %+v, stream had %d %s %s %s", i+1, le, s.Seq, s.Type, s.Aggregate.ID, s.OpID)
		}
	}
}
