package ch

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
)

// Sentinels for failures below HTTP. They are wrapped by *TransportError, so
// test with errors.Is.
var (
	// ErrVMMGone: the API socket does not exist or nothing accepts on it
	// (ENOENT, ECONNREFUSED). No request reached a VMM; the VMM process is not
	// serving, normally because it has exited. Retrying the same socket is
	// pointless until a VMM is launched again.
	ErrVMMGone = errors.New("ch: VMM not reachable")
	// ErrConnectionLost: the connection was established but broke before a
	// complete response arrived. The request may or may not have been carried
	// out; check the VM's state (or the process) before repeating a
	// non-idempotent step.
	ErrConnectionLost = errors.New("ch: connection to VMM lost")
	// ErrTimeout: the per-call timeout ran out. Errors carrying it also match
	// context.DeadlineExceeded.
	ErrTimeout = errors.New("ch: call timed out")
)

// APIError is a non-2xx answer from the VMM.
type APIError struct {
	// Op is the endpoint, e.g. "vm.pause".
	Op string
	// Status is the HTTP status code.
	Status int
	// Chain is CH's error chain, outermost first, e.g.
	// ["Error from API", "The VM could not be paused", ...]. Empty when the
	// server sent no body (CH does that for an unsupported method).
	Chain []string
	// Body is the raw body when it was not a JSON array of strings.
	Body string
}

func (e *APIError) Error() string {
	msg := strings.Join(e.Chain, ": ")
	if msg == "" {
		msg = strings.TrimSpace(e.Body)
	}
	if msg == "" {
		msg = http.StatusText(e.Status)
	}
	return fmt.Sprintf("ch %s: %d: %s", e.Op, e.Status, msg)
}

// Contains reports whether any element of the error chain (or the raw body)
// contains s.
func (e *APIError) Contains(s string) bool {
	for _, c := range e.Chain {
		if strings.Contains(c, s) {
			return true
		}
	}
	return e.Body != "" && strings.Contains(e.Body, s)
}

// IsTransition reports whether the server refused a state transition from
// one VmState to another, e.g. IsTransition(StatePaused, StatePaused).
func (e *APIError) IsTransition(from, to VmState) bool {
	return e.Contains(fmt.Sprintf("InvalidStateTransition(%s, %s)", from, to)) ||
		e.Contains(fmt.Sprintf("invalid VM state transition: %s to %s", from, to))
}

// parseAPIError builds the error for a non-2xx response.
func parseAPIError(op string, status int, body []byte) *APIError {
	e := &APIError{Op: op, Status: status}
	trimmed := strings.TrimSpace(string(body))
	if trimmed == "" {
		return e
	}
	var chain []string
	if err := json.Unmarshal([]byte(trimmed), &chain); err == nil {
		e.Chain = chain
		return e
	}
	// Older CH versions answered with a bare string or Debug output.
	var s string
	if err := json.Unmarshal([]byte(trimmed), &s); err == nil {
		e.Chain = []string{s}
		return e
	}
	if len(trimmed) > 4096 {
		trimmed = trimmed[:4096]
	}
	e.Body = trimmed
	return e
}

func asAPIError(err error) (*APIError, bool) {
	var ae *APIError
	ok := errors.As(err, &ae)
	return ae, ok
}

// IsNotFound reports a 404: no VM created yet (vm.info, vm.boot before
// vm.create), an unknown device id, or an unknown endpoint.
func IsNotFound(err error) bool {
	ae, ok := asAPIError(err)
	return ok && ae.Status == http.StatusNotFound
}

// IsBadRequest reports a 400: a malformed body, a body on a bodiless action
// or a wrong method.
func IsBadRequest(err error) bool {
	ae, ok := asAPIError(err)
	return ok && ae.Status == http.StatusBadRequest
}

// IsConflict reports that what the call would create already exists: a 409
// (duplicate device id or path) or a 500 "VM is already created" (vm.create or
// vm.restore into a VMM that holds a VM).
func IsConflict(err error) bool {
	ae, ok := asAPIError(err)
	if !ok {
		return false
	}
	return ae.Status == http.StatusConflict ||
		(ae.Status == http.StatusInternalServerError && ae.Contains("VM is already created"))
}

// IsInvalidState reports that the VM is not in a state that allows the call:
// a refused transition, no running VM for pause/resume/shutdown, or a snapshot
// of a VM that is not paused. The real server answers all of these with 500.
func IsInvalidState(err error) bool {
	ae, ok := asAPIError(err)
	if !ok || ae.Status != http.StatusInternalServerError {
		return false
	}
	return ae.Contains("InvalidStateTransition") ||
		ae.Contains("invalid VM state transition") ||
		ae.Contains("VM is not running") ||
		ae.Contains("VM is not booted") ||
		ae.Contains("snapshot while VM is running")
}

// IsVMMGone reports that no VMM serves the socket (see ErrVMMGone).
func IsVMMGone(err error) bool { return errors.Is(err, ErrVMMGone) }

// TransportError is a failure below HTTP: dialing the socket, writing the
// request or reading the response. It wraps ErrVMMGone, ErrConnectionLost or
// ErrTimeout (and the underlying error).
type TransportError struct {
	Op   string
	Kind error // ErrVMMGone, ErrConnectionLost or ErrTimeout
	Err  error
}

func (e *TransportError) Error() string {
	return fmt.Sprintf("ch %s: %v: %v", e.Op, e.Kind, e.Err)
}

// Unwrap exposes both the kind sentinel and the underlying error.
func (e *TransportError) Unwrap() []error { return []error{e.Kind, e.Err} }
