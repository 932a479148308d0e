package apiclient_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sbxlog/sbxlog/fsm"
	"github.com/sbxlog/sbxlog/projections/api"
	"github.com/sbxlog/sbxlog/projections/apiclient"
)

// rawSSE serves body verbatim as an event stream.
func rawSSE(t *testing.T, body string) *apiclient.Client {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, body)
	}))
	t.Cleanup(srv.Close)
	c, err := apiclient.New(srv.URL, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestStreamFraming: the SSE framing rules the reader must follow.
func TestStreamFraming(t *testing.T) {
	cases := []struct {
		name   string
		body   string
		want   []apiclient.Event
		err    error
		lastID string
	}{
		{"plain", "id: 1\nevent: a\ndata: {}\n\nid: 2\nevent: b\ndata: x\n\n",
			[]apiclient.Event{{ID: "1", Event: "a", Data: []byte("{}")}, {ID: "2", Event: "b", Data: []byte("x")}}, io.EOF, "2"},
		{"heartbeats and CRLF", ": heartbeat\n\nid: 7\r\nevent: a\r\ndata: 1\r\n\r\n: heartbeat\n\n",
			[]apiclient.Event{{ID: "7", Event: "a", Data: []byte("1")}}, io.EOF, "7"},
		{"multi-line data, no space, default type", "data:l1\ndata: l2\n\n",
			[]apiclient.Event{{Event: "message", Data: []byte("l1\nl2")}}, io.EOF, ""},
		{"no data is dropped but moves the cursor", "id: 4\nevent: a\n\nid: 5\nevent: b\ndata: y\n\n",
			[]apiclient.Event{{ID: "5", Event: "b", Data: []byte("y")}}, io.EOF, "5"},
		{"cut mid-event", "id: 1\nevent: a\ndata: 1\n\nid: 2\nevent: a\ndata: 2",
			[]apiclient.Event{{ID: "1", Event: "a", Data: []byte("1")}}, io.ErrUnexpectedEOF, "1"},
		{"error event ends", "id: 3\nevent: a\ndata: 1\n\nevent: error\ndata: {\"error\":\"cursor 9 too old\",\"cursor\":9}\n\nid: 4\nevent: a\ndata: 2\n\n",
			[]apiclient.Event{{ID: "3", Event: "a", Data: []byte("1")}}, &apiclient.StreamError{Message: "cursor 9 too old", Cursor: 9}, "3"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := rawSSE(t, tc.body)
			s, err := c.Events(ctxT(t), apiclient.EventsOptions{})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			var got []apiclient.Event
			for {
				ev, err := s.Next()
				if err != nil {
					var se, wantSE *apiclient.StreamError
					if errors.As(tc.err, &wantSE) {
						if !errors.As(err, &se) || *se != *wantSE {
							t.Fatalf("error %v, want %v", err, tc.err)
						}
					} else if !errors.Is(err, tc.err) {
						t.Fatalf("error %v, want %v", err, tc.err)
					}
					break
				}
				got = append(got, ev)
			}
			if fmt.Sprintf("%q", got) != fmt.Sprintf("%q", tc.want) {
				t.Fatalf("events\n got %q\nwant %q", got, tc.want)
			}
			if s.LastEventID() != tc.lastID {
				t.Fatalf("LastEventID %q, want %q", s.LastEventID(), tc.lastID)
			}
			if _, err := s.Next(); !errors.Is(err, io.EOF) {
				t.Fatalf("Next after the end: %v, want io.EOF", err)
			}
		})
	}
}

func TestStreamIdleTimeout(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(200)
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(func() { close(release); srv.Close() })
	c, _ := apiclient.New(srv.URL, "", nil)
	s, err := c.Events(ctxT(t), apiclient.EventsOptions{IdleTimeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	start := time.Now()
	if _, err := s.Next(); !errors.Is(err, apiclient.ErrIdle) {
		t.Fatalf("Next: %v, want ErrIdle", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("idle detection took %v", d)
	}
}

func TestEventsRefused(t *testing.T) {
	_, c := startNode(t, 0)
	ctx := ctxT(t)
	for _, tc := range []struct {
		name   string
		c      *apiclient.Client
		o      apiclient.EventsOptions
		status int
	}{
		{"no token", c.WithToken(""), apiclient.EventsOptions{}, 401},
		{"tenant VM view", c.WithToken("acme-token"), apiclient.EventsOptions{View: "vms"}, 403},
		{"bad view", c, apiclient.EventsOptions{View: "nope"}, 400},
	} {
		_, err := tc.c.Events(ctx, tc.o)
		if apiclient.StatusOf(err) != tc.status {
			t.Errorf("%s: %v, want status %d", tc.name, err, tc.status)
		}
		// Follow gives up on a 4xx instead of retrying forever.
		err = tc.c.Follow(ctx, apiclient.FollowOptions{EventsOptions: apiclient.EventsOptions{From: 1, View: tc.o.View}},
			func(apiclient.Event) error { return nil })
		if apiclient.StatusOf(err) != tc.status {
			t.Errorf("%s: Follow returned %v, want status %d", tc.name, err, tc.status)
		}
	}
	// A cursor beyond the end is refused in-stream, before any event:
	// Follow reports it rather than reconnecting forever.
	err := c.Follow(ctx, apiclient.FollowOptions{EventsOptions: apiclient.EventsOptions{From: 1 << 40}},
		func(apiclient.Event) error { return nil })
	var se *apiclient.StreamError
	if !errors.As(err, &se) || se.Cursor != 1<<40 {
		t.Fatalf("Follow from beyond the end: %v", err)
	}
}

// TestFollowResumesAcrossDisconnects cuts every connection of the stream
// several times while claims are made, and checks the callback saw every
// sequence exactly once, in order, identical to the log.
func TestFollowResumesAcrossDisconnects(t *testing.T) {
	n, c := startNode(t, 2)
	ctx, cancel := context.WithCancel(ctxT(t))
	defer cancel()
	// The follower's connections are the ones cut.
	var cuts cutter
	follower, err := apiclient.New(n.URL, rootToken, cuts.client())
	if err != nil {
		t.Fatal(err)
	}

	var mu sync.Mutex
	var seqs []uint64
	var reconnects int
	done := make(chan error, 1)
	go func() {
		done <- follower.Follow(ctx, apiclient.FollowOptions{
			EventsOptions: apiclient.EventsOptions{From: 1},
			MinBackoff:    time.Millisecond,
			OnReconnect:   func(error, string) { mu.Lock(); reconnects++; mu.Unlock() },
		}, func(ev apiclient.Event) error {
			seq, ok := ev.Seq()
			if !ok {
				return fmt.Errorf("event without a sequence: %+v", ev)
			}
			le, err := ev.LogEvent()
			if err != nil || le.Seq != seq || le.Type != ev.Event {
				return fmt.Errorf("data %s does not match id %s / event %s: %v", ev.Data, ev.ID, ev.Event, err)
			}
			mu.Lock()
			seqs = append(seqs, seq)
			mu.Unlock()
			return nil
		})
	}()
	seen := func() int { mu.Lock(); defer mu.Unlock(); return len(seqs) }
	waitSeen := func(min int) {
		deadline := time.Now().Add(10 * time.Second)
		for seen() < min {
			if time.Now().After(deadline) {
				t.Fatalf("follower saw %d events, want >= %d", seen(), min)
			}
			time.Sleep(2 * time.Millisecond)
		}
	}
	for i := range 4 {
		waitSeen(1)
		cuts.cut()
		if _, err := c.Claim(ctx, api.ClaimRequest{Template: "default", ClaimRef: strconv.Itoa(i)}); err != nil {
			t.Fatalf("claim %d: %v", i, err)
		}
		settle(t, n)
	}
	last := n.Log.LastSeq()
	waitSeen(int(last))
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Follow returned %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	for i, s := range seqs {
		if s != uint64(i+1) {
			t.Fatalf("sequence %d at position %d (gap or duplicate): %v", s, i, seqs)
		}
	}
	if reconnects < 1 {
		t.Fatalf("no reconnect happened (%d)", reconnects)
	}
	var claims int
	n.Engine.View(func(st *fsm.State) { claims = st.LiveClaims() })
	if claims != 4 {
		t.Fatalf("%d live claims, want 4", claims)
	}
}

// TestFollowWithoutCursorStartsAtTheEnd: no cursor means only what is
// appended after Follow started.
func TestFollowWithoutCursorStartsAtTheEnd(t *testing.T) {
	n, c := startNode(t, 1)
	ctx, cancel := context.WithCancel(ctxT(t))
	defer cancel()
	got := make(chan apiclient.Event, 100)
	go func() {
		_ = c.Follow(ctx, apiclient.FollowOptions{}, func(ev apiclient.Event) error { got <- ev; return nil })
	}()
	// Wait until the stream is open (the server counts it), so the claim
	// is after the start.
	deadline := time.Now().Add(10 * time.Second)
	for {
		m, err := c.Metrics(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(m, "\nsbx_events_clients 1\n") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the follower never connected")
		}
		time.Sleep(5 * time.Millisecond)
	}
	start := n.Log.LastSeq()
	cl, err := c.Claim(ctx, api.ClaimRequest{Template: "default"})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case ev := <-got:
		seq, _ := ev.Seq()
		le, _ := ev.LogEvent()
		if seq != start+1 || ev.Event != "claim_created" || le.Aggregate.ID != cl.ID {
			t.Fatalf("first event %d %s %s, want %d claim_created %s", seq, ev.Event, le.Aggregate.ID, start+1, cl.ID)
		}
	case <-ctx.Done():
		t.Fatal("no event")
	}
}

// TestVMViewSync: the VM view starts with a sync, then changes; folding
// them gives the pool's two warm VMs.
func TestVMViewSync(t *testing.T) {
	_, c := startNode(t, 2)
	s, err := c.Events(ctxT(t), apiclient.EventsOptions{View: "vms"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ev, err := s.Next()
	if err != nil || ev.Event != "sync" {
		t.Fatalf("first VM view event %+v, %v", ev, err)
	}
	var body struct {
		VMs []api.VM `json:"vms"`
	}
	if err := json.Unmarshal(ev.Data, &body); err != nil || len(body.VMs) != 2 {
		t.Fatalf("sync %s: %v", ev.Data, err)
	}
	vms := map[string]api.VM{}
	for _, vm := range body.VMs {
		vms[vm.Name] = vm
	}
	// The view follows commits, so it may trail the state by the last
	// ones: changes bring it level.
	for vms[body.VMs[0].Name].State != "warm" || vms[body.VMs[1].Name].State != "warm" {
		ev, err := s.Next()
		if err != nil || ev.Event != "change" {
			t.Fatalf("VM view event %+v, %v", ev, err)
		}
		var ch api.VMChange
		if err := json.Unmarshal(ev.Data, &ch); err != nil || ch.Type != "MODIFIED" || ch.VM.Generation <= vms[ch.VM.Name].Generation {
			t.Fatalf("change %s: %v", ev.Data, err)
		}
		vms[ch.VM.Name] = ch.VM
	}
}
