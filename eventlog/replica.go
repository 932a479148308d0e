package eventlog

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/cockroachdb/pebble/v2"

	"github.com/sbxlog/sbxlog/eventlog/event"
)

// ErrNotContiguous: AppendReplica was given events that do not continue the
// log exactly (a gap, an overlap, or sequences out of order).
var ErrNotContiguous = errors.New("eventlog: replica events do not continue the log")

// AppendReplica appends events copied from the log of the node this log is
// named after (a follower's verified replica), keeping their sequences. It
// returns once they are durable, like Append.
//
// The events must carry their original Seq and Node: Seq contiguous and
// starting at LastSeq()+1 (ErrNotContiguous otherwise), Node equal to the
// log's node (*NodeError otherwise), each valid (an error wrapping
// *event.InvalidError). Unlike Append, one call may hold several ops, and an
// op may be split across calls; the op index is kept exactly as the source's
// (one contiguous run per op id), so Verify holds on the replica and a
// replica can later be promoted to a writable log. An op id that reappears
// after its run ended is refused: the source is not a valid log.
//
// A replica must only be written through AppendReplica: Append would assign
// sequences of its own. Nothing is written when an error is returned.
func (l *Log) AppendReplica(ctx context.Context, evs []event.Event) error {
	if len(evs) == 0 {
		return ErrNoEvents
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	payloadBytes := 0
	for i := range evs {
		if err := evs[i].Validate(); err != nil {
			return fmt.Errorf("eventlog: replica event seq %d: %w", evs[i].Seq, err)
		}
		if evs[i].Node != l.node {
			return &NodeError{Dir: l.dir, Stored: l.node, Given: evs[i].Node}
		}
		if evs[i].Seq != evs[0].Seq+uint64(i) {
			return fmt.Errorf("%w: event %d of the batch has seq %d after %d", ErrNotContiguous, i, evs[i].Seq, evs[0].Seq+uint64(i)-1)
		}
		payloadBytes += len(evs[i].Payload)
	}
	if !l.gate.enter() {
		return ErrClosed
	}
	defer l.gate.exit()
	if l.readOnly {
		return ErrReadOnly
	}

	req := &request{id: evs[0].OpID, evs: l.own(evs, payloadBytes, false), done: make(chan struct{})}
	req.stage = func(b *pebble.Batch, next uint64) error {
		if req.evs[0].Seq != next {
			return fmt.Errorf("%w: the log ends at seq %d, the batch starts at %d", ErrNotContiguous, next-1, req.evs[0].Seq)
		}
		return l.stageReplica(b, req.evs)
	}
	return l.submit(ctx, req)
}

// stageReplica writes the records and the op-index entries of out into b.
// An op continuing the run that ends the log extends that run's entry.
// Committer only, with out[0].Seq == l.next.
func (l *Log) stageReplica(b *pebble.Batch, out []event.Event) error {
	prevID, hasPrev, err := l.lastOpID()
	if err != nil {
		return err
	}
	seen := map[event.OpID]bool{}
	for i := 0; i < len(out); {
		id, start := out[i].OpID, out[i].Seq
		j := i
		for j < len(out) && out[j].OpID == id {
			j++
		}
		if seen[id] {
			return fmt.Errorf("%w: op %s reappears at seq %d after its run ended", ErrNotContiguous, id, start)
		}
		seen[id] = true
		first, count := start, uint64(j-i)
		ofirst, ocount, found, err := lookupOp(l.db, id)
		if err != nil {
			return err
		}
		if found {
			if i != 0 || !hasPrev || prevID != id || ofirst+uint64(ocount) != start {
				return fmt.Errorf("%w: op %s at seq %d is already in the log at %d..%d", ErrNotContiguous, id, start, ofirst, ofirst+uint64(ocount)-1)
			}
			first, count = ofirst, uint64(ocount)+count
		}
		if count > uint64(^uint32(0)) {
			return fmt.Errorf("eventlog: op %s spans %d events", id, count)
		}
		var ov [12]byte
		binary.BigEndian.PutUint64(ov[:8], first)
		binary.BigEndian.PutUint32(ov[8:], uint32(count))
		_ = b.Set(opKey(id), ov[:], nil)
		i = j
	}
	for i := range out {
		l.putRecord(b, &out[i])
	}
	return nil
}

// lastOpID returns the op id of the event at l.next-1, if the log holds it.
// Committer only; applied batches are visible to reads before they sync.
func (l *Log) lastOpID() (event.OpID, bool, error) {
	if l.next <= l.first.Load() {
		return event.ZeroOpID, false, nil
	}
	if evs := l.ring.read(nil, l.next-1, l.next-1); len(evs) == 1 {
		return evs[0].OpID, true, nil
	}
	v, ok, err := l.get(EventKey(l.next - 1))
	if err != nil || !ok {
		return event.ZeroOpID, false, err
	}
	ev, err := event.Decode(v)
	if err != nil {
		return event.ZeroOpID, false, &CorruptError{Seq: l.next - 1, Err: err}
	}
	return ev.OpID, true, nil
}
