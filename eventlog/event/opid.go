package event

import (
	"crypto/sha256"
	"encoding/binary"

	"github.com/oklog/ulid/v2"
)

// OpID identifies an operation: the idempotency key of a command and of each
// executor step. It is a ULID, minted by whoever proposes the command (an HTTP
// handler, a timer), never inside the state machine.
type OpID = ulid.ULID

// ZeroOpID is the absent op id.
var ZeroOpID OpID

// DeriveOpID returns a deterministic op id for a step caused by parent, such as
// an executor's result event. A crash that re-runs the step derives the same
// id, so the log's op-id dedupe turns the second append into a no-op. The
// derived id keeps the parent's timestamp, so ids still sort by time.
func DeriveOpID(parent OpID, label string) OpID {
	h := sha256.New()
	h.Write(parent[:])
	h.Write([]byte(label))
	sum := h.Sum(nil)
	var id OpID
	copy(id[:6], parent[:6]) // ULID timestamp: 48 bits
	copy(id[6:], sum[:10])
	return id
}

// OpIDFromUint builds an op id from a timestamp in ms and a counter. It is for
// tests and deterministic generators, which must not read entropy.
func OpIDFromUint(ms uint64, n uint64) OpID {
	var id OpID
	var ts [8]byte
	binary.BigEndian.PutUint64(ts[:], ms)
	copy(id[:6], ts[2:])
	binary.BigEndian.PutUint64(id[8:], n)
	return id
}
