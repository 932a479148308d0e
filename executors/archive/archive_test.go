package archive

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"github.com/sbxlog/sbxlog/eventlog/event"
	"github.com/sbxlog/sbxlog/executors"
	"github.com/sbxlog/sbxlog/executors/fsx"
	"github.com/sbxlog/sbxlog/executors/layout"
	"github.com/sbxlog/sbxlog/fsm"
)

var errCrash = errors.New("crash injected")

// snapshot writes a snapshot dir like a hibernate's: small JSON files, a
// sparse memory file (a hole in the middle) and a disk.
func snapshot(t *testing.T, dir string) map[string]string {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	write := func(name string, data []byte) {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("config.json", []byte(`{"cpus":1}`))
	write("state.json", []byte(`{"vm":"x"}`))
	write("cow.raw", bytes.Repeat([]byte("disk"), 3000))
	f, err := os.Create(filepath.Join(dir, "memory-ranges"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(bytes.Repeat([]byte{7}, 8192), 0); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("tail"), 64<<20); err != nil {
		t.Fatal(err)
	}
	f.Close()
	sums := map[string]string{}
	for _, n := range []string{"config.json", "state.json", "cow.raw", "memory-ranges"} {
		s, err := fsx.ContentSum(filepath.Join(dir, n))
		if err != nil {
			t.Fatal(err)
		}
		sums[n] = s
	}
	return sums
}

func openStore(t *testing.T) *DirStore {
	t.Helper()
	s, err := OpenDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// Put's durability order: each file copied then fsynced, then the dir,
// then the manifest, then the read-back, then the rename; the copies keep
// holes and match the sources' sums.
func TestPutOrderAndSums(t *testing.T) {
	src := filepath.Join(t.TempDir(), "snap")
	sums := snapshot(t, src)
	s := openStore(t)
	var steps []string
	s.Hook = func(step, path string) error { steps = append(steps, step+" "+filepath.Base(path)); return nil }
	ctx := context.Background()
	if err := s.Put(ctx, "i1/vm-1-op", src); err != nil {
		t.Fatal(err)
	}
	tmp := fsx.TempPrefix + "vm-1-op"
	want := []string{StepPutTemp + " " + tmp}
	for _, n := range []string{"config.json", "cow.raw", "memory-ranges", "state.json"} {
		want = append(want, StepPutFile+" "+n, StepFsyncFile+" "+n)
	}
	want = append(want, StepFsyncDir+" "+tmp, StepPutManifest+" "+ManifestFile, StepVerify+" "+tmp, StepPutRename+" vm-1-op")
	if !slices.Equal(steps, want) {
		t.Fatalf("steps:\n%s\nwant:\n%s", strings.Join(steps, "\n"), strings.Join(want, "\n"))
	}
	m, err := readManifest(s.Dir("i1/vm-1-op"))
	if err != nil || len(m.Files) != 4 {
		t.Fatalf("manifest %+v %v", m, err)
	}
	for _, f := range m.Files {
		if f.SHA256 != sums[f.Name] {
			t.Errorf("%s: manifest %s, source %s", f.Name, f.SHA256, sums[f.Name])
		}
	}
	if sparse, err := fsx.IsSparse(filepath.Join(s.Dir("i1/vm-1-op"), "memory-ranges")); err != nil || !sparse {
		t.Errorf("archived memory-ranges not sparse (%v)", err)
	}
	// A second Put of a complete archive copies nothing.
	steps = nil
	if err := s.Put(ctx, "i1/vm-1-op", src); err != nil || len(steps) != 0 {
		t.Fatalf("second Put: %v, steps %v", err, steps)
	}
	// Get copies back with the same sums.
	back := filepath.Join(t.TempDir(), "back")
	if err := os.Mkdir(back, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := s.Get(ctx, "i1/vm-1-op", back); err != nil {
		t.Fatal(err)
	}
	for n, want := range sums {
		if got, _ := fsx.ContentSum(filepath.Join(back, n)); got != want {
			t.Errorf("%s back: %s, want %s", n, got, want)
		}
	}
}

// A crash at any step of Put leaves no archive under the name (Has false,
// Get ErrNotFound); the next Put completes it and the sweep removes a
// temp dir left behind.
func TestPutCrashLeavesNothing(t *testing.T) {
	for _, step := range []string{StepPutTemp, StepPutFile, StepFsyncFile, StepFsyncDir, StepPutManifest, StepVerify, StepPutRename} {
		t.Run(step, func(t *testing.T) {
			src := filepath.Join(t.TempDir(), "snap")
			snapshot(t, src)
			s := openStore(t)
			s.Hook = func(st, _ string) error {
				if st == step {
					return errCrash
				}
				return nil
			}
			ctx := context.Background()
			if err := s.Put(ctx, "i1/vm-2-op", src); !errors.Is(err, errCrash) {
				t.Fatalf("Put = %v", err)
			}
			if ok, err := s.Has(ctx, "i1/vm-2-op"); ok || err != nil {
				t.Fatalf("Has after a crash at %s = %v, %v", step, ok, err)
			}
			if err := s.Get(ctx, "i1/vm-2-op", t.TempDir()); !errors.Is(err, ErrNotFound) {
				t.Fatalf("Get after a crash = %v", err)
			}
			if _, err := s.SweepTemp("other"); err != nil {
				t.Fatal(err)
			}
			s.Hook = nil
			if err := s.Put(ctx, "i1/vm-2-op", src); err != nil {
				t.Fatal(err)
			}
			if ok, _ := s.Has(ctx, "i1/vm-2-op"); !ok {
				t.Fatal("no archive after the re-run")
			}
			ents, _ := os.ReadDir(filepath.Join(s.Root(), "i1"))
			if len(ents) != 1 {
				t.Fatalf("entries %v", ents)
			}
		})
	}
	// The sweep removes this instance's temp dirs, never another's.
	s := openStore(t)
	for _, d := range []string{"i1/" + fsx.TempPrefix + "a", "i2/" + fsx.TempPrefix + "b"} {
		if err := os.MkdirAll(filepath.Join(s.Root(), d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if swept, err := s.SweepTemp("i1"); err != nil || len(swept) != 1 {
		t.Fatalf("sweep = %v, %v", swept, err)
	}
	if _, err := os.Stat(filepath.Join(s.Root(), "i2", fsx.TempPrefix+"b")); err != nil {
		t.Fatalf("another instance's temp dir was touched: %v", err)
	}
}

// Get refuses an archive whose file does not match its manifest, or lacks
// one.
func TestGetRefusesMismatch(t *testing.T) {
	cases := map[string]func(dir string) error{
		"flipped byte": func(dir string) error {
			f, err := os.OpenFile(filepath.Join(dir, "cow.raw"), os.O_WRONLY, 0)
			if err != nil {
				return err
			}
			defer f.Close()
			_, err = f.WriteAt([]byte("X"), 100)
			return err
		},
		"missing file": func(dir string) error { return os.Remove(filepath.Join(dir, "state.json")) },
		"truncated":    func(dir string) error { return os.Truncate(filepath.Join(dir, "memory-ranges"), 4096) },
	}
	for name, corrupt := range cases {
		t.Run(name, func(t *testing.T) {
			src := filepath.Join(t.TempDir(), "snap")
			snapshot(t, src)
			s := openStore(t)
			ctx := context.Background()
			if err := s.Put(ctx, "i1/vm-3-op", src); err != nil {
				t.Fatal(err)
			}
			if err := corrupt(s.Dir("i1/vm-3-op")); err != nil {
				t.Fatal(err)
			}
			if err := s.Get(ctx, "i1/vm-3-op", t.TempDir()); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("Get = %v, want ErrCorrupt", err)
			}
		})
	}
}

func TestOpenDirRefuses(t *testing.T) {
	file := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{"", "relative/dir", "/nonexistent/archive", file, "/proc/1"} {
		if _, err := OpenDir(dir); err == nil {
			t.Errorf("OpenDir(%q) accepted", dir)
		}
	}
	s := openStore(t)
	for _, name := range []string{"../x", "i1/.sbx-tmp-x", "/abs", ""} {
		if err := s.Put(context.Background(), name, t.TempDir()); err == nil {
			t.Errorf("Put(%q) accepted", name)
		}
	}
}

// executor returns an Executor over a fresh data dir and archive dir, and
// a hibernate snapshot of vm-1 in the store.
func executor(t *testing.T, hook func(ctx context.Context, recipe, step string, op event.OpID) error) (*Executor, *DirStore, fsm.ArchiveVM, map[string]string) {
	t.Helper()
	roots := layout.RootsIn(t.TempDir())
	if err := roots.Make("i1", layout.HibernateStore); err != nil {
		t.Fatal(err)
	}
	store := openStore(t)
	x, err := New(Config{Store: store, Roots: roots, Instance: "i1", Hook: hook, Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	op := event.OpIDFromUint(7, 1)
	rel := layout.HibernateRel("vm-1", event.OpIDFromUint(6, 1))
	sums := snapshot(t, filepath.Join(roots.Store, rel))
	return x, store, fsm.ArchiveVM{OpID: op, VM: "vm-1", Claim: "sb_0000000000000001", Instance: "i1", SnapshotDir: rel}, sums
}

// crashAt is a Hook that fails the first time recipe reaches step.
func crashAt(recipe, step string) func(context.Context, string, string, event.OpID) error {
	fired := false
	return func(_ context.Context, r, s string, _ event.OpID) error {
		if r == recipe && s == step && !fired {
			fired = true
			return errCrash
		}
		return nil
	}
}

// Archive, then unarchive: the files come back with their sums; a crash
// at any step of either recipe, then the re-run, ends the same way, the
// local snapshot removed only once the archive is complete and the archive
// deleted only once the local copy is in place.
func TestArchiveUnarchiveCrashAtEachStep(t *testing.T) {
	archiveSteps := []string{"", StepCheck, StepPut, StepRemoveLocal}
	unarchiveSteps := []string{"", StepCheck, StepMkTemp, StepGet, StepSyncFiles, StepRename, StepSyncTree, StepDeleteArchive}
	ctx := context.Background()
	for _, as := range archiveSteps {
		for _, us := range unarchiveSteps {
			if as != "" && us != "" {
				continue
			}
			t.Run("archive:"+as+"/unarchive:"+us, func(t *testing.T) {
				var hook func(context.Context, string, string, event.OpID) error
				switch {
				case as != "":
					hook = crashAt(string(fsm.KindArchive), as)
				case us != "":
					hook = crashAt(string(fsm.KindUnarchive), us)
				}
				x, store, in, sums := executor(t, hook)
				local := filepath.Join(x.c.Roots.Store, in.SnapshotDir)
				res, err := x.Archive(ctx, in)
				if as != "" {
					if !errors.Is(err, errCrash) {
						t.Fatalf("archive crash at %s: %v", as, err)
					}
					has, _ := store.Has(ctx, Name("i1", "vm-1", in.OpID))
					if _, serr := os.Stat(local); serr != nil && !has {
						t.Fatal("the local snapshot went before the archive was complete")
					}
					res, err = x.Archive(ctx, in)
				}
				if err != nil || res.SnapshotDir != Name("i1", "vm-1", in.OpID) {
					t.Fatalf("archive = %+v, %v", res, err)
				}
				if _, err := os.Stat(local); !errors.Is(err, fs.ErrNotExist) {
					t.Fatalf("local snapshot still there: %v", err)
				}
				un := fsm.UnarchiveVM{OpID: event.OpIDFromUint(8, 1), VM: "vm-1", Instance: "i1", Archive: res.SnapshotDir}
				back, err := x.Unarchive(ctx, un)
				if us != "" {
					if !errors.Is(err, errCrash) {
						t.Fatalf("unarchive crash at %s: %v", us, err)
					}
					has, _ := store.Has(ctx, un.Archive)
					_, serr := os.Stat(filepath.Join(x.c.Roots.Store, layout.HibernateRel("vm-1", un.OpID)))
					if !has && serr != nil {
						t.Fatal("the archive went before the local copy was in place")
					}
					back, err = x.Unarchive(ctx, un)
				}
				if err != nil {
					t.Fatal(err)
				}
				dir := filepath.Join(x.c.Roots.Store, back.SnapshotDir)
				for n, want := range sums {
					if got, _ := fsx.ContentSum(filepath.Join(dir, n)); got != want {
						t.Errorf("%s: %s, want %s", n, got, want)
					}
				}
				if has, _ := store.Has(ctx, un.Archive); has {
					t.Fatal("archive not deleted after the unarchive")
				}
				if ents, _ := os.ReadDir(x.c.Roots.Store); len(ents) != 1 {
					t.Fatalf("store holds %v (a temp dir left?)", ents)
				}
			})
		}
	}
}

// A corrupt archive is Lost on unarchive (the claim fails), and nothing is
// left in the local store.
func TestUnarchiveCorruptIsLost(t *testing.T) {
	x, store, in, _ := executor(t, nil)
	ctx := context.Background()
	res, err := x.Archive(ctx, in)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(store.Dir(res.SnapshotDir), "config.json"), []byte(`{"cpus":9}`), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = x.Unarchive(ctx, fsm.UnarchiveVM{OpID: event.OpIDFromUint(8, 1), VM: "vm-1", Archive: res.SnapshotDir})
	if !executors.IsLost(err) || !errors.Is(err, ErrCorrupt) {
		t.Fatalf("unarchive of a corrupt archive = %v", err)
	}
	if ents, _ := os.ReadDir(x.c.Roots.Store); len(ents) != 1 {
		t.Fatalf("store holds %v", ents)
	}
}

// DeleteArchive removes the archive, is idempotent, and never touches
// another instance's.
func TestDeleteArchive(t *testing.T) {
	x, store, in, _ := executor(t, nil)
	ctx := context.Background()
	res, err := x.Archive(ctx, in)
	if err != nil {
		t.Fatal(err)
	}
	del := fsm.DeleteArchiveVM{OpID: event.OpIDFromUint(9, 1), VM: "vm-1", Instance: "i1", Archive: res.SnapshotDir, RunDir: "i1/vm-1"}
	for range 2 {
		if _, err := x.DeleteArchive(ctx, del); err != nil {
			t.Fatal(err)
		}
	}
	if has, _ := store.Has(ctx, res.SnapshotDir); has {
		t.Fatal("archive still there")
	}
	for _, bad := range []fsm.DeleteArchiveVM{
		{VM: "vm-1", Instance: "i2", Archive: "i2/vm-1-x"},
		{VM: "vm-1", Instance: "i1", Archive: "i2/vm-1-x"},
	} {
		if _, err := x.DeleteArchive(ctx, bad); !executors.IsUnrecoverable(err) {
			t.Errorf("DeleteArchive(%+v) = %v", bad, err)
		}
	}
}
