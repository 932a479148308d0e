package api

import (
	"io"
	"net/http"
	"time"
)

// The body guard is the one place a request's declared body is bounded and
// refused, for every answer the server gives (a route's, the 405 of a
// known path, the catch-all 404, and any route added later):
//
//   - a request that declares a body (a Content-Length, or chunked) must
//     deliver it within Config.BodyTimeout from when it is handed to the
//     server: a read deadline on the connection, cleared as soon as the
//     body has been read to its end, whoever reads it (dispatch's readBody,
//     the preview's proxy), so a long handler or a streamed answer is not
//     cut off;
//   - an answer that begins before the body was read to its end (a
//     refusal: no route, a wrong method, a missing token, a body too
//     large or malformed) says Connection: close; once it is written and
//     flushed, what the client still sends within lingerWindow (at most
//     lingerBytes) is dropped so the close is not a reset, then the
//     connection is closed instead of being drained. net/http drains up to 256 KiB of an unread body after
//     the handler, and without a deadline a client that declared a body and
//     never sends it held its connection (and a goroutine) forever.
//
// Requests without a body are left alone: their connections are bounded by
// the server's header and idle timeouts, and the long-lived ones (the
// /v1/events streams, the data plane's upgrades) must not be cut by a read
// deadline (net/http cancels a request's context when its background read
// fails). The upgrades take no body, and clear every deadline once they
// hijack the connection.

// declaresBody reports whether r announces a body: a positive
// Content-Length, or one of unknown length (chunked).
func declaresBody(r *http.Request) bool {
	return r.ContentLength > 0 || (r.ContentLength < 0 && r.Body != nil && r.Body != http.NoBody)
}

// BodyGuard is h served under the body guard with bound as the body's read
// bound: what the server puts in front of its routes, for a caller that
// wants the same guard in front of another handler (the API benchmark
// prices it on a no-op handler).
func BodyGuard(h http.Handler, bound time.Duration) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { guardBody(h, bound, w, r) })
}

// guardBody serves r through h under the body guard, bounding the body by
// bound.
func guardBody(h http.Handler, bound time.Duration, w http.ResponseWriter, r *http.Request) {
	if !declaresBody(r) {
		h.ServeHTTP(w, r)
		return
	}
	rc := http.NewResponseController(w)
	// A socket deadline: the real clock, not the injectable one.
	_ = rc.SetReadDeadline(time.Now().Add(bound))
	body := &countedBody{ReadCloser: r.Body, declared: r.ContentLength, done: func() { _ = rc.SetReadDeadline(time.Time{}) }}
	r.Body = body
	gw := &guardedWriter{ResponseWriter: w, rc: rc, body: body}
	h.ServeHTTP(gw, r)
	// A handler that wrote nothing gets net/http's empty 200: the body must
	// not be drained for it either.
	gw.answering()
	if !body.consumed() {
		// The answer goes out first. Closing with unread bytes queued makes
		// the kernel reset the connection, and a reset can destroy the
		// answer before a client still sending its body has read it; so
		// what arrives within a short window is read and dropped (at most
		// lingerBytes), then the read side ends.
		_ = rc.Flush()
		_ = rc.SetReadDeadline(time.Now().Add(lingerWindow))
		_, _ = io.CopyN(io.Discard, body.ReadCloser, lingerBytes)
		_ = rc.SetReadDeadline(time.Now())
	}
}

// The linger after a refused body: long enough for a client that is
// sending to finish a body of the largest size the API takes, short enough
// that a client that sends nothing holds its connection no longer.
const (
	lingerWindow = 250 * time.Millisecond
	lingerBytes  = 2 * MaxBody
)

// countedBody is a declared body that knows whether it was read to its
// end, and calls done once when it is.
type countedBody struct {
	io.ReadCloser
	declared int64 // Content-Length, or -1 (chunked)
	read     int64
	eof      bool
	done     func()
}

func (b *countedBody) Read(p []byte) (int, error) {
	was := b.consumed()
	n, err := b.ReadCloser.Read(p)
	b.read += int64(n)
	if err == io.EOF {
		b.eof = true
	}
	if !was && b.consumed() {
		b.done()
	}
	return n, err
}

// consumed: every declared byte was read (a Content-Length body read to its
// length needs no further read to see its EOF).
func (b *countedBody) consumed() bool {
	return b.eof || (b.declared > 0 && b.read >= b.declared)
}

// guardedWriter refuses what is left of the body when the answer begins.
// Unwrap lets http.ResponseController reach the connection (flush, hijack,
// deadlines) through it.
type guardedWriter struct {
	http.ResponseWriter
	rc       *http.ResponseController
	body     *countedBody
	answered bool
}

func (w *guardedWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// answering runs once, as the answer's head is about to be written.
func (w *guardedWriter) answering() {
	if w.answered {
		return
	}
	w.answered = true
	if !w.body.consumed() {
		// guardBody ends the read side once the handler returns.
		w.Header().Set("Connection", "close")
	}
}

func (w *guardedWriter) WriteHeader(code int) {
	if code >= 200 {
		w.answering()
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *guardedWriter) Write(p []byte) (int, error) {
	w.answering()
	return w.ResponseWriter.Write(p)
}
