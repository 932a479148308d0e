package apibench

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
)

// A server that closes a keep-alive connection after each answer (as its
// idle timeout does between a long run's blocks) costs the client a redial,
// not a failed claim; a fresh connection that fails is still an error.
func TestConnClientRedialsStaleConnection(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	var served, accepted atomic.Int32
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			n := accepted.Add(1)
			go func() {
				defer c.Close()
				if n == 3 {
					return // the third connection dies unanswered
				}
				req, err := http.ReadRequest(bufio.NewReader(c))
				if err != nil {
					return
				}
				req.Body.Close()
				body := fmt.Sprintf(`{"id":"c%d"}`, served.Add(1))
				fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
			}()
		}
	}()
	c := newConnClient("http://" + l.Addr().String())
	t.Cleanup(c.close)
	for i, want := range []string{"c1", "c2"} {
		_, cr, err := c.claim(context.Background())
		if err != nil {
			t.Fatalf("claim %d: %v", i+1, err)
		}
		if cr.ID != want {
			t.Fatalf("claim %d answered %q, want %q", i+1, cr.ID, want)
		}
	}
	if got := accepted.Load(); got != 2 {
		t.Fatalf("%d connections for two claims, want 2 (one redial)", got)
	}
	// The stale connection (closed after c2) is retried on the third, which
	// dies too: a fresh connection's failure is the claim's error.
	if _, _, err := c.claim(context.Background()); err == nil {
		t.Fatal("a claim whose fresh connection died answered no error")
	}
}
