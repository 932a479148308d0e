package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sbxlog/sbxlog/cmd/sandboxd/node/nodetest"
	"github.com/sbxlog/sbxlog/fsm"
	"github.com/sbxlog/sbxlog/fsm/engine"
	"github.com/sbxlog/sbxlog/projections/api"
)

// unconfirmed is an engine whose writes commit but cannot be confirmed, as
// sandboxd's synchronous replication without its JetStream ack.
type unconfirmed struct{ eng *engine.Engine }

var _ api.Engine = unconfirmed{}

func (u unconfirmed) View(fn func(st *fsm.State)) { u.eng.View(fn) }

func (u unconfirmed) ProposeNew(ctx context.Context, build func(fsm.Meta) fsm.Command, hooks engine.Hooks) (engine.Result, error) {
	res, err := u.eng.ProposeNew(ctx, build, engine.Hooks{Prepare: hooks.Prepare})
	if err != nil || len(res.Events) == 0 {
		return res, err
	}
	return res, fmt.Errorf("%w: event %d not acknowledged", api.ErrUnavailable, res.Events[len(res.Events)-1].Seq)
}

// serveOver puts a second server over n's engine, log and tokens.
func serveOver(t *testing.T, n *nodetest.Node, eng api.Engine, opts api.Options) *httptest.Server {
	t.Helper()
	srv := api.New(api.Config{Node: "n1", OwnerAddr: "127.0.0.1:1"}, eng, n.Log, n.Auth, opts)
	srv.SetReady()
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	return hs
}

func doRoot(t *testing.T, base, method, path, body string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, base+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+rootTok)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, b
}

// GET /v1/info carries Options.Replication's value as "replication", and
// nothing when it is unset.
func TestInfoReplication(t *testing.T) {
	n := newNode(t, 0, func(o *nodetest.Options) { o.NoExecutors = true })
	type repl struct {
		URL        string `json:"url"`
		Replicated uint64 `json:"replicated"`
	}
	with := serveOver(t, n, n.Engine, api.Options{Replication: func() any { return repl{URL: "nats://x:1", Replicated: n.Log.LastSeq()} }})
	without := serveOver(t, n, n.Engine, api.Options{})
	for _, c := range []struct {
		name string
		base string
		want *repl
	}{
		{"with", with.URL, &repl{URL: "nats://x:1", Replicated: n.Log.LastSeq()}},
		{"without", without.URL, nil},
	} {
		st, b := doRoot(t, c.base, "GET", "/v1/info", "")
		var got struct {
			Replication *repl `json:"replication"`
		}
		if st != http.StatusOK || json.Unmarshal(b, &got) != nil {
			t.Fatalf("%s: %d %s", c.name, st, b)
		}
		if (got.Replication == nil) != (c.want == nil) || (c.want != nil && *got.Replication != *c.want) {
			t.Errorf("%s: replication %+v, want %+v (%s)", c.name, got.Replication, c.want, b)
		}
	}
}

// Only root sees the replication status: it names the NATS server, whose
// stream holds every tenant's events. A tenant is refused GET /v1/info
// altogether (the old daemon's 403).
func TestInfoReplicationRootOnly(t *testing.T) {
	n := newNode(t, 0, func(o *nodetest.Options) { o.NoExecutors = true })
	hs := serveOver(t, n, n.Engine, api.Options{Replication: func() any { return map[string]string{"url": "nats://127.0.0.1:8777"} }})
	for _, c := range []struct {
		name, token string
		shown       bool
		status      int
	}{
		{"root", rootTok, true, http.StatusOK},
		{"tenant", tokA, false, http.StatusForbidden},
	} {
		req, err := http.NewRequest("GET", hs.URL+"/v1/info", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+c.token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != c.status {
			t.Fatalf("%s: %d %s, want %d", c.name, resp.StatusCode, b, c.status)
		}
		if got := strings.Contains(string(b), "nats://"); got != c.shown {
			t.Errorf("%s: replication URL shown %v, want %v: %s", c.name, got, c.shown, b)
		}
	}
}

// A write whose engine says ErrUnavailable answers 503 with the reason, on
// every writing route, although the change is committed.
func TestUnavailableWriteIs503(t *testing.T) {
	n := newNode(t, 1, nil)
	hs := serveOver(t, n, unconfirmed{eng: n.Engine}, api.Options{})
	st, b := doRoot(t, n.URL, "POST", "/v1/claim", `{"template":"default"}`)
	var cl api.ClaimResponse
	if st != http.StatusOK || json.Unmarshal(b, &cl) != nil {
		t.Fatalf("claim on the plain server: %d %s", st, b)
	}
	for _, r := range []struct{ method, path, body string }{
		{"POST", "/v1/claim", `{"template":"default"}`},
		{"POST", "/v1/sandboxes/" + cl.ID + "/renew", `{"ttl_seconds":60}`},
		{"POST", "/v1/sandboxes/" + cl.ID + "/release", ""},
	} {
		before := n.Log.LastSeq()
		st, b := doRoot(t, hs.URL, r.method, r.path, r.body)
		var e struct{ Error, ID string }
		if st != http.StatusServiceUnavailable || json.Unmarshal(b, &e) != nil || !strings.Contains(e.Error, "not acknowledged") {
			t.Errorf("%s %s: %d %s, want 503 naming the reason", r.method, r.path, st, b)
		}
		if r.path == "/v1/claim" {
			// The claim exists: the 503 names it, so the client can find
			// or release it.
			if st, got := doRoot(t, n.URL, "GET", "/v1/sandboxes/"+e.ID, ""); e.ID == "" || st != http.StatusOK {
				t.Errorf("claim 503 names sandbox %q; GET it: %d %s", e.ID, st, got)
			}
		}
		if n.Log.LastSeq() == before {
			t.Errorf("%s %s: nothing committed", r.method, r.path)
		}
	}
}

// confirmed is an engine that confirms more than local durability, as
// sandboxd's synchronous replication does: Durable runs only after its own
// confirmation, once ProposeNew of the local engine returned.
type confirmed struct {
	eng       *engine.Engine
	confirmed *atomic.Int32
}

var _ api.Engine = confirmed{}

func (c confirmed) View(fn func(st *fsm.State)) { c.eng.View(fn) }

func (c confirmed) ProposeNew(ctx context.Context, build func(fsm.Meta) fsm.Command, hooks engine.Hooks) (engine.Result, error) {
	res, err := c.eng.ProposeNew(ctx, build, engine.Hooks{Prepare: hooks.Prepare})
	if err != nil {
		return res, err
	}
	c.confirmed.Add(1)
	if hooks.Durable != nil {
		hooks.Durable()
	}
	return res, nil
}

// Behind an engine that confirms, a warm claim is answered once, from
// Durable after the confirmation: one well-formed reply (a second write
// would corrupt the body).
func TestWarmClaimAnsweredAfterConfirmation(t *testing.T) {
	n := newNode(t, 1, nil)
	var count atomic.Int32
	hs := serveOver(t, n, confirmed{eng: n.Engine, confirmed: &count}, api.Options{})
	st, b := doRoot(t, hs.URL, "POST", "/v1/claim", `{"template":"default"}`)
	var cl api.ClaimResponse
	if st != http.StatusOK || json.Unmarshal(b, &cl) != nil || cl.ID == "" || cl.Tier != "warm" || cl.Token == "" {
		t.Fatalf("claim: %d %s, want a warm claim's reply", st, b)
	}
	if count.Load() != 1 {
		t.Fatalf("%d confirmations, want 1", count.Load())
	}
}

// lingering is an engine that reports a committed OpenRelay as the local
// engine does when its caller's context ends during the fsync: the events
// with the context's error. It waits (bounded) for that context to end
// after committing, and signals committed.
type lingering struct {
	eng       *engine.Engine
	committed chan struct{}
}

var _ api.Engine = lingering{}

func (l lingering) View(fn func(st *fsm.State)) { l.eng.View(fn) }

func (l lingering) ProposeNew(ctx context.Context, build func(fsm.Meta) fsm.Command, hooks engine.Hooks) (engine.Result, error) {
	res, err := l.eng.ProposeNew(ctx, build, hooks)
	if _, open := build(fsm.Meta{}).(fsm.OpenRelay); err != nil || !open {
		return res, err
	}
	close(l.committed)
	select {
	case <-ctx.Done():
		return res, ctx.Err()
	case <-time.After(time.Second):
		return res, nil
	}
}

// A relay whose opening committed although its proposal answered an
// error (sync replication that did not acknowledge, a client that left
// during the fsync) is recorded closed: no open relay holds the sandbox's
// idle clock with no connection behind it.
func TestRelayOpenErrorAfterCommitIsClosed(t *testing.T) {
	for _, tc := range []struct {
		name   string
		eng    func(n *nodetest.Node) (api.Engine, chan struct{})
		cancel bool
	}{
		{"unacknowledged", func(n *nodetest.Node) (api.Engine, chan struct{}) { return unconfirmed{eng: n.Engine}, nil }, false},
		{"client left during the commit", func(n *nodetest.Node) (api.Engine, chan struct{}) {
			l := lingering{eng: n.Engine, committed: make(chan struct{})}
			return l, l.committed
		}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := newNode(t, 1, nil)
			c := claimAs(t, n, rootTok, "")
			eng, committed := tc.eng(n)
			hs := serveOver(t, n, eng, api.Options{DataPlane: api.DataPlane{Dialer: n.Driver}})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if committed != nil {
				go func() {
					<-committed
					cancel()
				}()
			}
			req, err := http.NewRequestWithContext(ctx, "POST", hs.URL+"/v1/sandboxes/"+c.ID+"/exec", strings.NewReader(`{"argv":["sleep","30"]}`))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Authorization", "Bearer "+c.Token)
			if resp, err := http.DefaultClient.Do(req); err == nil {
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if !tc.cancel && resp.StatusCode != http.StatusServiceUnavailable {
					t.Fatalf("exec: %d %s, want 503", resp.StatusCode, b)
				}
			}
			if got := relayEvents(t, n, c.ID); len(got) == 0 || got[0] != "relay_opened exec" {
				t.Fatalf("relay events %v, want the exec relay opened", got)
			}
			waitRelays(t, n, c.ID, 0)
		})
	}
}

// panicking is an engine whose next proposal of a command of type T
// panics (once armed), as a bug in a handler's path would.
type panicking[T fsm.Command] struct {
	eng   *engine.Engine
	armed *atomic.Bool
}

func (p panicking[T]) View(fn func(st *fsm.State)) { p.eng.View(fn) }

func (p panicking[T]) ProposeNew(ctx context.Context, build func(fsm.Meta) fsm.Command, hooks engine.Hooks) (engine.Result, error) {
	if _, ok := build(fsm.Meta{}).(T); ok && p.armed.CompareAndSwap(true, false) {
		panic("panicking: a bug")
	}
	return p.eng.ProposeNew(ctx, build, hooks)
}

// postStatus posts body to url with token: the answer's status, 0 when
// there is none (the connection closed).
func postStatus(url, token, body string) int {
	req, err := http.NewRequest("POST", url, strings.NewReader(body))
	if err != nil {
		return -1
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// A hibernate or wake that panics while it holds its sandbox's queue
// leaves it: the next call of that sandbox runs instead of waiting out
// the lifecycle bound behind it.
func TestQueuePanicLeaves(t *testing.T) {
	n := newNode(t, 2, nil)
	for _, tc := range []struct {
		name string
		eng  func(armed *atomic.Bool) api.Engine
		call func(t *testing.T, base string, c api.ClaimResponse) int
	}{
		{"hibernate", func(armed *atomic.Bool) api.Engine { return panicking[fsm.Hibernate]{eng: n.Engine, armed: armed} },
			func(t *testing.T, base string, c api.ClaimResponse) int {
				return postStatus(base+"/v1/sandboxes/"+c.ID+"/hibernate", c.Token, "")
			}},
		{"a relay's wake", func(armed *atomic.Bool) api.Engine { return panicking[fsm.Wake]{eng: n.Engine, armed: armed} },
			func(t *testing.T, base string, c api.ClaimResponse) int {
				hibernateNow(t, n, c.ID, c.Token)
				return postStatus(base+"/v1/sandboxes/"+c.ID+"/exec", c.Token, `{"argv":["true"]}`)
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := claimAs(t, n, rootTok, "")
			var armed atomic.Bool
			armed.Store(true)
			srv := api.New(api.Config{Node: "n1", OwnerAddr: "127.0.0.1:1", LifecycleWait: 5 * time.Second},
				tc.eng(&armed), n.Log, n.Auth, api.Options{DataPlane: api.DataPlane{Dialer: n.Driver}})
			srv.SetReady()
			hs := httptest.NewUnstartedServer(srv)
			hs.Config.ErrorLog = log.New(io.Discard, "", 0) // the panic's trace
			hs.Start()
			t.Cleanup(hs.Close)
			// The second server sees the commits too (its waits watch them).
			n.Engine.SetOnCommit(func(c engine.Commit) {
				n.Server.OnCommit(c.Events)
				srv.OnCommit(c.Events)
				if len(c.Intents) > 0 {
					n.Executors.Offer(c.Intents)
				}
			})
			if st := tc.call(t, hs.URL, c); st != 0 {
				t.Fatalf("the panicking call answered %d", st)
			}
			began := time.Now()
			if st := tc.call(t, hs.URL, c); st/100 != 2 {
				t.Fatalf("the next call: %d after %s, want 2xx", st, time.Since(began))
			}
		})
	}
}
