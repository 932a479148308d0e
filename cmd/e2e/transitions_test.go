package e2e

import (
	"context"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sbxlog/sbxlog/projections/api"
	"github.com/sbxlog/sbxlog/projections/apiclient"
)

// snapshotLatency is how long chsim takes over every snapshot here.
const snapshotLatency = 500 * time.Millisecond

// outcome is one hibernate, wake or release sent in the background: its
// error, the sandbox's state read right after it returned, and its place
// among the calls' returns.
type outcome struct {
	err   error
	state string
	order int64
	took  time.Duration
}

type caller struct {
	ctx   context.Context
	c     *apiclient.Client
	count atomic.Int64
}

func (cl *caller) run(id, verb string) <-chan outcome {
	ch := make(chan outcome, 1)
	go func() {
		start := time.Now()
		var err error
		switch verb {
		case "hibernate":
			err = cl.c.Hibernate(cl.ctx, id)
		case "wake":
			err = cl.c.Wake(cl.ctx, id)
		case "release":
			err = cl.c.Release(cl.ctx, id)
		}
		o := outcome{err: err, order: cl.count.Add(1), took: time.Since(start)}
		if sb, gerr := cl.c.Sandbox(cl.ctx, id); gerr == nil {
			o.state = sb.State
		}
		ch <- o
	}()
	return ch
}

// check fails the test unless the call succeeded and the sandbox was then
// in one of states (the first, or one a call queued behind it may already
// have moved it to).
func (o outcome) check(t *testing.T, what string, states ...string) {
	t.Helper()
	if o.err != nil {
		t.Errorf("%s: %v", what, o.err)
		return
	}
	if !slices.Contains(states, o.state) {
		t.Errorf("%s returned while the sandbox was %q, want %v", what, o.state, states)
	}
}

// awaitState polls until sandbox id is in state want (a transition in
// flight, to send the next call during it).
func awaitState(t *testing.T, ctx context.Context, c *apiclient.Client, id, want string) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if sb, err := c.Sandbox(ctx, id); err == nil && sb.State == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never %s", id, want)
		}
	}
}

// transitionTypes are the event types of a claim's hibernates, wakes and
// end, in log order.
func transitionTypes(t *testing.T, evs []apiclient.Event, id string) []string {
	var out []string
	for _, typ := range typesOf(t, evs, id) {
		if strings.Contains(typ, "hibernat") || strings.Contains(typ, "wake") || typ == "woken" || typ == "claim_released" {
			out = append(out, typ)
		}
	}
	return out
}

// TestHibernateWakeWaitEndToEnd is acceptance 2 of the old-daemon
// compatibility issue: against the built sandboxd with chsim taking 500 ms
// over every snapshot, hibernate and wake return only once the sandbox got
// there, as the old daemon's did, and calls on one sandbox queue in order:
// hibernate then wake back to back, a wake during a hibernate, two
// hibernates at once, a release during a hibernate (which then answers the
// old daemon's 404).
func TestHibernateWakeWaitEndToEnd(t *testing.T) {
	c := startChsimNode(t, "e2e-root-token", "env", "SBX_CHSIM_OP_LATENCY=vm.snapshot:"+snapshotLatency.String()).c
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	all := collect(t, c, apiclient.EventsOptions{From: 1})
	if _, err := c.SetPools(ctx, api.PoolsRequest{Pools: []api.PoolSpec{{Template: "e2e", Warm: 2}}}); err != nil {
		t.Fatalf("PUT pools: %v", err)
	}
	claim := func() string {
		t.Helper()
		cr, err := c.Claim(ctx, api.ClaimRequest{Template: "e2e"})
		if err != nil {
			t.Fatalf("claim: %v", err)
		}
		return cr.ID
	}
	cl := &caller{ctx: ctx, c: c}
	var ids []string

	// Back to back: each returns with its state reached.
	a := claim()
	ids = append(ids, a)
	h := <-cl.run(a, "hibernate")
	h.check(t, "hibernate", "hibernated")
	if h.took < snapshotLatency {
		t.Errorf("hibernate returned after %s, before chsim's %s snapshot", h.took, snapshotLatency)
	}
	(<-cl.run(a, "wake")).check(t, "wake right after", "running")

	// A wake during a hibernate waits for it, then wakes.
	b := claim()
	ids = append(ids, b)
	hb := cl.run(b, "hibernate")
	awaitState(t, ctx, c, b, "hibernating")
	wb := cl.run(b, "wake")
	ho, wo := <-hb, <-wb
	ho.check(t, "hibernate with a wake behind it", "hibernated", "waking", "running")
	wo.check(t, "wake during the hibernate", "running")
	if ho.order > wo.order {
		t.Errorf("the wake returned before the hibernate it queued behind")
	}

	// Two hibernates at once: both return once hibernated, one snapshot.
	d := claim()
	ids = append(ids, d)
	h1 := cl.run(d, "hibernate")
	awaitState(t, ctx, c, d, "hibernating")
	h2 := cl.run(d, "hibernate")
	(<-h1).check(t, "first of two hibernates", "hibernated")
	(<-h2).check(t, "second of two hibernates", "hibernated")

	// A release during a hibernate ends the claim at once; the hibernate
	// then says it ended (410 was released; the old daemon answered 404
	// unknown sandbox, and its clients fail the call on either).
	e := claim()
	ids = append(ids, e)
	he := cl.run(e, "hibernate")
	awaitState(t, ctx, c, e, "hibernating")
	(<-cl.run(e, "release")).check(t, "release during a hibernate", "released")
	if o := <-he; apiclient.StatusOf(o.err) != 410 || !strings.Contains(o.err.Error(), "was released") || o.state != "released" {
		t.Errorf("hibernate overtaken by a release: %v (then %q), want 410 was released", o.err, o.state)
	}

	for _, id := range ids[:3] {
		if err := c.Release(ctx, id); err != nil {
			t.Fatalf("release %s: %v", id, err)
		}
	}
	evs := all.waitFor(t, "every claim released", func(evs []apiclient.Event) bool {
		for _, id := range ids {
			if !hasEvent(t, evs, "claim_released", id) {
				return false
			}
		}
		return true
	})
	for _, tc := range []struct {
		what, id string
		want     []string
	}{
		{"back to back", a, []string{"hibernate_requested", "hibernated", "wake_requested", "woken", "claim_released"}},
		{"wake during a hibernate", b, []string{"hibernate_requested", "hibernated", "wake_requested", "woken", "claim_released"}},
		{"two hibernates", d, []string{"hibernate_requested", "hibernated", "claim_released"}},
		{"release during a hibernate", e, []string{"hibernate_requested", "claim_released"}},
	} {
		if got := transitionTypes(t, evs, tc.id); !slices.Equal(got[:min(len(got), len(tc.want))], tc.want) {
			t.Errorf("%s: events %v, want %v", tc.what, got, tc.want)
		}
	}
}
