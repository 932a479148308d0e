// Package openapitest checks live HTTP exchanges against sandboxd's OpenAPI
// document (package openapi) with kin-openapi: Transport is an
// http.RoundTripper for test clients that validates every request it
// sends and every answer it gets, and fails the test on a mismatch.
//
// What is a mismatch: an answer whose status the document does not list
// for the operation, or whose body does not match the status's schema (a
// field the document does not have, a missing required field, a wrong
// type or enum value); a request the document refuses (a wrong body, a
// parameter out of its schema) that the server did not refuse with a 4xx;
// a path or method the document does not have that the server answered
// with anything but 404 or 405. Tests send bad requests on purpose: the
// server refusing them is conformance, not a mismatch. Streams (Server-
// Sent Events) and upgrades (101) are checked by status and headers only:
// their bodies never end.
//
// Authentication is not checked here (the document says who may call a
// route in x-sbx-auth; the route tests check the server keeps to it).
package openapitest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/gorillamux"

	"github.com/sbxlog/sbxlog/projections/openapi"
)

// The dashboard's files are text: kin-openapi decodes only text/plain as
// such unless told.
func init() {
	for _, ct := range []string{"text/html", "text/css", "text/javascript"} {
		openapi3filter.RegisterBodyDecoder(ct, openapi3filter.PlainBodyDecoder)
	}
}

// router is the document's router, built once per test binary.
var router = sync.OnceValues(func() (routers.Router, error) {
	data, err := openapi.Document()
	if err != nil {
		return nil, err
	}
	doc, err := openapi3.NewLoader().LoadFromData(data)
	if err != nil {
		return nil, err
	}
	if err := doc.Validate(context.Background()); err != nil {
		return nil, err
	}
	// The document's server is "/": match any host the test dials.
	doc.Servers = nil
	return gorillamux.NewRouter(doc)
})

// Transport validates each exchange through Base (http.DefaultTransport
// when nil) against the document and reports mismatches with TB.Errorf.
type Transport struct {
	TB   testing.TB
	Base http.RoundTripper
}

// Client returns an HTTP client whose exchanges are validated, failing tb.
func Client(tb testing.TB, base *http.Client) *http.Client {
	c := &http.Client{}
	if base != nil {
		*c = *base
	}
	c.Transport = &Transport{TB: tb, Base: c.Transport}
	return c
}

// RoundTrip implements http.RoundTripper.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	base := t.Base
	if base == nil {
		base = http.DefaultTransport
	}
	var reqBody []byte
	if req.Body != nil && req.Body != http.NoBody {
		var err error
		reqBody, err = io.ReadAll(req.Body)
		req.Body.Close()
		if err != nil {
			return nil, err
		}
		req = req.Clone(req.Context())
		req.Body = io.NopCloser(bytes.NewReader(reqBody))
		req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(reqBody)), nil }
	}
	resp, err := base.RoundTrip(req)
	if err != nil {
		return resp, err
	}
	var respBody []byte
	streamed := resp.StatusCode == http.StatusSwitchingProtocols || strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream")
	if !streamed {
		respBody, err = io.ReadAll(resp.Body)
		resp.Body.Close()
		resp.Body = io.NopCloser(bytes.NewReader(respBody))
		if err != nil {
			return resp, err
		}
	}
	if problems := Check(req, reqBody, resp.StatusCode, resp.Header, respBody, streamed); len(problems) > 0 {
		t.TB.Errorf("openapi: %s %s -> %d %s:\n  %s", req.Method, req.URL.RequestURI(), resp.StatusCode, clip(respBody), strings.Join(problems, "\n  "))
	}
	return resp, nil
}

// Check validates one exchange and returns what does not match the
// document (nil when it all does). streamed: the answer's body is not
// validated (an event stream or an upgrade).
func Check(req *http.Request, reqBody []byte, status int, header http.Header, respBody []byte, streamed bool) []string {
	r, err := router()
	if err != nil {
		return []string{"the document does not load: " + err.Error()}
	}
	vreq := req.Clone(context.Background())
	vreq.Body = io.NopCloser(bytes.NewReader(reqBody))
	if len(reqBody) > 0 && vreq.Header.Get("Content-Type") == "" {
		// sandboxd reads every body as JSON, whatever the header says (old
		// clients send none).
		vreq.Header.Set("Content-Type", "application/json")
	}
	route, params, err := r.FindRoute(vreq)
	if err != nil {
		if status == http.StatusNotFound || status == http.StatusMethodNotAllowed {
			return nil
		}
		return []string{fmt.Sprintf("no operation in the document (%v), yet answered %d", err, status)}
	}
	ctx := context.Background()
	in := &openapi3filter.RequestValidationInput{
		Request: vreq, PathParams: params, Route: route,
		Options: &openapi3filter.Options{
			MultiError:         true,
			AuthenticationFunc: openapi3filter.NoopAuthenticationFunc,
		},
	}
	var problems []string
	if err := openapi3filter.ValidateRequest(ctx, in); err != nil && (status < 400 || status >= 500) {
		problems = append(problems, fmt.Sprintf("the document refuses the request (%s), yet the server answered %d", flat(err), status))
	}
	rin := &openapi3filter.ResponseValidationInput{
		RequestValidationInput: in,
		Status:                 status,
		Header:                 header,
		Body:                   io.NopCloser(bytes.NewReader(respBody)),
		Options: &openapi3filter.Options{
			IncludeResponseStatus: true,
			ExcludeResponseBody:   streamed,
			MultiError:            true,
		},
	}
	if err := openapi3filter.ValidateResponse(ctx, rin); err != nil {
		problems = append(problems, fmt.Sprintf("answer %d: %s", status, flat(err)))
	}
	return problems
}

// flat renders kin-openapi's (multi-)errors on one line each.
func flat(err error) string {
	var me openapi3.MultiError
	if errors.As(err, &me) {
		parts := make([]string, len(me))
		for i, e := range me {
			parts[i] = flat(e)
		}
		return strings.Join(parts, "; ")
	}
	return strings.ReplaceAll(err.Error(), "\n", " ")
}

func clip(b []byte) string {
	if len(b) > 300 {
		return string(b[:300]) + "..."
	}
	return string(b)
}
