package fsx

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestLink(t *testing.T) {
	dir := t.TempDir()
	src, dst, other := filepath.Join(dir, "memory-ranges"), filepath.Join(dir, "run", "memory-ranges"), filepath.Join(dir, "other")
	for _, p := range []string{src, other} {
		if err := os.WriteFile(p, []byte(p), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Dir(dst), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := Link(dst, src); err != nil {
		t.Fatal(err)
	}
	if err := Link(dst, src); err != nil {
		t.Fatalf("re-link of the same inode: %v, want success", err)
	}
	a, _ := os.Stat(src)
	b, _ := os.Stat(dst)
	if !os.SameFile(a, b) {
		t.Fatal("dst is not a hard link of src")
	}
	if err := Link(dst, other); !errors.Is(err, fs.ErrExist) {
		t.Fatalf("link over a different file: %v, want ErrExist", err)
	}
	if err := Link(filepath.Join(dir, "x"), filepath.Join(dir, "missing")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("link of a missing file: %v, want ErrNotExist", err)
	}
}

func TestWriteFileAtomic(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "meta.json")
	for i, content := range []string{`{"v":1}`, `{"v":2,"longer":true}`, ``} {
		if err := WriteFileAtomic(p, []byte(content), 0o640); err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
		got, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != content {
			t.Fatalf("write %d: read %q, want %q", i, got, content)
		}
		st, _ := os.Stat(p)
		if st.Mode().Perm() != 0o640 {
			t.Fatalf("mode %v, want 0640", st.Mode().Perm())
		}
		assertOnly(t, dir, "meta.json")
	}

	missing := filepath.Join(dir, "nope", "meta.json")
	if err := WriteFileAtomic(missing, []byte("x"), 0o600); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("write into a missing dir: %v, want ErrNotExist", err)
	}

	// A failed rename (target is a non-empty directory) must leave no temp file.
	blocker := filepath.Join(dir, "blocker")
	if err := os.MkdirAll(filepath.Join(blocker, "child"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := WriteFileAtomic(blocker, []byte("x"), 0o600); err == nil {
		t.Fatal("write over a non-empty directory succeeded")
	}
	assertOnly(t, dir, "blocker", "meta.json")
}

// assertOnly fails unless dir holds exactly names (sorted).
func assertOnly(t *testing.T, dir string, names ...string) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range ents {
		got = append(got, e.Name())
	}
	if !slices.Equal(got, names) {
		t.Fatalf("%s holds %q, want %q", dir, got, names)
	}
}

func TestSyncTreeOrder(t *testing.T) {
	root := t.TempDir()
	snap := filepath.Join(root, "snap")
	for _, p := range []string{"a/b/deep", "a/file2", "config.json", "memory-ranges", "c/x"} {
		full := filepath.Join(snap, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(p), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("config.json", filepath.Join(snap, "link")); err != nil {
		t.Fatal(err)
	}
	var order []string
	err := syncTree(snap, func(p string) error {
		rel, _ := filepath.Rel(root, p)
		order = append(order, rel)
		return syncPath(p)
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		// every regular file first
		"snap/a/b/deep", "snap/a/file2", "snap/c/x", "snap/config.json", "snap/memory-ranges",
		// directories below snap, deepest first
		"snap/a/b", "snap/a", "snap/c",
		// snap, then its parent
		"snap", ".",
	}
	if !slices.Equal(order, want) {
		t.Fatalf("fsync order\n got %q\nwant %q", order, want)
	}
	if err := SyncTree(snap); err != nil {
		t.Fatal(err)
	}
}

func TestSyncTreeErrors(t *testing.T) {
	if err := SyncTree(filepath.Join(t.TempDir(), "missing")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("SyncTree(missing): %v, want ErrNotExist", err)
	}
	dir := t.TempDir()
	boom := errors.New("disk gone")
	err := syncTree(dir, func(string) error { return boom })
	if !errors.Is(err, boom) {
		t.Fatalf("SyncTree did not report the failed fsync: %v", err)
	}
}

func TestTempDirsSweepAndRename(t *testing.T) {
	store := t.TempDir()
	keep := filepath.Join(store, "snap-1")
	if err := os.Mkdir(keep, 0o755); err != nil {
		t.Fatal(err)
	}
	tmp1, err := MkTempDir(store, "hibernate")
	if err != nil {
		t.Fatal(err)
	}
	tmp2, err := MkTempDir(store, "hibernate")
	if err != nil {
		t.Fatal(err)
	}
	if tmp1 == tmp2 || filepath.Dir(tmp1) != store || !strings.HasPrefix(filepath.Base(tmp1), TempPrefix+"hibernate-") {
		t.Fatalf("temp dirs %q, %q: want distinct %shibernate-* entries of the store", tmp1, tmp2, TempPrefix)
	}
	if _, err := MkTempDir(store, "a/b"); err == nil {
		t.Fatal("MkTempDir accepted a prefix with a separator")
	}
	if _, err := MkTempDir(filepath.Join(store, "missing"), "x"); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("MkTempDir in a missing store: %v", err)
	}

	// Finish one: fill it, rename into place.
	if err := os.WriteFile(filepath.Join(tmp1, "state.json"), []byte("{}"), 0o600); err != nil {
		t.Fatal(err)
	}
	final := filepath.Join(store, "snap-2")
	if err := RenameDir(tmp1, final); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(final, "state.json")); err != nil || string(b) != "{}" {
		t.Fatalf("renamed dir content: %q, %v", b, err)
	}
	// Renaming onto an existing (even empty) directory must not replace it.
	empty := filepath.Join(store, "snap-3")
	if err := os.Mkdir(empty, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := RenameDir(tmp2, empty); !errors.Is(err, fs.ErrExist) {
		t.Fatalf("rename onto an existing dir: %v, want ErrExist", err)
	}
	if err := RenameDir(filepath.Join(store, "gone"), filepath.Join(store, "x")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("rename of a missing dir: %v, want ErrNotExist", err)
	}

	// A leftover atomic-write temp file counts as temp too.
	if err := os.WriteFile(filepath.Join(store, TempPrefix+"meta.json-123"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	removed, err := SweepTemp(store)
	if err != nil {
		t.Fatal(err)
	}
	if len(removed) != 2 {
		t.Fatalf("swept %q, want the temp dir and the temp file", removed)
	}
	assertOnly(t, store, "snap-1", "snap-2", "snap-3")
	if removed, err := SweepTemp(store); err != nil || len(removed) != 0 {
		t.Fatalf("second sweep: %q, %v", removed, err)
	}
	if _, err := SweepTemp(filepath.Join(store, "missing")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("sweep of a missing store: %v", err)
	}
}
