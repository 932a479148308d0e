// Package journal is the append-only JSON-lines file behind the audit and
// usage consumers: one JSON object per line, each produced by one event and
// keyed by that event's (node, seq), so a consumer restarted at any point
// writes every record exactly once.
//
// Contract:
//   - Append writes its lines with one write and fsyncs before returning;
//     the highest sequence per node (High) then covers them. The feed
//     acknowledges only after Append returns.
//   - Open recovers what a crash left: a torn last line (no newline) is cut
//     off, and the high marks and the consumer's state (Folder) are rebuilt
//     from the last checkpoint plus the lines after it. A crash can still
//     leave only some lines of one event's records; the consumer repairs
//     that after Open (usage writes a missing summary).
//   - A checkpoint (<path>.ckpt: file offset, high marks, the consumer's
//     state) is written atomically every CheckpointEvery records and at
//     Close, so Open reads O(records since the checkpoint), not the file.
//   - A complete line that is not a JSON object with "node" and "seq", or a
//     file shorter than its checkpoint, is refused with *CorruptError: the
//     journal was edited, truncated or replaced behind the consumer's back.
package journal

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"sync"
)

// Folder rebuilds a consumer's state from its journal.
type Folder interface {
	// Restore loads state saved by Checkpoint (nil: start empty).
	Restore(state json.RawMessage) error
	// Fold replays one line written after the checkpoint, in file order.
	Fold(line []byte) error
	// Checkpoint returns the state to save with the next checkpoint.
	Checkpoint() (json.RawMessage, error)
}

// Record is one line to append: a JSON object carrying Node and Seq.
type Record struct {
	Node string
	Seq  uint64
	Line []byte // without the trailing newline
}

// CorruptError: the journal cannot be trusted.
type CorruptError struct {
	Path   string
	Offset int64
	Err    error
}

func (e *CorruptError) Error() string {
	return fmt.Sprintf("journal %s at offset %d: %v", e.Path, e.Offset, e.Err)
}

func (e *CorruptError) Unwrap() error { return e.Err }

// Options configure Open.
type Options struct {
	// CheckpointEvery is the number of records between checkpoints
	// (default 4096).
	CheckpointEvery int
}

// Journal is one open journal. Append and Close are for one goroutine;
// High may be called from any.
type Journal struct {
	path   string
	ckpt   string
	f      *os.File
	folder Folder
	every  int

	mu    sync.Mutex
	size  int64
	high  map[string]uint64
	since int
	buf   []byte
}

type checkpoint struct {
	Offset int64             `json:"offset"`
	High   map[string]uint64 `json:"high"`
	State  json.RawMessage   `json:"state,omitempty"`
}

// Open opens (creating) the journal at path and rebuilds folder's state.
func Open(path string, folder Folder, opts Options) (*Journal, error) {
	if opts.CheckpointEvery <= 0 {
		opts.CheckpointEvery = 4096
	}
	j := &Journal{path: path, ckpt: path + ".ckpt", folder: folder, every: opts.CheckpointEvery, high: map[string]uint64{}}
	var cp checkpoint
	switch data, err := os.ReadFile(j.ckpt); {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return nil, fmt.Errorf("journal: read checkpoint: %w", err)
	default:
		if err := json.Unmarshal(data, &cp); err != nil {
			return nil, &CorruptError{Path: j.ckpt, Err: fmt.Errorf("checkpoint: %w", err)}
		}
		maps.Copy(j.high, cp.High)
	}
	if err := folder.Restore(cp.State); err != nil {
		return nil, fmt.Errorf("journal: restore checkpoint state: %w", err)
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o640)
	if err != nil {
		return nil, fmt.Errorf("journal: %w", err)
	}
	j.f = f
	if err := j.recover(cp.Offset); err != nil {
		_ = f.Close()
		return nil, err
	}
	return j, nil
}

// recover folds the lines after offset and cuts a torn tail.
func (j *Journal) recover(offset int64) error {
	st, err := j.f.Stat()
	if err != nil {
		return fmt.Errorf("journal: %w", err)
	}
	if st.Size() < offset {
		return &CorruptError{Path: j.path, Offset: st.Size(), Err: fmt.Errorf("file is shorter than its checkpoint (offset %d)", offset)}
	}
	if _, err := j.f.Seek(offset, io.SeekStart); err != nil {
		return fmt.Errorf("journal: %w", err)
	}
	r := bufio.NewReaderSize(j.f, 1<<16)
	pos := offset
	for {
		line, err := r.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			// A line longer than the buffer: collect it whole.
			long := append([]byte(nil), line...)
			for errors.Is(err, bufio.ErrBufferFull) {
				line, err = r.ReadSlice('\n')
				long = append(long, line...)
			}
			line = long
		}
		if errors.Is(err, io.EOF) {
			if len(line) > 0 {
				// Torn by a crash mid-write: the event was never acknowledged
				// and will be delivered again.
				if err := j.f.Truncate(pos); err != nil {
					return fmt.Errorf("journal: cut torn tail: %w", err)
				}
				if err := j.f.Sync(); err != nil {
					return fmt.Errorf("journal: %w", err)
				}
			}
			break
		}
		if err != nil {
			return fmt.Errorf("journal: read: %w", err)
		}
		body := bytes.TrimSuffix(line, []byte{'\n'})
		var k struct {
			Node string  `json:"node"`
			Seq  *uint64 `json:"seq"`
		}
		if err := json.Unmarshal(body, &k); err != nil || k.Node == "" || k.Seq == nil {
			return &CorruptError{Path: j.path, Offset: pos, Err: fmt.Errorf("line is not a keyed record: %.80q", body)}
		}
		if err := j.folder.Fold(body); err != nil {
			return &CorruptError{Path: j.path, Offset: pos, Err: err}
		}
		j.high[k.Node] = max(j.high[k.Node], *k.Seq)
		pos += int64(len(line))
		j.since++
	}
	if _, err := j.f.Seek(pos, io.SeekStart); err != nil {
		return fmt.Errorf("journal: %w", err)
	}
	j.size = pos
	return nil
}

// High is the highest sequence of node with a record in the journal.
func (j *Journal) High(node string) uint64 {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.high[node]
}

// Highs returns a copy of every node's high mark.
func (j *Journal) Highs() map[string]uint64 {
	j.mu.Lock()
	defer j.mu.Unlock()
	return maps.Clone(j.high)
}

// Size is the journal's length in bytes.
func (j *Journal) Size() int64 {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.size
}

// Append writes recs, in order, durably.
func (j *Journal) Append(recs []Record) error {
	if len(recs) == 0 {
		return nil
	}
	if j.f == nil {
		return errors.New("journal: closed")
	}
	j.buf = j.buf[:0]
	for _, r := range recs {
		if bytes.IndexByte(r.Line, '\n') >= 0 {
			return fmt.Errorf("journal: record of %s seq %d contains a newline", r.Node, r.Seq)
		}
		j.buf = append(j.buf, r.Line...)
		j.buf = append(j.buf, '\n')
	}
	n, err := j.f.Write(j.buf)
	if err == nil {
		err = j.f.Sync()
	}
	if err != nil {
		// Cut what was written so a retry cannot follow a partial batch;
		// if even that fails, Open's recovery will.
		if n > 0 {
			_ = j.f.Truncate(j.size)
			_, _ = j.f.Seek(j.size, io.SeekStart)
		}
		return fmt.Errorf("journal: write: %w", err)
	}
	j.mu.Lock()
	j.size += int64(n)
	for _, r := range recs {
		j.high[r.Node] = max(j.high[r.Node], r.Seq)
	}
	j.mu.Unlock()
	j.since += len(recs)
	if j.since >= j.every {
		return j.Checkpoint()
	}
	return nil
}

// Checkpoint saves the offset, high marks and the consumer's state.
func (j *Journal) Checkpoint() error {
	state, err := j.folder.Checkpoint()
	if err != nil {
		return fmt.Errorf("journal: checkpoint state: %w", err)
	}
	j.mu.Lock()
	data, err := json.Marshal(checkpoint{Offset: j.size, High: j.high, State: state})
	j.mu.Unlock()
	if err != nil {
		return fmt.Errorf("journal: checkpoint: %w", err)
	}
	if err := writeAtomic(j.ckpt, data); err != nil {
		return fmt.Errorf("journal: checkpoint: %w", err)
	}
	j.since = 0
	return nil
}

// Close checkpoints and closes the file. Idempotent.
func (j *Journal) Close() error {
	if j.f == nil {
		return nil
	}
	err := j.Checkpoint()
	err = errors.Join(err, j.f.Close())
	j.f = nil
	return err
}

// writeAtomic replaces path with data: temp file, fsync, rename, fsync of
// the directory, so a crash leaves the old or the new file, never a mix.
func writeAtomic(path string, data []byte) error {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o640)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.Remove(tmp)
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	d, err := os.Open(filepath.Dir(path))
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
