package event

import (
	"encoding/json"
	"errors"
	"fmt"
)

// Payload is a typed event body. Each payload struct names its Type; its
// schema version is the Type's current Version.
type Payload interface {
	EventType() Type
}

// ErrNoDecoder means the log holds a type or version this build cannot read.
var ErrNoDecoder = errors.New("no decoder for event type/version")

// decodeFunc decodes one schema version of one type.
type decodeFunc func([]byte) (Payload, error)

// decoders maps type -> version -> decoder. Versions are never removed: a log
// written by an older build must stay readable by every newer one.
var decoders = map[Type]map[uint16]decodeFunc{}

// registerJSON registers the JSON decoder of version v of P's type.
func registerJSON[P Payload](v uint16) {
	var zero P
	t := zero.EventType()
	if decoders[t] == nil {
		decoders[t] = map[uint16]decodeFunc{}
	}
	decoders[t][v] = func(b []byte) (Payload, error) {
		var p P
		if err := json.Unmarshal(b, &p); err != nil {
			return nil, err
		}
		return p, nil
	}
}

// EncodePayload encodes p at its type's current version.
func EncodePayload(p Payload) ([]byte, error) {
	return json.Marshal(p)
}

// DecodePayload decodes a payload of type t written at schema version v.
func DecodePayload(t Type, v uint16, b []byte) (Payload, error) {
	dec, ok := decoders[t][v]
	if !ok {
		return nil, fmt.Errorf("%w: %s v%d", ErrNoDecoder, t, v)
	}
	p, err := dec(b)
	if err != nil {
		return nil, fmt.Errorf("decode %s v%d: %w", t, v, err)
	}
	return p, nil
}

// Decode decodes e's payload.
func (e *Event) Decode() (Payload, error) { return DecodePayload(e.Type, e.Version, e.Payload) }

// New builds an unsequenced event carrying p. aggID names the aggregate; op
// and cause are the op and causation ids; t is the proposer's time.
func New(p Payload, aggID string, op, cause OpID, t int64) (Event, error) {
	typ := p.EventType()
	b, err := EncodePayload(p)
	if err != nil {
		return Event{}, fmt.Errorf("encode %s: %w", typ, err)
	}
	e := Event{Time: t, Type: typ, Version: typ.Version(), AggKind: typ.Aggregate(), AggID: aggID, OpID: op, Causation: cause, Payload: b}
	if err := e.Validate(); err != nil {
		return Event{}, err
	}
	return e, nil
}
