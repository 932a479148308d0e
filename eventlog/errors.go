package eventlog

import (
	"errors"
	"fmt"
)

// Sentinel errors.
var (
	// ErrClosed: the log (or the subscription) was closed.
	ErrClosed = errors.New("eventlog: closed")
	// ErrReadOnly: the log was opened with Options.ReadOnly.
	ErrReadOnly = errors.New("eventlog: opened read-only")
	// ErrCompacted: the requested sequence was removed by TruncatePrefix.
	ErrCompacted = errors.New("eventlog: sequence compacted away")
	// ErrNoSnapshot: no snapshot has been saved.
	ErrNoSnapshot = errors.New("eventlog: no snapshot")
	// ErrNoEvents: Append was called with no events.
	ErrNoEvents = errors.New("eventlog: append of no events")
	// ErrMixedOpIDs: the events of one Append carry different op ids.
	ErrMixedOpIDs = errors.New("eventlog: events of one append carry different op ids")
	// ErrAppendTooLarge: one Append's records exceed MaxAppendBytes.
	ErrAppendTooLarge = errors.New("eventlog: append too large")
	// ErrFailed: a WAL sync failed. Whether the data reached the disk is
	// unknown, so the log refuses further appends until it is reopened (which
	// recovers exactly what is on disk).
	ErrFailed = errors.New("eventlog: log failed, reopen it")
)

// FormatError means the on-disk log was written by a newer build.
type FormatError struct {
	Dir       string
	OnDisk    uint32 // version found in the log
	Supported uint32 // newest version this build reads
}

func (e *FormatError) Error() string {
	return fmt.Sprintf("eventlog: %s has on-disk format version %d, this build supports up to version %d; upgrade sbxlog to open it",
		e.Dir, e.OnDisk, e.Supported)
}

// NodeError means the log belongs to another node: one log has one writer
// identity, stamped into every event.
type NodeError struct {
	Dir    string
	Stored string // node id recorded in the log
	Given  string // Options.NodeID
}

func (e *NodeError) Error() string {
	return fmt.Sprintf("eventlog: %s belongs to node %q, refusing to open it as node %q", e.Dir, e.Stored, e.Given)
}

// CorruptError reports a record that cannot be trusted: a checksum mismatch,
// a record whose sequence differs from its key, a gap, or a broken op index.
type CorruptError struct {
	Seq uint64 // first bad sequence
	Err error
}

func (e *CorruptError) Error() string {
	return fmt.Sprintf("eventlog: corrupt at seq %d: %v", e.Seq, e.Err)
}

func (e *CorruptError) Unwrap() error { return e.Err }
