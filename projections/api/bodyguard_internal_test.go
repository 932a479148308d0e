package api

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// DialRaw sends raw request bytes to the server at url (http://host:port)
// and returns the connection and a reader over it; the connection is
// closed at cleanup. Exported for the package's external tests.
func DialRaw(t *testing.T, url, req string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatal(err)
	}
	return c, bufio.NewReader(c)
}

// The body guard holds for any handler, not only dispatch's routes: one
// that answers without reading a declared body closes the connection at
// once, one that reads the body itself is cut off at the bound, one that
// reads it all keeps the connection alive, and requests without a body
// are left alone (no read deadline: a long answer is not cut).
func TestBodyGuardBoundsEveryHandler(t *testing.T) {
	const bound = 200 * time.Millisecond
	readErr := make(chan error, 1)
	mux := http.NewServeMux()
	mux.HandleFunc("/ignore", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusTeapot)
	})
	mux.HandleFunc("/silent", func(w http.ResponseWriter, r *http.Request) {})
	mux.HandleFunc("/read", func(w http.ResponseWriter, r *http.Request) {
		_, err := io.ReadAll(r.Body)
		readErr <- err
		if err != nil {
			w.WriteHeader(http.StatusRequestTimeout)
			return
		}
		_, _ = io.WriteString(w, "read")
	})
	mux.HandleFunc("/read-then-work", func(w http.ResponseWriter, r *http.Request) {
		if _, err := io.ReadAll(r.Body); err != nil {
			w.WriteHeader(http.StatusRequestTimeout)
			return
		}
		// Work past the bound (a claim waiting for its VM, a proxied
		// answer streaming): the body is in, so nothing may cut it off.
		time.Sleep(3 * bound)
		if r.Context().Err() != nil {
			w.WriteHeader(http.StatusGone)
			return
		}
		_, _ = io.WriteString(w, "worked")
	})
	mux.HandleFunc("/slow", func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(3 * bound) // longer than the bound: not cut, it has no body
		_, _ = io.WriteString(w, "slow")
	})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		guardBody(mux, bound, w, r)
	}))
	t.Cleanup(srv.Close)

	dial := func(t *testing.T, req string) (net.Conn, *bufio.Reader) { return DialRaw(t, srv.URL, req) }
	reply := func(t *testing.T, c net.Conn, br *bufio.Reader) *http.Response {
		t.Helper()
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("no reply: %v", err)
		}
		_, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp
	}
	closed := func(t *testing.T, c net.Conn, br *bufio.Reader) bool {
		t.Helper()
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err := br.ReadByte()
		var ne net.Error
		return err != nil && !(errors.As(err, &ne) && ne.Timeout())
	}
	stalled := func(path string) string {
		return "POST " + path + " HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{"
	}

	for _, path := range []string{"/ignore", "/silent", "/nowhere"} {
		t.Run("answer without reading "+path, func(t *testing.T) {
			c, br := dial(t, stalled(path))
			if resp := reply(t, c, br); !resp.Close {
				t.Errorf("%d without Connection: close", resp.StatusCode)
			}
			if !closed(t, c, br) {
				t.Fatal("connection still open")
			}
		})
	}
	t.Run("a handler reading a stalled body is cut at the bound", func(t *testing.T) {
		c, br := dial(t, stalled("/read"))
		select {
		case err := <-readErr:
			var ne net.Error
			if !errors.As(err, &ne) || !ne.Timeout() {
				t.Fatalf("read error %v, want a timeout", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the handler's read was not cut off")
		}
		if resp := reply(t, c, br); resp.StatusCode != http.StatusRequestTimeout {
			t.Fatalf("%d, want 408", resp.StatusCode)
		}
		if !closed(t, c, br) {
			t.Fatal("connection still open")
		}
	})
	t.Run("a body read to its end keeps the connection", func(t *testing.T) {
		c, br := dial(t, "POST /read HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
		if err := <-readErr; err != nil {
			t.Fatal(err)
		}
		if resp := reply(t, c, br); resp.StatusCode != http.StatusOK || resp.Close {
			t.Fatalf("%d close=%v, want 200 kept alive", resp.StatusCode, resp.Close)
		}
		// The same connection serves a second request.
		if _, err := io.WriteString(c, "GET /slow HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		if resp := reply(t, c, br); resp.StatusCode != http.StatusOK {
			t.Fatalf("second request on the connection: %d", resp.StatusCode)
		}
	})
	t.Run("a body read to its end lifts the bound", func(t *testing.T) {
		for _, req := range []string{
			"POST /read-then-work HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}",
			"POST /read-then-work HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
		} {
			c, br := dial(t, req)
			if resp := reply(t, c, br); resp.StatusCode != http.StatusOK {
				t.Fatalf("%q: %d, want 200 after working past the bound", req, resp.StatusCode)
			}
		}
	})
	t.Run("no body, no deadline", func(t *testing.T) {
		c, br := dial(t, "GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
		if resp := reply(t, c, br); resp.StatusCode != http.StatusOK || resp.Close {
			t.Fatalf("%d close=%v, want 200 kept alive", resp.StatusCode, resp.Close)
		}
	})
}
