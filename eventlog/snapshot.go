package eventlog

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"

	"github.com/cockroachdb/pebble/v2"
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// SaveSnapshot durably stores data as the state after applying every event
// up to seq, so a restart loads it and replays only the tail. seq must be
// durable and not compacted away. The previous snapshot is kept as a
// fallback; older ones are deleted in the same batch.
func (l *Log) SaveSnapshot(seq uint64, data []byte) error {
	return l.maintain(func() error { return l.saveSnapshot(seq, data) })
}

func (l *Log) saveSnapshot(seq uint64, data []byte) error {
	if last := l.durable.Load(); seq > last {
		return fmt.Errorf("eventlog: snapshot at seq %d is past the last durable seq %d", seq, last)
	}
	if first := l.first.Load(); seq+1 < first {
		return fmt.Errorf("%w: snapshot at seq %d, first retained is %d", ErrCompacted, seq, first)
	}
	prev, err := l.snapshotSeqs(seq)
	if err != nil {
		return err
	}
	b := l.db.NewBatch()
	defer b.Close()
	v := make([]byte, 4, 4+len(data))
	binary.LittleEndian.PutUint32(v, crc32.Checksum(data, castagnoli))
	v = append(v, data...)
	_ = b.Set(appendSeqKey(nil, prefixSnapshot, seq), v, nil)
	if len(prev) > 1 {
		// Keep the newest earlier snapshot, drop everything before it.
		_ = b.DeleteRange(appendSeqKey(nil, prefixSnapshot, 0), appendSeqKey(nil, prefixSnapshot, prev[len(prev)-1]), nil)
	}
	if err := b.Commit(pebble.Sync); err != nil {
		return fmt.Errorf("eventlog: save snapshot: %w", err)
	}
	return nil
}

// snapshotSeqs lists the sequences of stored snapshots below seq, ascending.
func (l *Log) snapshotSeqs(below uint64) ([]uint64, error) {
	it, err := l.db.NewIter(&pebble.IterOptions{
		LowerBound: []byte{prefixSnapshot},
		UpperBound: appendSeqKey(nil, prefixSnapshot, below),
	})
	if err != nil {
		return nil, err
	}
	var out []uint64
	for ok := it.First(); ok; ok = it.Next() {
		out = append(out, binary.BigEndian.Uint64(it.Key()[1:]))
	}
	return out, errors.Join(it.Error(), it.Close())
}

// LatestSnapshot returns the newest intact snapshot. A snapshot whose
// checksum fails is logged and skipped in favour of the previous one, which
// is equally valid (replay covers the longer tail). ErrNoSnapshot when none
// is usable.
func (l *Log) LatestSnapshot() (seq uint64, data []byte, err error) {
	if !l.gate.enter() {
		return 0, nil, ErrClosed
	}
	defer l.gate.exit()
	return l.latestSnapshot()
}

func (l *Log) latestSnapshot() (uint64, []byte, error) {
	it, err := l.db.NewIter(&pebble.IterOptions{LowerBound: []byte{prefixSnapshot}, UpperBound: []byte{prefixSnapshot + 1}})
	if err != nil {
		return 0, nil, err
	}
	defer it.Close()
	first := l.first.Load()
	for ok := it.Last(); ok; ok = it.Prev() {
		seq := binary.BigEndian.Uint64(it.Key()[1:])
		if seq+1 < first {
			break
		}
		v, err := it.ValueAndErr()
		if err != nil {
			return 0, nil, fmt.Errorf("eventlog: read snapshot at seq %d: %w", seq, err)
		}
		if len(v) < 4 || binary.LittleEndian.Uint32(v) != crc32.Checksum(v[4:], castagnoli) {
			l.log.Error().Uint64("seq", seq).Msg("eventlog: snapshot checksum mismatch; falling back to the previous snapshot")
			continue
		}
		return seq, append([]byte(nil), v[4:]...), nil
	}
	if err := it.Error(); err != nil {
		return 0, nil, err
	}
	return 0, nil, ErrNoSnapshot
}

// TruncatePrefix removes events before seq before, keeping snapshot
// consistency: a usable snapshot at seq >= before-1 must exist (so the state
// at any retained position can still be rebuilt), and snapshots that would
// need removed events are deleted with them. Op-index entries are kept, so a
// retried op older than the prefix is still recognised (Append then returns
// ErrCompacted with Duplicate set). Truncating at or below FirstSeq is a
// no-op.
func (l *Log) TruncatePrefix(before uint64) error {
	return l.maintain(func() error { return l.truncatePrefix(before) })
}

func (l *Log) truncatePrefix(before uint64) error {
	first := l.first.Load()
	if before <= first {
		return nil
	}
	if last := l.durable.Load(); before > last+1 {
		return fmt.Errorf("eventlog: truncate before %d is past the last durable seq %d", before, last)
	}
	snap, _, err := l.latestSnapshot()
	if errors.Is(err, ErrNoSnapshot) {
		return fmt.Errorf("eventlog: truncate before %d: %w to rebuild state from", before, ErrNoSnapshot)
	}
	if err != nil {
		return err
	}
	if snap+1 < before {
		return fmt.Errorf("eventlog: truncate before %d would drop events after the latest snapshot at seq %d", before, snap)
	}
	b := l.db.NewBatch()
	defer b.Close()
	_ = b.DeleteRange(appendSeqKey(nil, prefixEvent, 0), appendSeqKey(nil, prefixEvent, before), nil)
	_ = b.DeleteRange(appendSeqKey(nil, prefixSnapshot, 0), appendSeqKey(nil, prefixSnapshot, before-1), nil)
	_ = b.Set(keyFirst, binary.BigEndian.AppendUint64(nil, before), nil)
	if err := b.Commit(pebble.Sync); err != nil {
		return fmt.Errorf("eventlog: truncate: %w", err)
	}
	l.first.Store(before)
	return nil
}

// maintain runs a write other than Append (snapshots, truncation): through
// the gate, refused when read-only, one at a time so a truncation never races
// the snapshot it relies on.
func (l *Log) maintain(fn func() error) error {
	if !l.gate.enter() {
		return ErrClosed
	}
	defer l.gate.exit()
	if l.readOnly {
		return ErrReadOnly
	}
	l.trunMu.Lock()
	defer l.trunMu.Unlock()
	return fn()
}
