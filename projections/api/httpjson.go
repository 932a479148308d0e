package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"strconv"
)

// MaxBody caps every request body; a larger one is refused before it is parsed.
const MaxBody = 1 << 20

// errInvalidBody is the old daemon's answer to any body it cannot parse.
const errInvalidBody = "invalid request body"

// ErrUnavailable marks an error of a write that cannot be confirmed now,
// for a reason outside the request (synchronous replication without its
// acknowledgement): such errors answer 503 with their message.
var ErrUnavailable = errors.New("unavailable")

// httpError is an error with the status it maps to.
type httpError struct {
	status int
	msg    string
	// id, when set, names a sandbox the failed request nonetheless
	// created (a claim committed but not served or not replicated): the
	// client can look it up or release it instead of leaving it to expire.
	id string
	// reason, when set, says why for people (a claim not provisioned: the
	// old daemon's fixed message stays in msg).
	reason string
	// retryAfter, when set, is the Retry-After header (seconds) of a
	// refusal for a capacity that frees up by itself.
	retryAfter string
	// fields are more of the body's fields (an unreachable owner's).
	fields map[string]string
}

func (e *httpError) Error() string { return e.msg }

func errorf(status int, format string, args ...any) error {
	return &httpError{status: status, msg: fmt.Sprintf(format, args...)}
}

// writeJSON writes v with status.
func writeJSON(w http.ResponseWriter, status int, v any) { writeRaw(w, status, encodeJSON(v)) }

// encodeJSON is the body writeJSON sends for v: one line, HTML not escaped.
func encodeJSON(v any) []byte {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		// Only a bug (a type that cannot be encoded) gets here.
		msg, _ := json.Marshal(map[string]string{"error": "encode response: " + err.Error()})
		return append(msg, '\n')
	}
	return b.Bytes()
}

// writeRaw writes an encoded JSON body with status.
func writeRaw(w http.ResponseWriter, status int, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// writeRawNow is writeRaw sent at once (one write, with Content-Length so
// the flush needs no chunked encoding), for a handler with work left after
// its answer. Like every reply it has no write deadline: a client that
// stops reading blocks only its own handler (the engine hands a commit
// whose Durable hook is stuck to the observers through later proposals).
func writeRawNow(w http.ResponseWriter, status int, body []byte) {
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	writeRaw(w, status, body)
	_ = http.NewResponseController(w).Flush()
}

// writeError writes {"error": msg} with the error's status (500 for errors
// that carry none: those are bugs or I/O failures, logged by the caller).
func writeError(w http.ResponseWriter, err error) {
	var he *httpError
	if errors.As(err, &he) {
		body := map[string]string{"error": he.msg}
		if he.id != "" {
			body["id"] = he.id
		}
		if he.reason != "" {
			body["reason"] = he.reason
		}
		if he.retryAfter != "" {
			w.Header().Set("Retry-After", he.retryAfter)
		}
		for k, v := range he.fields {
			if v != "" && body[k] == "" {
				body[k] = v
			}
		}
		writeErrorBody(w, he.status, body)
		return
	}
	writeErrorBody(w, http.StatusInternalServerError, map[string]string{"error": err.Error()})
}

// writeErrorBody writes an error with its Content-Length: the body guard
// flushes a refusal before it ends the connection, and a flushed answer
// without one would go out chunked.
func writeErrorBody(w http.ResponseWriter, status int, body map[string]string) {
	b := encodeJSON(body)
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	writeRaw(w, status, b)
}

// decodeBody strictly decodes the request's JSON body (dispatch has read it,
// at most MaxBody bytes) into v: unknown fields, fields named in another
// case, duplicate fields and trailing data are all 400 with the old
// daemon's message, with the reason appended for people.
func decodeBody(r *http.Request, v any, allowEmpty bool) error {
	var body []byte
	if rb, ok := r.Body.(*bufferedBody); ok {
		body = rb.b
	} else {
		var err error
		if body, err = io.ReadAll(r.Body); err != nil {
			return errorf(http.StatusBadRequest, "%s: %v", errInvalidBody, err)
		}
	}
	if len(bytes.TrimSpace(body)) == 0 {
		if allowEmpty {
			return nil
		}
		return errorf(http.StatusBadRequest, "%s: empty body", errInvalidBody)
	}
	if err := checkStrictJSON(body, reflect.TypeOf(v)); err != nil {
		return errorf(http.StatusBadRequest, "%s: %v", errInvalidBody, err)
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return errorf(http.StatusBadRequest, "%s: %v", errInvalidBody, err)
	}
	if dec.More() {
		return errorf(http.StatusBadRequest, "%s: trailing data after the JSON value", errInvalidBody)
	}
	return nil
}
