package api

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"github.com/sbxlog/sbxlog/projections/auth"
	"github.com/sbxlog/sbxlog/projections/dashboard"
)

// TestDashboardRoutes: / serves the dashboard's page and /dashboard/{file}
// its files, with the CSP and without a token; another name is the JSON
// 404; with Config.NoDashboard neither is a route.
func TestDashboardRoutes(t *testing.T) {
	a, err := auth.New("root", nil, []byte("0123456789abcdef0123456789abcdef"))
	if err != nil {
		t.Fatal(err)
	}
	on := New(Config{}, nil, nil, a, Options{Log: zerolog.Nop()})
	off := New(Config{NoDashboard: true}, nil, nil, a, Options{Log: zerolog.Nop()})
	for _, tc := range []struct {
		name   string
		s      *Server
		path   string
		status int
		ctype  string
		body   string // a substring
	}{
		{"page", on, "/", 200, "text/html; charset=utf-8", `<script src="/dashboard/app.js"`},
		{"script", on, "/dashboard/app.js", 200, "text/javascript; charset=utf-8", "/v1/events"},
		{"style", on, "/dashboard/style.css", 200, "text/css; charset=utf-8", "body"},
		{"another name", on, "/dashboard/nope.js", 404, "application/json", `"error"`},
		{"no name", on, "/dashboard/", 404, "application/json", `"error"`},
		{"under the root", on, "/index.html", 404, "application/json", "no route"},
		{"off: page", off, "/", 404, "application/json", "no route"},
		{"off: script", off, "/dashboard/app.js", 404, "application/json", "no route"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			tc.s.ServeHTTP(rec, httptest.NewRequest("GET", tc.path, nil))
			if rec.Code != tc.status || (tc.ctype != "" && rec.Header().Get("Content-Type") != tc.ctype) || !strings.Contains(rec.Body.String(), tc.body) {
				t.Fatalf("GET %s: %d %q %.200q; want %d %q with %q", tc.path, rec.Code, rec.Header().Get("Content-Type"), rec.Body.String(), tc.status, tc.ctype, tc.body)
			}
			if tc.status == http.StatusOK && rec.Header().Get("Content-Security-Policy") != dashboard.ContentSecurityPolicy {
				t.Fatalf("GET %s: CSP %q", tc.path, rec.Header().Get("Content-Security-Policy"))
			}
		})
	}
}
