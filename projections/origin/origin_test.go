package origin_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sbxlog/sbxlog/projections/origin"
)

func TestIDTag(t *testing.T) {
	tag := origin.NodeTag("node-a")
	if len(tag) != 4 || tag == origin.NodeTag("node-b") {
		t.Fatalf("tags %q and %q", tag, origin.NodeTag("node-b"))
	}
	for _, tc := range []struct{ id, want string }{
		{"sb_" + tag + "0123456789ab", tag},
		{"sb_0123456789abcdef", "0123"},
		{"sb_0123", ""},
		{"ck_" + tag + "0123456789ab", tag}, // checkpoints carry it too (issue 24)
		{"ck_0123", ""},
		{"vm-0123456789abcdef", ""},
		{"sb_0123456789ABCDEF", ""},
		{"", ""},
	} {
		if got := origin.IDTag(tc.id); got != tc.want {
			t.Errorf("IDTag(%q) = %q, want %q", tc.id, got, tc.want)
		}
	}
}

// Ask takes a 200 with an owner_addr for "held", a 404 for "not held", and
// anything else (another status, a body without the address, no answer
// within Wait) for "could not tell"; it sends the caller's credentials and
// the probe header.
func TestAsk(t *testing.T) {
	for _, tc := range []struct {
		name    string
		handler http.HandlerFunc
		addr    string
		noAns   bool
	}{
		{"held", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte(`{"owner_addr":"10.0.0.9:7777"}`)) }, "10.0.0.9:7777", false},
		{"not held", func(w http.ResponseWriter, _ *http.Request) {
			http.Error(w, `{"error":"not owned here"}`, http.StatusNotFound)
		}, "", false},
		{"unsure", func(w http.ResponseWriter, _ *http.Request) {
			http.Error(w, `{"error":"view behind"}`, http.StatusServiceUnavailable)
		}, "", true},
		{"refused", func(w http.ResponseWriter, _ *http.Request) {
			http.Error(w, `{"error":"invalid api token"}`, http.StatusUnauthorized)
		}, "", true},
		{"no address", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte(`{}`)) }, "", true},
		{"too slow", func(w http.ResponseWriter, r *http.Request) {
			select {
			case <-r.Context().Done():
			case <-time.After(3 * origin.Wait):
			}
		}, "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			asked := make(chan [3]string, 1)
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				asked <- [3]string{r.Header.Get("Authorization"), r.Header.Get(origin.ProbeHeader), r.URL.Path}
				tc.handler(w, r)
			}))
			defer srv.Close()
			start := time.Now()
			addr, err := origin.Ask(context.Background(), strings.TrimPrefix(srv.URL, "http://"), "sb_0123456789abcdef", "Bearer tok")
			if took := time.Since(start); took > origin.Wait+time.Second {
				t.Errorf("Ask took %v, over its bound", took)
			}
			if addr != tc.addr || errors.Is(err, origin.ErrNoAnswer) != tc.noAns || (err != nil && !tc.noAns) {
				t.Errorf("Ask: %q, %v; want %q, no answer %v", addr, err, tc.addr, tc.noAns)
			}
			if q := <-asked; q[0] != "Bearer tok" || q[1] == "" || q[2] != "/v1/sandboxes/sb_0123456789abcdef/owner" {
				t.Errorf("the question: Authorization %q, probe header %q, path %q", q[0], q[1], q[2])
			}
		})
	}
	if _, err := origin.Ask(context.Background(), "", "sb_0123456789abcdef", ""); !errors.Is(err, origin.ErrNoAnswer) {
		t.Errorf("Ask of a node without an address: %v", err)
	}
}
