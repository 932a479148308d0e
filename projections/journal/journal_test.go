package journal_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sbxlog/sbxlog/projections/journal"
)

// lines is a Folder that keeps every line; its state is the number of
// records: restored from the checkpoint, folded at Open, appended since.
type lines struct {
	restored int
	folded   []string
	appended int
}

var _ journal.Folder = (*lines)(nil)

func (l *lines) Restore(st json.RawMessage) error {
	if st == nil {
		return nil
	}
	return json.Unmarshal(st, &l.restored)
}
func (l *lines) Fold(line []byte) error { l.folded = append(l.folded, string(line)); return nil }
func (l *lines) Checkpoint() (json.RawMessage, error) {
	return json.Marshal(l.restored + len(l.folded) + l.appended)
}

func rec(node string, seq uint64) journal.Record {
	return journal.Record{Node: node, Seq: seq, Line: []byte(fmt.Sprintf(`{"node":%q,"seq":%d,"x":"y"}`, node, seq))}
}

func open(t *testing.T, path string, every int) (*journal.Journal, *lines) {
	t.Helper()
	f := &lines{}
	j, err := journal.Open(path, f, journal.Options{CheckpointEvery: every})
	if err != nil {
		t.Fatal(err)
	}
	return j, f
}

func TestAppendReopenAndCheckpoint(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	j, f := open(t, path, 3)
	if len(f.folded) != 0 || j.High("a") != 0 {
		t.Fatalf("fresh journal: %v %d", f.folded, j.High("a"))
	}
	for i := uint64(1); i <= 4; i++ {
		f.appended += 2 // a consumer updates its state, then appends
		if err := j.Append([]journal.Record{rec("a", i), rec("b", 10+i)}); err != nil {
			t.Fatal(err)
		}
	}
	if j.High("a") != 4 || j.High("b") != 14 {
		t.Fatalf("highs %v", j.Highs())
	}
	size := j.Size()
	// Not closed: reopen as after a crash. The last checkpoint was taken
	// after 8 records (every 3 -> after the 2nd and 4th append), so nothing
	// is left to fold.
	j2, f2 := open(t, path, 3)
	if j2.High("a") != 4 || j2.High("b") != 14 || j2.Size() != size {
		t.Fatalf("after reopen: highs %v size %d/%d", j2.Highs(), j2.Size(), size)
	}
	if f2.restored != 8 || len(f2.folded) != 0 {
		t.Fatalf("restored %d, folded %v", f2.restored, f2.folded)
	}
	if err := j2.Append([]journal.Record{rec("a", 5)}); err != nil {
		t.Fatal(err)
	}
	// Reopen again without closing: the line after the checkpoint is folded.
	j3, f3 := open(t, path, 100)
	if f3.restored != 8 || len(f3.folded) != 1 || !strings.Contains(f3.folded[0], `"seq":5`) || j3.High("a") != 5 {
		t.Fatalf("restored %d folded %v high %d", f3.restored, f3.folded, j3.High("a"))
	}
	if err := j3.Close(); err != nil {
		t.Fatal(err)
	}
	if err := j3.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(data), "\n"); n != 9 {
		t.Fatalf("%d lines in the file:\n%s", n, data)
	}
}

// A crash in the middle of a write leaves a partial line: Open cuts it and
// the high mark ignores it.
func TestTornTailIsCut(t *testing.T) {
	path := filepath.Join(t.TempDir(), "usage.jsonl")
	j, _ := open(t, path, 1000)
	if err := j.Append([]journal.Record{rec("a", 1), rec("a", 2)}); err != nil {
		t.Fatal(err)
	}
	good := j.Size()
	fh, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fh.WriteString(`{"node":"a","seq":3,"x":"tr`); err != nil {
		t.Fatal(err)
	}
	fh.Close()
	j2, f2 := open(t, path, 1000)
	if j2.High("a") != 2 || j2.Size() != good || len(f2.folded) != 2 {
		t.Fatalf("after torn tail: high %d size %d (want %d) folded %d", j2.High("a"), j2.Size(), good, len(f2.folded))
	}
	if st, _ := os.Stat(path); st.Size() != good {
		t.Fatalf("file not cut: %d bytes", st.Size())
	}
	if err := j2.Append([]journal.Record{rec("a", 3)}); err != nil {
		t.Fatal(err)
	}
	_, f3 := open(t, path, 1000)
	if len(f3.folded) != 3 || !strings.HasSuffix(f3.folded[2], `"x":"y"}`) {
		t.Fatalf("folded %v", f3.folded)
	}
}

func TestCorruptionRefused(t *testing.T) {
	dir := t.TempDir()
	for name, setup := range map[string]func(path string){
		"unkeyed line": func(path string) {
			_ = os.WriteFile(path, []byte("{\"node\":\"a\",\"seq\":1}\n{\"hello\":1}\n"), 0o640)
		},
		"not json": func(path string) {
			_ = os.WriteFile(path, []byte("garbage\n"), 0o640)
		},
		"shorter than checkpoint": func(path string) {
			j, _ := open(t, path, 1)
			_ = j.Append([]journal.Record{rec("a", 1)})
			_ = j.Close()
			_ = os.Truncate(path, 3)
		},
		"bad checkpoint": func(path string) {
			_ = os.WriteFile(path+".ckpt", []byte("{"), 0o640)
		},
	} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(dir, strings.ReplaceAll(name, " ", "_")+".jsonl")
			setup(path)
			_, err := journal.Open(path, &lines{}, journal.Options{})
			var ce *journal.CorruptError
			if !errors.As(err, &ce) {
				t.Fatalf("Open: %v, want *CorruptError", err)
			}
		})
	}
}

func TestAppendRefusesNewline(t *testing.T) {
	j, _ := open(t, filepath.Join(t.TempDir(), "j.jsonl"), 10)
	if err := j.Append([]journal.Record{{Node: "a", Seq: 1, Line: []byte("{\n}")}}); err == nil {
		t.Fatal("accepted a line with a newline")
	}
	if j.Size() != 0 {
		t.Fatalf("wrote %d bytes", j.Size())
	}
}
