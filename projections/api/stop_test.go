package api_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/sbxlog/sbxlog/cmd/sandboxd/node/nodetest"
	"github.com/sbxlog/sbxlog/fsm"
)

// Stopping the node answers the requests waiting on an outcome 503 at
// once, instead of letting them hold http.Server.Shutdown (and with it the
// executors' stop) until its bound.
func TestStopAnswersWaitingRequests(t *testing.T) {
	for _, tc := range []struct {
		name string
		node func(t *testing.T) *nodetest.Node
		// send starts the waiting request; its status arrives on the
		// channel. inFlight reports once it waits.
		send func(t *testing.T, n *nodetest.Node) (<-chan int, func() bool)
	}{
		{"a hibernate waiting for its outcome", func(t *testing.T) *nodetest.Node { return newNode(t, 1, nil) },
			func(t *testing.T, n *nodetest.Node) (<-chan int, func() bool) {
				c := claimAs(t, n, tokA, "")
				n.Driver.SetDelay(fsm.KindHibernate, time.Minute)
				ch := make(chan int, 1)
				go func() { ch <- postStatus(n.URL+"/v1/sandboxes/"+c.ID+"/hibernate", c.Token, "") }()
				return ch, func() bool {
					var status fsm.ClaimStatus
					n.Engine.View(func(st *fsm.State) { got, _ := st.Claim(c.ID); status = got.Status })
					return status == fsm.ClaimHibernating
				}
			}},
		{"a claim waiting for its VM", func(t *testing.T) *nodetest.Node {
			return newNode(t, 0, func(o *nodetest.Options) { o.NoExecutors = true })
		}, func(t *testing.T, n *nodetest.Node) (<-chan int, func() bool) {
			ch := make(chan int, 1)
			go func() { ch <- postStatus(n.URL+"/v1/claim", tokA, `{"template":"default"}`) }()
			return ch, func() bool {
				var live int
				n.Engine.View(func(st *fsm.State) { live = st.TenantLive("a") })
				return live == 1
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := tc.node(t)
			ch, inFlight := tc.send(t, n)
			for deadline := time.Now().Add(10 * time.Second); !inFlight(); time.Sleep(2 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatal("the request never started waiting")
				}
			}
			began := time.Now()
			stopped := make(chan error, 1)
			go func() { stopped <- n.Stop() }()
			select {
			case st := <-ch:
				if st != http.StatusServiceUnavailable {
					t.Fatalf("answered %d, want 503", st)
				}
			case <-time.After(3 * time.Second):
				t.Fatal("no answer within 3 s of Stop")
			}
			select {
			case err := <-stopped:
				if err != nil {
					t.Fatal(err)
				}
			case <-time.After(8 * time.Second):
				t.Fatalf("Stop still running after %s", time.Since(began))
			}
		})
	}
}
