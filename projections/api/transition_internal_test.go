package api

import (
	"context"
	"net/http/httptest"
	"testing"
	"time"
)

// queued waits until sandbox id's queue holds n calls.
func (q *verbQueue) queued(t *testing.T, id string, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		q.mu.Lock()
		got := len(q.tails[id])
		q.mu.Unlock()
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("queue of %s holds %d calls, want %d", id, got, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// noTurn fails the test if a call gets its turn soon while holder holds
// the sandbox.
func noTurn(t *testing.T, turns <-chan string, holder string) {
	t.Helper()
	select {
	case got := <-turns:
		t.Fatalf("%q got a turn while %s holds the sandbox", got, holder)
	case <-time.After(20 * time.Millisecond):
	}
}

// TestVerbQueueOrder: calls on one sandbox get their turn in arrival
// order, one at a time; a call that gives up does not let the one behind
// it overtake the one before it; another sandbox's calls do not wait.
func TestVerbQueueOrder(t *testing.T) {
	var q verbQueue
	ctx := context.Background()
	if err := q.enter(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	turns := make(chan string, 4)
	enter := func(name string, ctx context.Context) {
		go func() {
			if err := q.enter(ctx, "a"); err != nil {
				turns <- name + " gave up"
				return
			}
			turns <- name
		}()
	}
	enter("b", ctx)
	q.queued(t, "a", 2)
	gaveUp, cancel := context.WithCancel(ctx)
	enter("c", gaveUp)
	q.queued(t, "a", 3)
	enter("d", ctx)
	q.queued(t, "a", 4)
	if err := q.enter(ctx, "other"); err != nil {
		t.Fatalf("another sandbox's call waited: %v", err)
	}
	q.leave("other")

	cancel()
	if got := <-turns; got != "c gave up" {
		t.Fatalf("first event %q, want c giving up", got)
	}
	noTurn(t, turns, "the first call")
	q.leave("a") // the first call
	if got := <-turns; got != "b" {
		t.Fatalf("turn %q, want b", got)
	}
	noTurn(t, turns, "b")
	q.leave("a") // b; c, which gave up, leaves on its own
	if got := <-turns; got != "d" {
		t.Fatalf("turn %q, want d", got)
	}
	q.leave("a")
	q.queued(t, "a", 0)
}

func TestRespondAsync(t *testing.T) {
	for _, tc := range []struct {
		target string
		prefer []string
		async  bool
		bad    bool
	}{
		{"/x", nil, false, false},
		{"/x?wait=false", nil, true, false},
		{"/x?wait=0", nil, true, false},
		{"/x?wait=true", nil, false, false},
		{"/x?wait=later", nil, false, true},
		{"/x", []string{"respond-async"}, true, false},
		{"/x", []string{"return=minimal, Respond-Async ; foo=1"}, true, false},
		{"/x", []string{"return=minimal", "respond-async"}, true, false},
		{"/x", []string{"respond-asynchronously"}, false, false},
		{"/x?wait=true", []string{"respond-async"}, true, false},
	} {
		r := httptest.NewRequest("POST", tc.target, nil)
		for _, p := range tc.prefer {
			r.Header.Add("Prefer", p)
		}
		async, err := respondAsync(r)
		if async != tc.async || (err != nil) != tc.bad {
			t.Errorf("%s Prefer %q: async %v err %v, want %v bad %v", tc.target, tc.prefer, async, err, tc.async, tc.bad)
		}
	}
}
