package executors

import (
	"errors"
	"fmt"
	"strings"
	"syscall"
)

// Unrecoverable marks a failure that retrying cannot fix (a missing golden or
// template, an intent naming paths outside the roots, a VMM that died with
// the VM's only copy of its memory). The scheduler reports the failure at
// once.
type Unrecoverable struct {
	Err error
	// Lost says the VM (Hibernate) or its snapshot (Wake) is gone for good;
	// it becomes the Lost flag of HibernateFailed / WakeFailed.
	Lost bool
}

func (e *Unrecoverable) Error() string {
	if e.Lost {
		return "unrecoverable (lost): " + e.Err.Error()
	}
	return "unrecoverable: " + e.Err.Error()
}

func (e *Unrecoverable) Unwrap() error { return e.Err }

// Unrecoverablef returns an *Unrecoverable with a formatted error (%w works).
func Unrecoverablef(format string, args ...any) error {
	return &Unrecoverable{Err: fmt.Errorf(format, args...)}
}

// Lostf returns an *Unrecoverable with Lost set.
func Lostf(format string, args ...any) error {
	return &Unrecoverable{Err: fmt.Errorf(format, args...), Lost: true}
}

// AsUnrecoverable wraps err as unrecoverable (nil stays nil).
func AsUnrecoverable(err error) error {
	if err == nil || IsUnrecoverable(err) {
		return err
	}
	return &Unrecoverable{Err: err}
}

// IsUnrecoverable reports whether err wraps an *Unrecoverable.
func IsUnrecoverable(err error) bool {
	var u *Unrecoverable
	return errors.As(err, &u)
}

// IsLost reports whether err wraps an *Unrecoverable with Lost set.
func IsLost(err error) bool {
	var u *Unrecoverable
	return errors.As(err, &u) && u.Lost
}

// ErrCapacity marks a failure caused by the node being full: no space in the
// store or run filesystem (ENOSPC, EDQUOT), or a hypervisor reporting the
// same. The scheduler reports the operation's failure and proposes
// fsm.CapacityFull, which parks refills for fsm.CapacityParkNS.
var ErrCapacity = errors.New("executors: node at capacity")

// capacityError carries ErrCapacity next to the original error.
type capacityError struct{ err error }

func (e *capacityError) Error() string   { return "at capacity: " + e.err.Error() }
func (e *capacityError) Unwrap() []error { return []error{ErrCapacity, e.err} }

// Capacity wraps err so that errors.Is(err, ErrCapacity) holds.
func Capacity(err error) error {
	if err == nil || errors.Is(err, ErrCapacity) {
		return err
	}
	return &capacityError{err}
}

// IsCapacity reports whether err is a capacity failure: it wraps
// ErrCapacity, ENOSPC or EDQUOT, or is a hypervisor error whose text carries
// the ENOSPC message (CH reports file errors as text, "No space left on
// device (os error 28)").
func IsCapacity(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, ErrCapacity) || errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
		return true
	}
	msg := err.Error()
	return strings.Contains(msg, "No space left on device") || strings.Contains(msg, "Disk quota exceeded")
}
