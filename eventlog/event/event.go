package event

import (
	"errors"
	"fmt"
)

// MaxPayload is the largest payload an event may carry.
const MaxPayload = 1 << 20

// Event is one record of the op log.
type Event struct {
	// Seq is the record's position in its node's log: contiguous from 1. The
	// log assigns it on append; proposers leave it zero.
	Seq uint64
	// Node is the id of the node whose log holds the event (its single writer).
	Node string
	// Time is unix nanoseconds, stamped by the proposer. The state machine
	// uses it as "now"; it never reads a clock.
	Time int64
	// Type and Version select the payload's decoder.
	Type    Type
	Version uint16
	// AggKind and AggID name the aggregate the event is about (a claim id, a
	// VM id, a pool key).
	AggKind AggKind
	AggID   string
	// OpID is the idempotency key of the operation that produced the event;
	// every event of one append shares it.
	OpID OpID
	// Causation is the op id of the operation that caused this one (e.g. the
	// request an executor result answers); zero for external commands.
	Causation OpID
	// Payload is the type-specific body, encoded by the payload codec.
	Payload []byte
}

// Sentinel errors for invalid events. Validate wraps them in *InvalidError.
var (
	ErrUnknownType     = errors.New("unknown event type")
	ErrEmptyAggregate  = errors.New("empty aggregate id")
	ErrBadAggregate    = errors.New("aggregate kind does not match the event type")
	ErrPayloadTooLarge = errors.New("payload too large")
	ErrMissingOpID     = errors.New("missing op id")
)

// InvalidError says why an event was refused before anything was written.
type InvalidError struct {
	Type Type
	Err  error
	Info string
}

func (e *InvalidError) Error() string {
	if e.Info != "" {
		return fmt.Sprintf("invalid %s event: %v: %s", e.Type, e.Err, e.Info)
	}
	return fmt.Sprintf("invalid %s event: %v", e.Type, e.Err)
}

func (e *InvalidError) Unwrap() error { return e.Err }

// Validate checks what a proposer controls: a known type and version, an
// aggregate of the right kind with an id, an op id, and the payload limit.
// Seq and Node are the log's to assign and are not checked here.
func (e *Event) Validate() error {
	switch {
	case !e.Type.Known():
		return &InvalidError{Type: e.Type, Err: ErrUnknownType}
	case e.Version == 0 || e.Version > e.Type.Version():
		return &InvalidError{Type: e.Type, Err: ErrUnknownType, Info: fmt.Sprintf("version %d, this build knows 1..%d", e.Version, e.Type.Version())}
	case e.AggKind != e.Type.Aggregate():
		return &InvalidError{Type: e.Type, Err: ErrBadAggregate, Info: fmt.Sprintf("got %s, want %s", e.AggKind, e.Type.Aggregate())}
	case e.AggID == "":
		return &InvalidError{Type: e.Type, Err: ErrEmptyAggregate}
	case e.OpID == ZeroOpID:
		return &InvalidError{Type: e.Type, Err: ErrMissingOpID}
	case len(e.Payload) > MaxPayload:
		return &InvalidError{Type: e.Type, Err: ErrPayloadTooLarge, Info: fmt.Sprintf("%d bytes, limit %d", len(e.Payload), MaxPayload)}
	}
	return nil
}
