package api_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sbxlog/sbxlog/cmd/sandboxd/node"
	"github.com/sbxlog/sbxlog/cmd/sandboxd/node/nodetest"
	"github.com/sbxlog/sbxlog/executors/guest/silkagent"
	"github.com/sbxlog/sbxlog/fsm"
	"github.com/sbxlog/sbxlog/projections/api"
)

// budgetNode is newNode with a relay memory budget of budget bytes.
func budgetNode(t testing.TB, warm int, budget int64, mod func(*nodetest.Options)) *nodetest.Node {
	t.Helper()
	return newNode(t, warm, func(o *nodetest.Options) {
		o.Tune = func(c *node.Config) { c.DataPlane.RelayMemory = budget }
		if mod != nil {
			mod(o)
		}
	})
}

// waitReserved awaits the node's relays reserving want bytes.
func waitReserved(t testing.TB, n *nodetest.Node, want int64) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		got, _ := n.Server.RelayMemory()
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("relays reserve %d bytes, want %d", got, want)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// spentRefusal checks a data-plane answer is the budget's refusal.
func spentRefusal(t testing.TB, what string, st int, body string) {
	t.Helper()
	if st != http.StatusServiceUnavailable || !strings.Contains(body, `"error":"relay memory budget spent: `) {
		t.Fatalf("%s with the budget spent: %d %s, want 503 relay memory budget spent", what, st, body)
	}
}

// portEcho opens a port relay to the simulated guest's echo port.
func portEcho(t testing.TB, n *nodetest.Node, c api.ClaimResponse) (*upgraded, int, string) {
	t.Helper()
	return dialPort(t, n, c.ID, c.Token, fmt.Sprint(silkagent.SimEchoPort), true)
}

// A spent budget refuses every kind of relay with 503 and Retry-After
// before anything else (no wake, no dial, no relay_opened), counts the
// refusal, and a relay that ends, by its client or by a release, gives its
// share back.
func TestRelayMemoryBudgetRefuses(t *testing.T) {
	n := budgetNode(t, 3, 2*api.MinRelayMemory, nil)
	c := claimAs(t, n, rootTok, "")
	h := claimAs(t, n, rootTok, "")
	hibernateNow(t, n, h.ID, h.Token)
	if r, b := n.Server.RelayMemory(); r != 0 || b != 2*api.MinRelayMemory {
		t.Fatalf("before any relay: reserved %d budget %d", r, b)
	}

	var open []*upgraded
	for range 2 {
		u, st, msg := portEcho(t, n, c)
		if st != http.StatusSwitchingProtocols {
			t.Fatalf("port relay within the budget: %d %s", st, msg)
		}
		open = append(open, u)
	}
	waitRelays(t, n, c.ID, 2)
	waitReserved(t, n, 2*api.MinRelayMemory)
	dials := n.Driver.Dials()

	_, st, msg := portEcho(t, n, c)
	spentRefusal(t, "a third port relay", st, msg)
	_, st, msg = dialAgent(t, n, c.ID, c.Token, nil)
	spentRefusal(t, "an agent relay", st, fmt.Sprintf(`{"error":%q}`, msg))
	_, st, msg = portEcho(t, n, h)
	spentRefusal(t, "a port relay to a hibernated sandbox", st, msg)

	req, _ := http.NewRequest("POST", n.URL+"/v1/sandboxes/"+c.ID+"/exec", strings.NewReader(`{"argv":["true"]}`))
	req.Header.Set("Authorization", "Bearer "+c.Token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	spentRefusal(t, "an exec", resp.StatusCode, string(b))
	if ra := resp.Header.Get("Retry-After"); ra != "1" {
		t.Fatalf("exec refusal Retry-After %q, want 1", ra)
	}

	if got := n.Driver.Dials() - dials; got != 0 {
		t.Fatalf("%d guest dials for refused relays, want 0", got)
	}
	if got := n.Driver.Calls()[fsm.KindWake]; got != 0 {
		t.Fatalf("a refused relay woke its sandbox (%d wakes)", got)
	}
	waitState(t, n, h.ID, "hibernated")
	if got := strings.Join(relayEvents(t, n, c.ID), ","); got != "relay_opened port,relay_opened port" {
		t.Fatalf("relay events %s: a refused relay was recorded", got)
	}
	if st, b := call(t, n, "GET", "/metrics", rootTok, nil); st != http.StatusOK ||
		!strings.Contains(string(b), `sbx_relay_refused_total{reason="memory"} 4`) ||
		!strings.Contains(string(b), `sbx_relay_memory_bytes{state="reserved"} `+strconv.FormatFloat(2*api.MinRelayMemory, 'g', -1, 64)) {
		t.Fatalf("metrics %d: no refusal count of 4 or reserved bytes:\n%s", st, grepLines(string(b), "sbx_relay"))
	}

	// The client ends one: its share is back, and a new relay fits.
	open[0].Close()
	waitRelays(t, n, c.ID, 1)
	waitReserved(t, n, api.MinRelayMemory)
	if _, st, msg := portEcho(t, n, c); st != http.StatusSwitchingProtocols {
		t.Fatalf("port relay after one ended: %d %s", st, msg)
	}
	waitReserved(t, n, 2*api.MinRelayMemory)

	// A release ends the rest: everything is back.
	if st, b := call(t, n, "POST", "/v1/sandboxes/"+c.ID+"/release", c.Token, nil); st != http.StatusNoContent {
		t.Fatalf("release: %d %s", st, b)
	}
	waitReserved(t, n, 0)
}

// grepLines keeps the lines of s that contain sub.
func grepLines(s, sub string) string {
	var out []string
	for l := range strings.Lines(s) {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "")
}

// Many relays at once, round after round, ended every way a relay ends
// (the client, a release, a hibernate, a crash): the budget admits exactly
// what fits each round and is whole again after each.
func TestRelayMemoryBudgetManyRelays(t *testing.T) {
	const k = 8
	dir := t.TempDir()
	n := budgetNode(t, 4, k*api.MinRelayMemory, func(o *nodetest.Options) { o.Dir = dir })
	ends := []string{"client", "release", "hibernate", "kill"}
	for round, end := range ends {
		c := claimAs(t, n, rootTok, "")
		conns := make([]*upgraded, k)
		var wg sync.WaitGroup
		errs := make(chan string, k)
		for i := range k {
			wg.Go(func() {
				u, st, msg := portEcho(t, n, c)
				if st != http.StatusSwitchingProtocols {
					errs <- fmt.Sprintf("relay %d: %d %s", i, st, msg)
					return
				}
				conns[i] = u
			})
		}
		wg.Wait()
		close(errs)
		for e := range errs {
			t.Fatalf("round %d (%s): %s", round, end, e)
		}
		waitRelays(t, n, c.ID, k)
		waitReserved(t, n, k*api.MinRelayMemory)
		_, st, msg := portEcho(t, n, c)
		spentRefusal(t, fmt.Sprintf("round %d: relay %d", round, k+1), st, msg)

		switch end {
		case "client":
			for _, u := range conns {
				u.Close()
			}
			waitRelays(t, n, c.ID, 0)
		case "release":
			if st, b := call(t, n, "POST", "/v1/sandboxes/"+c.ID+"/release", c.Token, nil); st != http.StatusNoContent {
				t.Fatalf("release: %d %s", st, b)
			}
		case "hibernate":
			hibernateNow(t, n, c.ID, c.Token)
		case "kill":
			srv := n.Server
			n.Kill()
			r, _ := srv.RelayMemory()
			for deadline := time.Now().Add(30 * time.Second); r != 0; r, _ = srv.RelayMemory() {
				if time.Now().After(deadline) {
					t.Fatalf("after the crash the dead server's relays still reserve %d bytes", r)
				}
				time.Sleep(2 * time.Millisecond)
			}
			n = budgetNode(t, 4, k*api.MinRelayMemory, func(o *nodetest.Options) { o.Dir = dir })
			waitRelays(t, n, c.ID, 0)
		}
		waitReserved(t, n, 0)
	}
}

// An agent relay on the splice path (a TCP client, a unix guest) holds no
// copy buffer: once upgraded it reserves nothing, so a budget that fits
// one port relay holds many agent relays.
func TestRelayMemoryBudgetSplicedAgentRelays(t *testing.T) {
	n := budgetNode(t, 1, api.MinRelayMemory, nil)
	n.Driver.SetAgent(nodetest.EchoAgent)
	c := claimAs(t, n, rootTok, "")
	const many = 32 // 32 copy-buffer pairs are 4 MiB, over the budget
	for i := range many {
		u, st, msg := dialAgent(t, n, c.ID, c.Token, []byte("ping\n"))
		if st != http.StatusSwitchingProtocols {
			t.Fatalf("agent relay %d: %d %s", i, st, msg)
		}
		if line, err := u.r.ReadString('\n'); err != nil || line != "ping\n" {
			t.Fatalf("agent relay %d echo %q %v", i, line, err)
		}
	}
	waitRelays(t, n, c.ID, many)
	waitReserved(t, n, 0)
}

// The refusal is JSON, as every error.
func TestRelayMemoryRefusalBody(t *testing.T) {
	n := budgetNode(t, 1, api.MinRelayMemory, nil)
	c := claimAs(t, n, rootTok, "")
	if _, st, msg := portEcho(t, n, c); st != http.StatusSwitchingProtocols {
		t.Fatalf("%d %s", st, msg)
	}
	_, st, body := portEcho(t, n, c)
	var e struct{ Error string }
	if err := json.Unmarshal([]byte(body), &e); err != nil || st != http.StatusServiceUnavailable {
		t.Fatalf("%d %q: %v", st, body, err)
	}
	want := fmt.Sprintf("relay memory budget spent: open relays hold %d of the node's %d bytes, this relay needs %d", api.MinRelayMemory, api.MinRelayMemory, api.MinRelayMemory)
	if e.Error != want {
		t.Fatalf("error %q, want %q", e.Error, want)
	}
}
