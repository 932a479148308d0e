package eventlog

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"slices"

	"github.com/cockroachdb/pebble/v2"

	"github.com/sbxlog/sbxlog/eventlog/event"
)

// VerifyReport summarises a verified log.
type VerifyReport struct {
	First, Last uint64 // retained sequence range (First > Last: none)
	Events      uint64
	Ops         uint64 // op-index entries checked
	Snapshots   int
}

// opRun is a maximal run of consecutive events sharing an op id.
type opRun struct {
	id          event.OpID
	start, size uint64
	cut         bool // the scan stopped right after it: it may be longer
}

// Verify reads the whole log and checks what recovery and replay rely on:
// sequences contiguous from FirstSeq to LastSeq, every record's checksum, its
// sequence matching its key and its node matching the log's, every op's
// events present as one contiguous run matching its op-index entry, no index
// entry pointing outside the log, and every snapshot's checksum. A failure is
// a *CorruptError naming the first bad sequence.
//
// On a live log it checks a consistent view that includes appends already in
// Pebble but not yet synced. Memory is proportional to the number of ops (the
// op index is checked by sorting runs by op id and merging them with the
// index, rather than one point lookup per op).
func (l *Log) Verify() (VerifyReport, error) {
	if !l.gate.enter() {
		return VerifyReport{}, ErrClosed
	}
	defer l.gate.exit()
	// Under commitMu every assigned sequence is in Pebble, so the view must
	// hold exactly first..next-1; trunMu keeps first and the view in step.
	l.trunMu.Lock()
	l.commitMu.Lock()
	snap := l.db.NewSnapshot()
	first, last := l.first.Load(), l.next-1
	l.commitMu.Unlock()
	l.trunMu.Unlock()
	defer snap.Close()
	rep := VerifyReport{First: first, Last: last}

	runs, scanned, scanErr := l.verifyEvents(snap, first, last, &rep)
	// Index problems among the events scanned so far may come before a scan
	// failure; report whichever sequence is first.
	ops, idxErr := verifyOpIndex(snap, runs, first, scanned, scanErr == nil)
	rep.Ops = ops
	if err := firstCorruption(scanErr, idxErr); err != nil {
		return rep, err
	}
	var err error
	rep.Snapshots, err = verifySnapshots(snap, last)
	return rep, err
}

// verifyEvents scans first..last and returns the op runs and the sequence
// the scan stopped before (last+1 when it found no problem).
func (l *Log) verifyEvents(r pebble.Reader, first, last uint64, rep *VerifyReport) ([]opRun, uint64, error) {
	it, err := r.NewIter(&pebble.IterOptions{LowerBound: []byte{prefixEvent}, UpperBound: []byte{prefixEvent + 1}})
	if err != nil {
		return nil, first, err
	}
	var runs []opRun
	expect := first
	scanErr := func() error {
		for ok := it.First(); ok; ok = it.Next() {
			k := it.Key()
			if len(k) != 9 {
				return &CorruptError{Seq: expect, Err: fmt.Errorf("malformed event key %x", k)}
			}
			seq := binary.BigEndian.Uint64(k[1:])
			switch {
			case seq < first:
				return &CorruptError{Seq: seq, Err: fmt.Errorf("record below the first retained seq %d", first)}
			case seq != expect:
				return &CorruptError{Seq: expect, Err: fmt.Errorf("missing record (next present is seq %d)", seq)}
			}
			v, err := it.ValueAndErr()
			if err != nil {
				return &CorruptError{Seq: seq, Err: err}
			}
			ev, err := event.Decode(v)
			switch {
			case err != nil:
				return &CorruptError{Seq: seq, Err: err}
			case ev.Seq != seq:
				return &CorruptError{Seq: seq, Err: fmt.Errorf("record carries seq %d", ev.Seq)}
			case ev.Node != l.node:
				return &CorruptError{Seq: seq, Err: fmt.Errorf("record of node %q in the log of node %q", ev.Node, l.node)}
			}
			if n := len(runs); n == 0 || runs[n-1].id != ev.OpID {
				runs = append(runs, opRun{id: ev.OpID, start: seq})
			}
			runs[len(runs)-1].size++
			rep.Events++
			expect++
		}
		if err := it.Error(); err != nil {
			return err
		}
		if expect != last+1 {
			return &CorruptError{Seq: expect, Err: fmt.Errorf("log ends at seq %d, expected %d", expect-1, last)}
		}
		return nil
	}()
	err = errors.Join(scanErr, it.Close())
	if ce, ok := err.(*CorruptError); ok {
		if n := len(runs); n > 0 && runs[n-1].start+runs[n-1].size >= ce.Seq {
			runs[n-1].cut = true
		}
		return runs, ce.Seq, err
	}
	return runs, last + 1, err
}

// verifyOpIndex merges the runs (sorted by op id) with the op index (stored
// in op id order). Each run must match its entry exactly, except that the
// run at FirstSeq may be the tail of an op whose head TruncatePrefix removed;
// an op id must not have two runs; an entry must not point past the log or
// at retained events that carry no such run. Entries for events at or past
// scanned (where the event scan stopped) are not judged.
func verifyOpIndex(r pebble.Reader, runs []opRun, first, scanned uint64, scanErrFree bool) (uint64, error) {
	slices.SortFunc(runs, func(a, b opRun) int { return bytes.Compare(a.id[:], b.id[:]) })
	var bad *CorruptError
	report := func(seq uint64, format string, args ...any) {
		if bad == nil || seq < bad.Seq {
			bad = &CorruptError{Seq: seq, Err: fmt.Errorf(format, args...)}
		}
	}
	for i := 1; i < len(runs); i++ {
		if runs[i].id == runs[i-1].id {
			report(max(runs[i].start, runs[i-1].start), "op %s appears twice, at seqs %d and %d", runs[i].id, runs[i-1].start, runs[i].start)
		}
	}
	it, err := r.NewIter(&pebble.IterOptions{LowerBound: []byte{prefixOp}, UpperBound: []byte{prefixOp + 1}})
	if err != nil {
		return 0, err
	}
	var n uint64
	i := 0
	for ok := it.First(); ok; ok = it.Next() {
		k, v := it.Key(), it.Value()
		if len(k) != 17 || len(v) != 12 {
			report(first, "malformed op-index entry %x", k)
			continue
		}
		n++
		var id event.OpID
		copy(id[:], k[1:])
		ofirst, count := binary.BigEndian.Uint64(v), uint64(binary.BigEndian.Uint32(v[8:]))
		end := ofirst + count - 1
		for ; i < len(runs) && bytes.Compare(runs[i].id[:], id[:]) < 0; i++ {
			report(runs[i].start, "op %s has no op-index entry", runs[i].id)
		}
		matched := i < len(runs) && runs[i].id == id
		switch {
		case ofirst == 0 || count == 0:
			report(first, "op-index entry of %s is empty (%d..%d)", id, ofirst, end)
		case matched:
			checkRun(runs[i], ofirst, count, first, report)
		case end < first:
			// The op's events were truncated away; the entry stays for dedupe.
		case ofirst >= scanned:
			// Not judged unless the scan reached the end of the log.
			if scanErrFree {
				report(scanned, "op-index entry of %s points at %d..%d, past the log's end %d", id, ofirst, end, scanned-1)
			}
		default:
			report(max(ofirst, first), "op-index entry of %s points at %d..%d, which hold no such op", id, ofirst, end)
		}
		for ; i < len(runs) && runs[i].id == id; i++ {
		}
	}
	for ; i < len(runs); i++ {
		report(runs[i].start, "op %s has no op-index entry", runs[i].id)
	}
	if err := errors.Join(it.Error(), it.Close()); err != nil {
		return n, err
	}
	if bad != nil {
		return n, bad
	}
	return n, nil
}

func checkRun(run opRun, ofirst uint64, count uint64, first uint64, report func(uint64, string, ...any)) {
	switch {
	case ofirst == run.start && count == run.size:
	case run.cut && ofirst == run.start && count > run.size:
	case run.start == first && ofirst < run.start && ofirst+count == run.start+run.size:
	case ofirst == run.start && count > run.size:
		report(run.start+run.size, "op %s is partial: %d of %d events", run.id, run.size, count)
	default:
		report(run.start, "op %s: run at %d of %d events, op index says %d of %d", run.id, run.start, run.size, ofirst, count)
	}
}

// firstCorruption returns the error with the smallest sequence; a
// non-corruption error (I/O) wins.
func firstCorruption(errs ...error) error {
	var best *CorruptError
	for _, err := range errs {
		if err == nil {
			continue
		}
		var ce *CorruptError
		if !errors.As(err, &ce) {
			return err
		}
		if best == nil || ce.Seq < best.Seq {
			best = ce
		}
	}
	if best == nil {
		return nil
	}
	return best
}

func verifySnapshots(r pebble.Reader, last uint64) (int, error) {
	it, err := r.NewIter(&pebble.IterOptions{LowerBound: []byte{prefixSnapshot}, UpperBound: []byte{prefixSnapshot + 1}})
	if err != nil {
		return 0, err
	}
	n := 0
	verr := func() error {
		for ok := it.First(); ok; ok = it.Next() {
			seq := binary.BigEndian.Uint64(it.Key()[1:])
			v, err := it.ValueAndErr()
			if err != nil {
				return &CorruptError{Seq: seq, Err: fmt.Errorf("snapshot: %w", err)}
			}
			if len(v) < 4 || binary.LittleEndian.Uint32(v) != crc32.Checksum(v[4:], castagnoli) {
				return &CorruptError{Seq: seq, Err: errors.New("snapshot checksum mismatch")}
			}
			if seq > last {
				return &CorruptError{Seq: seq, Err: fmt.Errorf("snapshot past the log's end %d", last)}
			}
			n++
		}
		return it.Error()
	}()
	return n, errors.Join(verr, it.Close())
}
