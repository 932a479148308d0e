package api_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sbxlog/sbxlog/cmd/sandboxd/node/nodetest"
	"github.com/sbxlog/sbxlog/eventlog/event"
	"github.com/sbxlog/sbxlog/fsm"
)

// reply is one answer of a call sent in the background: its status and
// body, the sandbox's status in the node's state the moment it arrived, and
// its place among the answers of the test.
type reply struct {
	code   int
	body   []byte
	status fsm.ClaimStatus
	order  int64
	err    error
}

// sender sends calls in the background and numbers their answers.
type sender struct {
	n     *nodetest.Node
	count atomic.Int64
}

// send posts verb on sandbox id as root with the extra headers; the reply
// arrives on the channel.
func (s *sender) send(id, verb string, header ...string) <-chan reply {
	ch := make(chan reply, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, "POST", s.n.URL+"/v1/sandboxes/"+id+"/"+verb, nil)
		if err != nil {
			ch <- reply{err: err}
			return
		}
		req.Header.Set("Authorization", "Bearer "+rootTok)
		for i := 0; i+1 < len(header); i += 2 {
			req.Header.Set(header[i], header[i+1])
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			ch <- reply{err: err}
			return
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		ch <- reply{code: resp.StatusCode, body: b, status: statusOf(s.n, id), order: s.count.Add(1), err: err}
	}()
	return ch
}

func get(t *testing.T, what string, ch <-chan reply) reply {
	t.Helper()
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatalf("%s: %v", what, r.err)
		}
		return r
	case <-time.After(30 * time.Second):
		t.Fatalf("%s: no answer in 30 s", what)
	}
	return reply{}
}

// want checks a reply's status, body (exactly, when wantBody is set) and
// the sandbox's status when it arrived: the first of statuses, or one of
// the others, which can only follow it (a call queued behind this one may
// have started by the time the answer is read).
func (r reply) want(t *testing.T, what string, code int, wantBody string, statuses ...fsm.ClaimStatus) {
	t.Helper()
	if r.code != code || (wantBody != "" && strings.TrimSpace(string(r.body)) != wantBody) {
		t.Errorf("%s: %d %s, want %d %s", what, r.code, r.body, code, wantBody)
	}
	if !slices.Contains(statuses, r.status) {
		t.Errorf("%s: answered while the sandbox was %s, want %v", what, r.status, statuses)
	}
}

// transitionsOf returns the types of claim id's hibernate, wake and release
// events in the log, in order.
func transitionsOf(t *testing.T, n *nodetest.Node, id string) []string {
	t.Helper()
	sub, err := n.Log.Subscribe(1)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	var out []string
	for last := n.Log.LastSeq(); ; {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		ev, err := sub.Next(ctx)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		if ev.AggID == id {
			switch ev.Type {
			case event.TypeHibernateRequested, event.TypeHibernated, event.TypeHibernateFailed,
				event.TypeWakeRequested, event.TypeWoken, event.TypeWakeFailed, event.TypeClaimReleased:
				out = append(out, ev.Type.String())
			}
		}
		if ev.Seq >= last {
			return out
		}
	}
}

const slow = 400 * time.Millisecond

// TestHibernateAndWakeWait: hibernate answers 204 once the sandbox is
// hibernated, wake once it runs again, with the fake taking its time over
// each; back to back, the wake finds the hibernate done.
func TestHibernateAndWakeWait(t *testing.T) {
	n := newNode(t, 2, nil)
	n.Driver.SetDelay(fsm.KindHibernate, slow)
	n.Driver.SetDelay(fsm.KindWake, slow)
	s := &sender{n: n}
	sb := claimAs(t, n, tokA, "")
	start := time.Now()
	get(t, "hibernate", s.send(sb.ID, "hibernate")).want(t, "hibernate", http.StatusNoContent, "", fsm.ClaimHibernated)
	if took := time.Since(start); took < slow {
		t.Errorf("hibernate answered after %s, before the fake's %s snapshot", took, slow)
	}
	get(t, "wake", s.send(sb.ID, "wake")).want(t, "wake", http.StatusNoContent, "", fsm.ClaimRunning)
	// Done already: answered at once.
	get(t, "wake of a running sandbox", s.send(sb.ID, "wake")).want(t, "wake again", http.StatusNoContent, "", fsm.ClaimRunning)
	if c := n.Driver.Calls(); c[fsm.KindHibernate] != 1 || c[fsm.KindWake] != 1 {
		t.Errorf("fake calls %v, want one hibernate and one wake", c)
	}
}

// TestTransitionsQueue: calls on one sandbox that overlap run one after
// the other, in arrival order, each answered once its own outcome is
// reached: a wake during a hibernate, a hibernate during a wake, two
// hibernates at once.
func TestTransitionsQueue(t *testing.T) {
	for _, tc := range []struct {
		name string
		// setup brings the sandbox to where the first call starts.
		setup         func(t *testing.T, n *nodetest.Node, id string)
		first, second string
		during        fsm.ClaimStatus // the first call's transition in flight
		// afterFirst: the status the first answer must find (or, since
		// the second call may have started by then, what follows it).
		afterFirst  []fsm.ClaimStatus
		afterSecond fsm.ClaimStatus
		// ordered: the second call has work left after the first's
		// answer, so the answers arrive in order.
		ordered    bool
		events     []string
		hibernates int64
	}{
		{"wake during a hibernate", nil, "hibernate", "wake", fsm.ClaimHibernating,
			[]fsm.ClaimStatus{fsm.ClaimHibernated, fsm.ClaimWaking, fsm.ClaimRunning}, fsm.ClaimRunning, true,
			[]string{"hibernate_requested", "hibernated", "wake_requested", "woken"}, 1},
		{"hibernate during a wake", func(t *testing.T, n *nodetest.Node, id string) {
			if st, b := call(t, n, "POST", "/v1/sandboxes/"+id+"/hibernate", rootTok, nil); st != http.StatusNoContent {
				t.Fatalf("hibernate: %d %s", st, b)
			}
		}, "wake", "hibernate", fsm.ClaimWaking,
			[]fsm.ClaimStatus{fsm.ClaimRunning, fsm.ClaimHibernating, fsm.ClaimHibernated}, fsm.ClaimHibernated, true,
			[]string{"hibernate_requested", "hibernated", "wake_requested", "woken", "hibernate_requested", "hibernated"}, 2},
		{"two hibernates", nil, "hibernate", "hibernate", fsm.ClaimHibernating,
			[]fsm.ClaimStatus{fsm.ClaimHibernated}, fsm.ClaimHibernated, false,
			[]string{"hibernate_requested", "hibernated"}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := newNode(t, 2, nil)
			sb := claimAs(t, n, tokA, "")
			if tc.setup != nil {
				tc.setup(t, n, sb.ID)
			}
			n.Driver.SetDelay(fsm.KindHibernate, slow)
			n.Driver.SetDelay(fsm.KindWake, slow)
			s := &sender{n: n}
			first := s.send(sb.ID, tc.first)
			await(t, tc.first+" in flight", func() bool { return statusOf(n, sb.ID) == tc.during })
			second := s.send(sb.ID, tc.second)
			r1, r2 := get(t, "first "+tc.first, first), get(t, "second "+tc.second, second)
			r1.want(t, "first "+tc.first, http.StatusNoContent, "", tc.afterFirst...)
			r2.want(t, "second "+tc.second, http.StatusNoContent, "", tc.afterSecond)
			if tc.ordered && (r1.order != 1 || r2.order != 2) {
				t.Errorf("answers out of order: the first call's came %d, the second's %d", r1.order, r2.order)
			}
			if got := transitionsOf(t, n, sb.ID); strings.Join(got, " ") != strings.Join(tc.events, " ") {
				t.Errorf("events %v, want %v", got, tc.events)
			}
			if got := n.Driver.Calls()[fsm.KindHibernate]; got != tc.hibernates {
				t.Errorf("%d hibernates ran, want %d", got, tc.hibernates)
			}
		})
	}
}

// TestHibernateThenRelease: a release does not queue behind a hibernate in
// flight; the hibernate then answers 410 (the claim was released), once
// the claim ended, and so does a wake queued behind it. (The release's 204 and the
// hibernate's 404 follow the same commit, so their order is not fixed.)
func TestHibernateThenRelease(t *testing.T) {
	n := newNode(t, 2, nil)
	sb := claimAs(t, n, tokA, "")
	n.Driver.SetDelay(fsm.KindHibernate, 2*slow)
	s := &sender{n: n}
	hib := s.send(sb.ID, "hibernate")
	await(t, "hibernating", func() bool { return statusOf(n, sb.ID) == fsm.ClaimHibernating })
	wake := s.send(sb.ID, "wake")
	rel := get(t, "release", s.send(sb.ID, "release"))
	rel.want(t, "release", http.StatusNoContent, "", fsm.ClaimReleased)
	rh, rw := get(t, "hibernate", hib), get(t, "wake", wake)
	rh.want(t, "hibernate", http.StatusGone, goneBody(t, n, sb.ID), fsm.ClaimReleased)
	rw.want(t, "queued wake", http.StatusGone, goneBody(t, n, sb.ID), fsm.ClaimReleased)
	if got := n.Driver.Calls()[fsm.KindWake]; got != 0 {
		t.Errorf("%d wakes ran after the release", got)
	}
}

// TestTransitionFailures: a snapshot or restore that fails is the old
// daemon's 500 "<verb> failed", here with the reason and the id, answered
// once the state machine rolled back (running, hibernated).
func TestTransitionFailures(t *testing.T) {
	n := newNode(t, 2, nil)
	sb := claimAs(t, n, tokA, "")
	s := &sender{n: n}
	n.Driver.FailHibernates.Store(true)
	r := get(t, "hibernate", s.send(sb.ID, "hibernate"))
	checkFailure(t, r, "hibernate failed: ", sb.ID, fsm.ClaimRunning)
	n.Driver.FailHibernates.Store(false)
	get(t, "hibernate", s.send(sb.ID, "hibernate")).want(t, "hibernate after the failure", http.StatusNoContent, "", fsm.ClaimHibernated)
	n.Driver.FailWakes.Store(true)
	r = get(t, "wake", s.send(sb.ID, "wake"))
	checkFailure(t, r, "wake failed: ", sb.ID, fsm.ClaimHibernated)
	n.Driver.FailWakes.Store(false)
	get(t, "wake", s.send(sb.ID, "wake")).want(t, "wake after the failure", http.StatusNoContent, "", fsm.ClaimRunning)
}

func checkFailure(t *testing.T, r reply, prefix, id string, status fsm.ClaimStatus) {
	t.Helper()
	var e struct{ Error, ID string }
	if r.code != http.StatusInternalServerError || json.Unmarshal(r.body, &e) != nil ||
		!strings.HasPrefix(e.Error, prefix) || !strings.Contains(e.Error, nodetest.ErrFakeFailure) || e.ID != id {
		t.Errorf("%d %s, want 500 {\"error\": %q + the fake's reason, \"id\": %q}", r.code, r.body, prefix, id)
	}
	if r.status != status {
		t.Errorf("failure answered while the sandbox was %s, want %s", r.status, status)
	}
}

// TestTransitionWaitBound: past Config.LifecycleWait the answer is 503
// with the id, saying the operation continues; it does.
func TestTransitionWaitBound(t *testing.T) {
	n := newNode(t, 2, func(o *nodetest.Options) { o.Config.LifecycleWait = 100 * time.Millisecond })
	sb := claimAs(t, n, tokA, "")
	n.Driver.SetDelay(fsm.KindHibernate, 3*slow)
	s := &sender{n: n}
	r := get(t, "hibernate", s.send(sb.ID, "hibernate"))
	var e struct{ Error, ID string }
	if r.code != http.StatusServiceUnavailable || json.Unmarshal(r.body, &e) != nil || e.ID != sb.ID ||
		!strings.Contains(e.Error, "continues") || !strings.Contains(e.Error, sb.ID) {
		t.Fatalf("hibernate past the bound: %d %s, want 503 naming the sandbox, saying it continues", r.code, r.body)
	}
	await(t, "the hibernate finishing", func() bool { return statusOf(n, sb.ID) == fsm.ClaimHibernated })
}

// TestTransitionRespondAsync: "Prefer: respond-async" and "?wait=false" are
// answered once the request is durable, 202 with the state then, without
// queueing: a wake during that hibernate is then the state's 409.
func TestTransitionRespondAsync(t *testing.T) {
	n := newNode(t, 2, nil)
	sb := claimAs(t, n, tokA, "")
	n.Driver.SetDelay(fsm.KindHibernate, slow)
	n.Driver.SetDelay(fsm.KindWake, slow)
	st, hdr, b := do(t, n, "POST", "/v1/sandboxes/"+sb.ID+"/hibernate", "Bearer "+sb.Token, nil, "Prefer", "respond-async, wait=5")
	if st != http.StatusAccepted || strings.TrimSpace(string(b)) != `{"id":"`+sb.ID+`","state":"hibernating"}` || hdr.Get("Preference-Applied") != "respond-async" {
		t.Fatalf("hibernate, respond-async: %d %s (Preference-Applied %q)", st, b, hdr.Get("Preference-Applied"))
	}
	if st, _, b := do(t, n, "POST", "/v1/sandboxes/"+sb.ID+"/wake?wait=false", "Bearer "+sb.Token, nil); st != http.StatusConflict {
		t.Fatalf("wake during the hibernate, not waiting: %d %s, want 409", st, b)
	}
	await(t, "hibernated", func() bool { return statusOf(n, sb.ID) == fsm.ClaimHibernated })
	st, hdr, b = do(t, n, "POST", "/v1/sandboxes/"+sb.ID+"/wake?wait=false", "Bearer "+sb.Token, nil)
	if st != http.StatusAccepted || strings.TrimSpace(string(b)) != `{"id":"`+sb.ID+`","state":"waking"}` || hdr.Get("Preference-Applied") != "" {
		t.Fatalf("wake?wait=false: %d %s", st, b)
	}
	if st, _, b := do(t, n, "POST", "/v1/sandboxes/"+sb.ID+"/wake?wait=soon", "Bearer "+sb.Token, nil); st != http.StatusBadRequest {
		t.Fatalf("wake?wait=soon: %d %s, want 400", st, b)
	}
	// wait=true is the default: it waits.
	r := get(t, "wake?wait=true", (&sender{n: n}).send(sb.ID, "wake?wait=true"))
	r.want(t, "wake?wait=true", http.StatusNoContent, "", fsm.ClaimRunning)
}
