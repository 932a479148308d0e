package api_test

// Acknowledgements only for what is durable: a duplicate release, hibernate
// or wake that finds the change already applied, while the first request's
// fsync is still in flight, must not answer before that change is durable;
// a renew answers its own deadline, not a concurrent one's. The op log's
// syncs are held (eventlogtest.SyncGateFS over pebble's crashable MemFS);
// the moment a duplicate is answered a crash image of the filesystem is
// taken, as a SIGKILL right then would leave it, and the change it
// acknowledged must be in that image.

import (
	"encoding/json"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/sbxlog/sbxlog/cmd/sandboxd/node"
	"github.com/sbxlog/sbxlog/cmd/sandboxd/node/nodetest"
	"github.com/sbxlog/sbxlog/eventlog"
	"github.com/sbxlog/sbxlog/eventlog/eventlogtest"
	"github.com/sbxlog/sbxlog/fsm"
	"github.com/sbxlog/sbxlog/fsm/engine"
)

// gatedNode is a node whose op log lives on a crashable MemFS with
// holdable syncs.
type gatedNode struct {
	*nodetest.Node
	mem    *vfs.MemFS
	gate   *eventlogtest.SyncGateFS
	logDir string
}

func newGatedNode(t *testing.T) *gatedNode {
	t.Helper()
	g := &gatedNode{mem: vfs.NewCrashableMem()}
	g.gate = eventlogtest.NewSyncGateFS(g.mem)
	g.Node = newNode(t, 2, func(o *nodetest.Options) {
		g.logDir = filepath.Join(o.Dir, "log")
		o.Tune = func(c *node.Config) { c.LogFS = g.gate }
	})
	return g
}

// crashImage rebuilds the state a SIGKILL at this moment would leave: only
// what was synced.
func (g *gatedNode) crashImage(t *testing.T) *fsm.State {
	t.Helper()
	img := g.mem.CrashClone(vfs.CrashCloneCfg{})
	l, err := eventlog.Open(g.logDir, eventlog.Options{NodeID: "n1", FS: img})
	if err != nil {
		t.Fatalf("open crash image: %v", err)
	}
	defer l.Close()
	res, err := engine.Rebuild(l, engine.RebuildOptions{})
	if err != nil {
		t.Fatalf("rebuild crash image: %v", err)
	}
	return res.State
}

func (g *gatedNode) status(id string) fsm.ClaimStatus {
	var st fsm.ClaimStatus
	g.Engine.View(func(s *fsm.State) {
		if c, ok := s.Claim(id); ok {
			st = c.Status
		}
	})
	return st
}

// await polls cond until it holds (the state changes on commits of other
// goroutines; there is no event to wait on from here).
func await(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

type answer struct {
	code int
	body []byte
}

func post(t *testing.T, base, path, body string) <-chan answer {
	ch := make(chan answer, 1)
	go func() {
		code, b := doRoot(t, base, "POST", path, body)
		ch <- answer{code, b}
	}()
	return ch
}

func claimOne(t *testing.T, g *gatedNode) string {
	t.Helper()
	code, b := doRoot(t, g.URL, "POST", "/v1/claim", `{"template":"default"}`)
	if code != http.StatusOK {
		t.Fatalf("claim: %d %s", code, b)
	}
	var c struct{ ID string }
	if err := json.Unmarshal(b, &c); err != nil {
		t.Fatal(err)
	}
	return c.ID
}

func TestDuplicateAnswerWaitsForDurability(t *testing.T) {
	for _, tc := range []struct {
		verb string
		// setup brings the claim to the state the verb starts from.
		setup func(t *testing.T, g *gatedNode, id string)
		// applied: the first request's change is in the (live) state.
		applied func(fsm.ClaimStatus) bool
		// kept: the change is in a recovered state.
		kept func(fsm.ClaimStatus) bool
	}{
		{"release", nil,
			func(s fsm.ClaimStatus) bool { return !s.Live() },
			func(s fsm.ClaimStatus) bool { return !s.Live() }},
		{"hibernate", nil,
			func(s fsm.ClaimStatus) bool { return s == fsm.ClaimHibernating || s == fsm.ClaimHibernated },
			func(s fsm.ClaimStatus) bool { return s == fsm.ClaimHibernating || s == fsm.ClaimHibernated }},
		{"wake", func(t *testing.T, g *gatedNode, id string) {
			if code, b := doRoot(t, g.URL, "POST", "/v1/sandboxes/"+id+"/hibernate", ""); code != http.StatusNoContent {
				t.Fatalf("hibernate: %d %s", code, b)
			}
			await(t, "hibernated", func() bool { return g.status(id) == fsm.ClaimHibernated })
		},
			func(s fsm.ClaimStatus) bool { return s == fsm.ClaimWaking || s == fsm.ClaimRunning },
			func(s fsm.ClaimStatus) bool { return s == fsm.ClaimWaking || s == fsm.ClaimRunning }},
	} {
		t.Run(tc.verb, func(t *testing.T) {
			g := newGatedNode(t)
			id := claimOne(t, g)
			if tc.setup != nil {
				tc.setup(t, g, id)
			}
			settle(t, g.Node)
			release := g.gate.Arm()
			t.Cleanup(release)
			path := "/v1/sandboxes/" + id + "/" + tc.verb
			first := post(t, g.URL, path, "")
			await(t, "the first "+tc.verb+" applied", func() bool { return tc.applied(g.status(id)) })
			dup := post(t, g.URL, path, "")
			var got answer
			select {
			case got = <-dup:
				// Answered while the first request's fsync is held: a
				// crash now must keep what it acknowledged.
				if got.code == http.StatusNoContent {
					img := g.crashImage(t)
					c, _ := img.Claim(id)
					if !tc.kept(c.Status) {
						t.Fatalf("duplicate %s acknowledged (204) while the change was not durable: after a crash the sandbox is %s", tc.verb, c.Status)
					}
				}
			case <-time.After(300 * time.Millisecond):
				// Waiting for the durable change, as it must.
				release()
				got = <-dup
				img := g.crashImage(t)
				if c, _ := img.Claim(id); !tc.kept(c.Status) {
					t.Fatalf("after the duplicate's 204 a crash leaves the sandbox %s", c.Status)
				}
			}
			release()
			if got.code != http.StatusNoContent {
				t.Fatalf("duplicate %s: %d %s", tc.verb, got.code, got.body)
			}
			if a := <-first; a.code != http.StatusNoContent {
				t.Fatalf("first %s: %d %s", tc.verb, a.code, a.body)
			}
		})
	}
}

// TestRenewAnswersItsOwnDeadline: a renew applied before a concurrent one
// answers the deadline it set, not the later renew's (both still in their
// fsync when the first reads its answer).
func TestRenewAnswersItsOwnDeadline(t *testing.T) {
	g := newGatedNode(t)
	id := claimOne(t, g)
	settle(t, g.Node)
	deadline := func() int64 {
		var d int64
		g.Engine.View(func(s *fsm.State) {
			c, _ := s.Claim(id)
			d = c.Deadline
		})
		return d
	}
	release := g.gate.Arm()
	t.Cleanup(release)
	before := time.Now()
	short := post(t, g.URL, "/v1/sandboxes/"+id+"/renew", `{"ttl_seconds":100}`)
	await(t, "the 100 s renew applied", func() bool { return deadline() < before.Add(200*time.Second).UnixNano() })
	long := post(t, g.URL, "/v1/sandboxes/"+id+"/renew", `{"ttl_seconds":3000}`)
	await(t, "the 3000 s renew applied", func() bool { return deadline() > before.Add(2000*time.Second).UnixNano() })
	release()
	for _, tc := range []struct {
		name string
		ch   <-chan answer
		ttl  time.Duration
	}{{"100 s renew", short, 100 * time.Second}, {"3000 s renew", long, 3000 * time.Second}} {
		a := <-tc.ch
		if a.code != http.StatusOK {
			t.Fatalf("%s: %d %s", tc.name, a.code, a.body)
		}
		var r struct{ Deadline time.Time }
		if err := json.Unmarshal(a.body, &r); err != nil {
			t.Fatal(err)
		}
		if d := r.Deadline.Sub(before); d < tc.ttl-5*time.Second || d > tc.ttl+5*time.Second {
			t.Fatalf("%s answered a deadline %s after the request, want about %s", tc.name, d.Round(time.Second), tc.ttl)
		}
	}
}
