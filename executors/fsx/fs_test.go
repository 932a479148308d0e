package fsx

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/rs/zerolog"
)

// A hibernate-shaped sequence through the recorder: the steps come out in call
// order with their outcomes, and the real filesystem reflects them.
func TestRecorderRecordsInOrder(t *testing.T) {
	store := t.TempDir()
	run := filepath.Join(t.TempDir(), "run")
	var sunk []string
	rec := NewRecorder(NewOS(zerolog.Nop()))
	rec.Sink = func(s Step) { sunk = append(sunk, s.Op) }

	if err := rec.MkdirAll(run, 0o755); err != nil {
		t.Fatal(err)
	}
	disk := filepath.Join(run, "cow.raw")
	if err := os.WriteFile(disk, []byte("disk"), 0o600); err != nil {
		t.Fatal(err)
	}
	tmp, err := rec.MkTempDir(store, "hib")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rec.Clone(filepath.Join(tmp, "cow.raw"), disk); err != nil {
		t.Fatal(err)
	}
	if err := rec.Link(filepath.Join(run, "mr"), disk); err != nil {
		t.Fatal(err)
	}
	if err := rec.WriteFileAtomic(filepath.Join(tmp, "meta.json"), []byte("{}"), 0o600); err != nil {
		t.Fatal(err)
	}
	final := filepath.Join(store, "snap")
	if err := rec.RenameDir(tmp, final); err != nil {
		t.Fatal(err)
	}
	if err := rec.SyncTree(final); err != nil {
		t.Fatal(err)
	}
	if err := rec.RenameDir(tmp, final); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("second rename: %v", err)
	}
	if err := rec.RemoveAll(run); err != nil {
		t.Fatal(err)
	}

	var got []string
	for _, s := range rec.Steps() {
		got = append(got, s.String())
	}
	want := []string{
		"mkdirall " + run,
		"mktempdir " + store + " hib " + tmp,
		"clone " + filepath.Join(tmp, "cow.raw") + " " + disk,
		"link " + filepath.Join(run, "mr") + " " + disk,
		"write " + filepath.Join(tmp, "meta.json"),
		"rename " + tmp + " " + final,
		"synctree " + final,
		"rename " + tmp + " " + final,
		"removeall " + run,
	}
	if !slices.Equal(got, want) {
		t.Fatalf("steps\n got %q\nwant %q", got, want)
	}
	if steps := rec.Steps(); steps[7].Err == nil || steps[6].Err != nil {
		t.Fatalf("recorded errors wrong: %+v", steps)
	}
	if len(sunk) != len(want) || sunk[0] != OpMkdirAll || sunk[8] != OpRemoveAll {
		t.Fatalf("sink saw %q", sunk)
	}
	if b, err := os.ReadFile(filepath.Join(final, "cow.raw")); err != nil || string(b) != "disk" {
		t.Fatalf("snapshot disk: %q, %v", b, err)
	}
	if _, err := os.Stat(run); !os.IsNotExist(err) {
		t.Fatalf("run dir still there: %v", err)
	}
}

// Before aborts a chosen step without touching the filesystem, as a crash test does.
func TestRecorderBeforeAborts(t *testing.T) {
	store := t.TempDir()
	crash := errors.New("crash injected")
	rec := NewRecorder(NewOS(zerolog.Nop()))
	rec.Before = func(s Step) error {
		if s.Op == OpRename {
			return crash
		}
		return nil
	}
	tmp, err := rec.MkTempDir(store, "hib")
	if err != nil {
		t.Fatal(err)
	}
	final := filepath.Join(store, "snap")
	if err := rec.RenameDir(tmp, final); !errors.Is(err, crash) {
		t.Fatalf("aborted rename returned %v", err)
	}
	if _, err := os.Stat(final); !os.IsNotExist(err) {
		t.Fatal("aborted rename still ran")
	}
	if _, err := os.Stat(tmp); err != nil {
		t.Fatalf("temp dir gone after aborted rename: %v", err)
	}
	steps := rec.Steps()
	if len(steps) != 2 || steps[1].Op != OpRename || !errors.Is(steps[1].Err, crash) {
		t.Fatalf("steps %+v", steps)
	}
	// Aborting MkTempDir records the request without a created dir.
	rec.Before = func(Step) error { return crash }
	if d, err := rec.MkTempDir(store, "x"); d != "" || !errors.Is(err, crash) {
		t.Fatalf("aborted MkTempDir = %q, %v", d, err)
	}
	if s := rec.Steps()[2]; len(s.Paths) != 2 || s.Paths[1] != "x" {
		t.Fatalf("aborted mktempdir step %+v", s)
	}
}
