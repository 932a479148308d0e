package openapitest

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestCheck: what is and is not a mismatch, exchange by exchange.
func TestCheck(t *testing.T) {
	js := http.Header{"Content-Type": {"application/json"}}
	text := http.Header{"Content-Type": {"text/plain; charset=utf-8"}}
	sse := http.Header{"Content-Type": {"text/event-stream"}}
	info := `{"pools":[],"templates":[],"claimed":0,"hibernated":0,"archived":0,"node":"n","owner_addr":"a:1","hypervisor":"chsim","pending":0,"live":0,"max_claims":0,"log_seq":3}`
	for _, tc := range []struct {
		name, method, path, reqBody string
		status                      int
		header                      http.Header
		respBody                    string
		streamed                    bool
		want                        string // a substring of the problems; "" for none
	}{
		{"health", "GET", "/healthz", "", 200, text, "ok", false, ""},
		{"info as documented", "GET", "/v1/info", "", 200, js, info, false, ""},
		{"info with a field the document lacks", "GET", "/v1/info", "", 200, js, strings.Replace(info, `"live":0`, `"live":0,"bogus":1`, 1), false, "bogus"},
		{"info without a required field", "GET", "/v1/info", "", 200, js, strings.Replace(info, `,"log_seq":3`, ``, 1), false, "log_seq"},
		{"a status the operation does not list", "GET", "/v1/info", "", 418, js, `{"error":"x"}`, false, "418"},
		{"an error body of another shape", "GET", "/v1/info", "", 401, js, `{"message":"x"}`, false, "answer"},
		{"a bad claim refused", "POST", "/v1/claim", `{"template":5}`, 400, js, `{"error":"invalid request body"}`, false, ""},
		{"a bad claim served", "POST", "/v1/claim", `{"template":5}`, 200, js, `{"redirect":["a:1"]}`, false, "refuses the request"},
		{"a redirect", "POST", "/v1/claim", `{"template":"t"}`, 200, js, `{"redirect":["a:1"]}`, false, ""},
		{"an unknown path answered 404", "GET", "/nope", "", 404, js, `{"error":"no route"}`, false, ""},
		{"an unknown path served", "GET", "/nope", "", 200, js, `{}`, false, "no operation"},
		{"the dashboard's page", "GET", "/", "", 200, http.Header{"Content-Type": {"text/html; charset=utf-8"}}, "<!doctype html>", false, ""},
		{"the dashboard's script", "GET", "/dashboard/app.js", "", 200, http.Header{"Content-Type": {"text/javascript; charset=utf-8"}}, "'use strict';", false, ""},
		{"a stream", "GET", "/v1/events", "", 200, sse, "", true, ""},
		{"a stream with an undocumented status", "GET", "/v1/events", "", 202, sse, "", true, "202"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := httptest.NewRequest(tc.method, "http://127.0.0.1:7777"+tc.path, nil)
			problems := strings.Join(Check(req, []byte(tc.reqBody), tc.status, tc.header, []byte(tc.respBody), tc.streamed), "\n")
			switch {
			case tc.want == "" && problems != "":
				t.Fatalf("want no mismatch, got:\n%s", problems)
			case tc.want != "" && !strings.Contains(problems, tc.want):
				t.Fatalf("want a mismatch naming %q, got:\n%s", tc.want, problems)
			}
		})
	}
}

// recorder is a testing.TB that keeps what Errorf reports.
type recorder struct {
	testing.TB
	errs []string
}

func (r *recorder) Errorf(format string, args ...any) { r.errs = append(r.errs, format) }

// TestTransport: a client through Transport gets the answer as sent (its
// body still readable) and a mismatch fails the test it was given.
func TestTransport(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write([]byte(`{"peers":["x"],"extra":true}`))
	}))
	defer srv.Close()
	rec := &recorder{TB: t}
	resp, err := Client(rec, nil).Get(srv.URL + "/v1/peers")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || string(body) != `{"peers":["x"],"extra":true}` {
		t.Fatalf("body through the transport: %q, %v", body, err)
	}
	if len(rec.errs) != 1 {
		t.Fatalf("want one reported mismatch (extra), got %d", len(rec.errs))
	}
}
