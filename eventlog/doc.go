// Package eventlog is the node's durable op log: an append-only sequence of
// event.Event records in Pebble, numbered contiguously from 1, with
// group-committed durable appends, op-id idempotency, streaming reads, tail
// subscriptions and state snapshots.
//
// Contract:
//   - Append returns only once its events are durable (pebble.Sync). Concurrent
//     appends share WAL fsyncs (group commit). Sequences are assigned in the
//     same order the batches enter Pebble's WAL, so a crash can only lose a
//     suffix of appends that were never acknowledged: recovered sequences are
//     always contiguous and every acknowledged event is present.
//   - All events of one Append share one op id and are written in one Pebble
//     batch together with their op-id index entry: after a crash an op is
//     either entirely in the log or not at all. Appending an op id that is
//     already in the log (or in flight) writes nothing and returns the original
//     events with Duplicate set.
//   - Readers (Read, Iterate, Subscribe, LastSeq) only ever see durable events.
//     A subscription delivers every event from its start in order with no gap;
//     it is served from an in-memory ring of recent events and falls back to
//     Pebble when it lags, so it never blocks appends and never drops events.
//   - Begin/Wait split an Append: Begin fixes the op's place in the log
//     (call order), Wait waits for durability, so a caller can order its
//     appends under its own lock and still share fsyncs.
//   - An uncontended append commits and waits for its fsync on its own
//     goroutine. Under contention a writable log's two goroutines take over:
//     a committer that batches queued appends into one Pebble write and a
//     syncer that waits for the WAL fsync and publishes (see append.go).
//     Close waits for calls in progress, stops both after every applied batch
//     is synced, then closes Pebble.
//
// On-disk layout (format version FormatVersion, stored under "m/format"; a
// newer version is refused with *FormatError):
//
//	"e" + seq (8 bytes big-endian)   -> record (event.AppendEncode, carries seq too)
//	"o" + op id (16 bytes)           -> first seq (8 bytes BE) + event count (4 bytes BE)
//	"s" + seq (8 bytes big-endian)   -> crc32c (4 bytes LE) + snapshot bytes
//	"m/format"                       -> format version (4 bytes BE)
//	"m/node"                         -> node id of the log's single writer
//	"m/first"                        -> first retained seq after TruncatePrefix (8 bytes BE)
//
// Errors: ErrClosed, ErrReadOnly, ErrCompacted, ErrNoSnapshot, ErrNoEvents,
// ErrMixedOpIDs, ErrAppendTooLarge, ErrFailed (and ErrNotContiguous for
// AppendReplica) are sentinels (use errors.Is);
// *FormatError, *NodeError and *CorruptError carry details (use errors.As).
// Invalid events are refused with an error wrapping *event.InvalidError.
package eventlog
