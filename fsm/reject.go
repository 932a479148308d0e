package fsm

import (
	"errors"
	"fmt"
)

// Code classifies a rejection.
type Code uint8

// Rejection codes.
const (
	// Invalid: malformed input (bad id, template, TTL, metadata...). 400.
	Invalid Code = iota + 1
	// NotFound: unknown claim, VM or golden. 404.
	NotFound
	// UnknownPool: no pool with that key is configured (a refill or a
	// capacity report about it; a claim of such a key is served cold). 400.
	UnknownPool
	// InvalidTransition: the entity is in a state where the command does not
	// apply (wake of a hibernating claim, a stale executor result). 409.
	InvalidTransition
	// TooMany: over max_claims or the tenant's cap. 429.
	TooMany
	// Draining: a claim refused because of a drain. 409. No decision makes
	// it now (a claim of a removed pool's key is served as one of a key
	// without a pool); the code keeps its number and name.
	Draining
	// PreconditionFailed: the request's precondition does not hold (a
	// template's digest is not the one named). 412.
	PreconditionFailed
)

var codeNames = [...]string{"", "invalid", "not_found", "unknown_pool", "invalid_transition", "too_many", "draining", "precondition_failed"}

func (c Code) String() string { return enumName(codeNames[:], int(c)) }

// HTTPStatus is the status the sandboxd API answers a rejection with.
func (c Code) HTTPStatus() int {
	switch c {
	case NotFound:
		return 404
	case InvalidTransition, Draining:
		return 409
	case TooMany:
		return 429
	case PreconditionFailed:
		return 412
	default:
		return 400
	}
}

// Rejection is Decide's answer to a command the state does not allow. It is
// not a failure of anything: nothing was written. Append failures are the
// caller's and never a Rejection.
type Rejection struct {
	Code Code
	Msg  string
}

func (r *Rejection) Error() string { return r.Code.String() + ": " + r.Msg }

// Is makes errors.Is(err, ErrNotFound) and friends match any rejection of
// the same code.
func (r *Rejection) Is(target error) bool {
	t, ok := target.(*Rejection)
	return ok && t.Msg == "" && t.Code == r.Code
}

// Sentinels for errors.Is, one per code.
var (
	ErrInvalid           = &Rejection{Code: Invalid}
	ErrNotFound          = &Rejection{Code: NotFound}
	ErrUnknownPool       = &Rejection{Code: UnknownPool}
	ErrInvalidTransition = &Rejection{Code: InvalidTransition}
	ErrTooMany           = &Rejection{Code: TooMany}
	ErrDraining          = &Rejection{Code: Draining}
	ErrPrecondition      = &Rejection{Code: PreconditionFailed}
)

// AsRejection returns err's rejection, if it is one.
func AsRejection(err error) (*Rejection, bool) {
	var r *Rejection
	ok := errors.As(err, &r)
	return r, ok
}

func reject(c Code, format string, args ...any) error {
	return &Rejection{Code: c, Msg: fmt.Sprintf(format, args...)}
}

// ErrInconsistent is wrapped by Apply's errors for events that do not fit the
// state (a claim that already exists, a VM in the wrong state...).
var ErrInconsistent = errors.New("event inconsistent with state")

// ApplyError says which event Apply refused and why.
type ApplyError struct {
	Seq  uint64
	Type string
	Err  error
}

func (e *ApplyError) Error() string {
	return fmt.Sprintf("apply %s (seq %d): %v", e.Type, e.Seq, e.Err)
}

func (e *ApplyError) Unwrap() error { return e.Err }

func inconsistent(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInconsistent, fmt.Sprintf(format, args...))
}
