// Package event defines the op log's record: the envelope every event carries,
// the append-only enum of event types, op ids, and the binary codec with a
// checksum per record.
//
// The package is pure (no I/O, no clock, no randomness) so that the state
// machine in fsm can import it.
//
// Compatibility rules, enforced by tests with golden files in testdata/:
//   - A Type's number and string name never change and are never reused; new
//     types are appended.
//   - A payload's schema version only goes up. A decoder for every version that
//     can still be in a log stays forever; readers for a new type or version
//     ship before writers.
//   - The envelope encoding is versioned by its first byte after the checksum
//     (FormatV1). A record with a newer format is refused with ErrFormat, never
//     misread.
package event
