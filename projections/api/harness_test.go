package api_test

// The tests in this package drive a real api.Server over a real engine and a
// real Pebble op log in t.TempDir(), through a real loopback HTTP server, with
// an IN-PROCESS HYPERVISOR FAKE behind a real scheduler.Scheduler (apitest):
// every intent is answered at once, so pools fill and claims are served
// without chsim.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sbxlog/sbxlog/cmd/sandboxd/node/nodetest"
	"github.com/sbxlog/sbxlog/fsm"
	"github.com/sbxlog/sbxlog/projections/api"
	"github.com/sbxlog/sbxlog/projections/auth"
	"github.com/sbxlog/sbxlog/projections/openapi/openapitest"
)

const (
	rootTok = "root-token"
	tokA    = "tenant-a-token"
	tokB    = "tenant-b-token"
)

var defKey = fsm.PoolKey{Template: "default", Net: "none", Size: "small"}

// newNode starts an in-process node (hypervisor faked) with tenants a and b
// and one pool of warm VMs, and waits until the pool is warm.
func newNode(t testing.TB, warm int, mod func(*nodetest.Options)) *nodetest.Node {
	t.Helper()
	opts := nodetest.Options{
		Dir:       t.TempDir(),
		RootToken: rootTok,
		Tenants: []auth.TenantConfig{
			{Name: "a", TokenSHA256: auth.HashToken(tokA)},
			{Name: "b", TokenSHA256: auth.HashToken(tokB)},
		},
		Pools: []fsm.PoolSpec{{PoolKey: defKey, Warm: warm}},
	}
	if mod != nil {
		mod(&opts)
	}
	n, err := nodetest.Start(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := n.Close(); err != nil {
			t.Errorf("close node: %v", err)
		}
	})
	if warm > 0 && !opts.NoExecutors {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := n.WaitWarm(ctx, defKey, warm); err != nil {
			t.Fatal(err)
		}
	}
	return n
}

// settle waits until the node's executors and refills are done, so the log
// only grows by what the test does next.
func settle(t testing.TB, n *nodetest.Node) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := n.Settle(ctx); err != nil {
		t.Fatal(err)
	}
}

// call sends a request and returns its status and body; a text/event-stream
// response is not read (it never ends), only its status is returned.
func call(t testing.TB, n *nodetest.Node, method, path, token string, body []byte) (int, []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, n.URL+path, bytesOrNil(body))
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := openapitest.Client(t, nil).Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		return resp.StatusCode, nil
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: read body: %v", method, path, err)
	}
	return resp.StatusCode, b
}

func bytesOrNil(b []byte) io.Reader {
	if b == nil {
		return nil
	}
	return strings.NewReader(string(b))
}

// claimAs claims a sandbox of the default pool with token and returns the
// reply.
func claimAs(t testing.TB, n *nodetest.Node, token, extra string) api.ClaimResponse {
	t.Helper()
	body := `{"template":"default"` + extra + `}`
	st, b := call(t, n, "POST", "/v1/claim", token, []byte(body))
	if st != http.StatusOK {
		t.Fatalf("claim %s: %d %s", body, st, b)
	}
	var cr api.ClaimResponse
	if err := json.Unmarshal(b, &cr); err != nil {
		t.Fatalf("claim reply %s: %v", b, err)
	}
	return cr
}

// waitState polls GET /v1/sandboxes/{id} (as root) until the sandbox is in
// state want: the executors answer asynchronously.
func waitState(t testing.TB, n *nodetest.Node, id, want string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		st, b := call(t, n, "GET", "/v1/sandboxes/"+id, rootTok, nil)
		var sb api.Sandbox
		_ = json.Unmarshal(b, &sb)
		if st == http.StatusOK && sb.State == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandbox %s: %d %s, want state %s", id, st, b, want)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// sseEvent is one parsed Server-Sent Event.
type sseEvent struct {
	ID, Type string
	Data     []byte
}

// stream opens GET path as SSE with token and delivers its events on the
// returned channel until the test ends.
func stream(t testing.TB, n *nodetest.Node, path, token string) <-chan sseEvent {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, "GET", n.URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := openapitest.Client(t, nil).Do(req)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		cancel()
		t.Fatalf("GET %s: %d %s", path, resp.StatusCode, b)
	}
	out := make(chan sseEvent, 1024)
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); resp.Body.Close(); <-done })
	go func() {
		defer close(done)
		defer close(out)
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 64<<10), 4<<20)
		var ev sseEvent
		for sc.Scan() {
			line := sc.Text()
			switch {
			case line == "":
				if ev.Type != "" || ev.Data != nil {
					select {
					case out <- ev:
					case <-ctx.Done():
						return
					}
				}
				ev = sseEvent{}
			case strings.HasPrefix(line, ":"):
			case strings.HasPrefix(line, "id: "):
				ev.ID = line[4:]
			case strings.HasPrefix(line, "event: "):
				ev.Type = line[7:]
			case strings.HasPrefix(line, "data: "):
				if ev.Data != nil {
					ev.Data = append(ev.Data, '\n')
				}
				ev.Data = append(ev.Data, line[6:]...)
			}
		}
	}()
	return out
}

// collect reads events from ch until until returns true for one of them
// (included), or fails the test after timeout.
func collect(t testing.TB, ch <-chan sseEvent, timeout time.Duration, until func(api.EventJSON) bool) []api.EventJSON {
	t.Helper()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	var got []api.EventJSON
	for {
		select {
		case ev, ok := <-ch:
			if !ok {
				t.Fatalf("stream ended after %d events", len(got))
			}
			if ev.Type == "error" {
				t.Fatalf("stream error event: %s", ev.Data)
			}
			var e api.EventJSON
			if err := json.Unmarshal(ev.Data, &e); err != nil {
				t.Fatalf("event %s %q: %v", ev.Type, ev.Data, err)
			}
			if ev.ID != fmt.Sprint(e.Seq) || ev.Type != e.Type {
				t.Fatalf("SSE id/event %s/%s disagree with data seq/type %d/%s", ev.ID, ev.Type, e.Seq, e.Type)
			}
			got = append(got, e)
			if until(e) {
				return got
			}
		case <-timer.C:
			var seen []string
			for _, e := range got {
				seen = append(seen, fmt.Sprintf("%d %s %s", e.Seq, e.Type, e.Aggregate.ID))
			}
			t.Fatalf("no terminating event within %s; got %d events: %v", timeout, len(got), seen)
		}
	}
}

func TestHarnessServesWarmAndCloneClaims(t *testing.T) {
	n := newNode(t, 2, nil)
	cr := claimAs(t, n, rootTok, "")
	if cr.Tier != "warm" || !strings.HasPrefix(cr.ID, "sb_") || !strings.HasPrefix(cr.Token, "sbt_") {
		t.Fatalf("warm claim reply %+v", cr)
	}
	if _, err := time.Parse(time.RFC3339Nano, cr.Deadline); err != nil {
		t.Fatalf("deadline %q: %v", cr.Deadline, err)
	}
	// Drain the warm VMs faster than the fake refills them is not
	// deterministic; a pool with no warm target always serves by clone.
	n2 := newNode(t, 0, nil)
	c2 := claimAs(t, n2, rootTok, "")
	if c2.Tier != "cold" && c2.Tier != "clone" {
		t.Fatalf("claim on an empty pool: tier %q, want clone or cold", c2.Tier)
	}
	if got := n2.Driver.Calls()["clone"]; got != 1 {
		t.Fatalf("fake clones = %d, want 1", got)
	}
	st, _ := call(t, n, "POST", "/v1/sandboxes/"+cr.ID+"/release", cr.Token, nil)
	if st != http.StatusNoContent {
		t.Fatalf("release with the sandbox token: %d", st)
	}
	waitState(t, n, cr.ID, "released")
}
