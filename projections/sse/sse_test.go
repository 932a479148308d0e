package sse

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

func TestEventFraming(t *testing.T) {
	rec := httptest.NewRecorder()
	w, err := Start(rec)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Event("7", "claim_created", []byte("{\"a\":1}\n{\"b\":2}")); err != nil {
		t.Fatal(err)
	}
	if err := w.Comment("heartbeat"); err != nil {
		t.Fatal(err)
	}
	want := "id: 7\nevent: claim_created\ndata: {\"a\":1}\ndata: {\"b\":2}\n\n: heartbeat\n\n"
	if got := rec.Body.String(); got != want {
		t.Fatalf("body:\n%q\nwant\n%q", got, want)
	}
	if ct := rec.Header().Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("content type %q", ct)
	}
}

func TestCursor(t *testing.T) {
	for _, tc := range []struct {
		name, header, query string
		from                uint64
		ok, bad             bool
	}{
		{"none", "", "", 0, false, false},
		{"last event id resumes after it", "41", "", 42, true, false},
		{"from is inclusive", "", "from=5", 5, true, false},
		{"header wins", "9", "from=5", 10, true, false},
		{"bad header", "x", "", 0, false, true},
		{"bad from", "", "from=-1", 0, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodGet, "/v1/events?"+tc.query, nil)
			if tc.header != "" {
				r.Header.Set("Last-Event-ID", tc.header)
			}
			from, ok, err := Cursor(r)
			if (err != nil) != tc.bad || ok != tc.ok || from != tc.from {
				t.Fatalf("Cursor = %d, %v, %v; want %d, %v, bad=%v", from, ok, err, tc.from, tc.ok, tc.bad)
			}
		})
	}
}
