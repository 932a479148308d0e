package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sbxlog/sbxlog/projections/api"
)

// parseEventLines decodes events --json output and checks the sequences
// run from first without a gap or duplicate.
func parseEventLines(t *testing.T, out string, first uint64) []api.EventJSON {
	t.Helper()
	var evs []api.EventJSON
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if line == "" {
			continue
		}
		var e api.EventJSON
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			t.Fatalf("line %q: %v", line, err)
		}
		if want := first + uint64(len(evs)); e.Seq != want {
			t.Fatalf("seq %d where %d was due (gap or duplicate)\n%s", e.Seq, want, out)
		}
		evs = append(evs, e)
	}
	return evs
}

func TestEventsUpToNow(t *testing.T) {
	n := startNode(t, 1)
	var cl api.ClaimResponse
	mustJSON(t, &cl, "claim", "--template", "default")
	settle(t, n)
	last := n.Log.LastSeq()

	evs := parseEventLines(t, mustRun(t, "events", "--json"), 1)
	if uint64(len(evs)) != last {
		t.Fatalf("%d events, the log has %d: %+v", len(evs), last, evs)
	}
	var created bool
	for _, e := range evs {
		created = created || e.Type == "claim_created" && e.Aggregate.ID == cl.ID
	}
	if !created {
		t.Fatalf("no claim_created for %s", cl.ID)
	}
	if evs := parseEventLines(t, mustRun(t, "events", "--from", "3", "--json"), 3); uint64(len(evs)) != last-2 {
		t.Fatalf("--from 3: %d events", len(evs))
	}
	if out := mustRun(t, "events", "--from", "1000"); out != "" {
		t.Fatalf("--from past the end printed %q", out)
	}
	table := mustRun(t, "events")
	if lines := strings.Split(strings.TrimSpace(table), "\n"); uint64(len(lines)) != last+1 || lines[0] != eventHeader ||
		!strings.HasPrefix(lines[1], "1 ") || !strings.Contains(table, "claim_created") || !strings.Contains(table, "claim/"+cl.ID) {
		t.Fatalf("events table:\n%s", table)
	}

	// A tenant's stream skips other tenants' events and so never reaches
	// the node's end: it stops after --idle.
	var own api.ClaimResponse
	mustJSON(t, &own, "claim", "--template", "default", "--token", "acme-token")
	start := time.Now()
	out := mustRun(t, "events", "--json", "--token", "acme-token", "--idle", "300ms")
	var types []string
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var e api.EventJSON
		if err := json.Unmarshal([]byte(line), &e); err != nil || e.Aggregate.ID != own.ID {
			t.Fatalf("tenant saw %q (%v)", line, err)
		}
		types = append(types, e.Type)
	}
	if strings.Join(types, ",") != "claim_created" || time.Since(start) > 10*time.Second {
		t.Fatalf("tenant events %v after %v", types, time.Since(start))
	}

	// The VM view prints its sync and returns.
	vms := mustRun(t, "events", "--view", "vms")
	// (The refill after the tenant's claim may or may not be in it.)
	if !strings.HasPrefix(vms, "SYNC ") || strings.Count(vms, " claimed ") != 2 || !strings.Contains(vms, own.ID) {
		t.Fatalf("vm view:\n%s", vms)
	}
}

// TestEventsFollowResumes runs `events --follow` against a server that
// ends the stream twice: the command must reconnect each time with
// Last-Event-ID set to the last event it printed, and print every event
// once. The third connection proves the second resume and stops the test.
func TestEventsFollowResumes(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	baseContext = func() context.Context { return ctx }
	t.Cleanup(func() { baseContext = context.Background })

	send := func(w http.ResponseWriter, from, to uint64) {
		w.Header().Set("Content-Type", "text/event-stream")
		for seq := from; seq <= to; seq++ {
			data, _ := json.Marshal(api.EventJSON{Seq: seq, Type: "claim_renewed", Time: "2026-01-02T03:04:05Z",
				Aggregate: api.AggregateJSON{Kind: "claim", ID: "sb_0000000000000001"}, Payload: json.RawMessage("{}")})
			fmt.Fprintf(w, ": heartbeat\n\nid: %d\nevent: claim_renewed\ndata: %s\n\n", seq, data)
		}
	}
	var mu sync.Mutex
	var cursors []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/events" || r.Header.Get("Authorization") != "Bearer tok" {
			http.Error(w, `{"error":"unexpected request"}`, http.StatusBadRequest)
			return
		}
		mu.Lock()
		cursors = append(cursors, r.URL.Query().Get("from")+"/"+r.Header.Get("Last-Event-ID"))
		n := len(cursors)
		mu.Unlock()
		switch n {
		case 1:
			send(w, 1, 3)
		case 2:
			send(w, 4, 5)
		default:
			cancel()
		}
	}))
	t.Cleanup(srv.Close)

	code, out, errs := sbx("events", "--follow", "--json", "--addr", srv.URL, "--token", "tok")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	if evs := parseEventLines(t, out, 1); len(evs) != 5 {
		t.Fatalf("%d events printed:\n%s", len(evs), out)
	}
	mu.Lock()
	defer mu.Unlock()
	if strings.Join(cursors, " ") != "1/ /3 /5" {
		t.Fatalf("connections asked for (from/Last-Event-ID) %q, want 1/ /3 /5", cursors)
	}
	if strings.Count(errs, "reconnecting, resuming after") != 2 || !strings.Contains(errs, "resuming after 5") {
		t.Fatalf("reconnects not reported: %s", errs)
	}
}
