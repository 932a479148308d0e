package fsx

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/sbxlog/sbxlog/executors/fsx/xfstest"
)

// On XFS, FIEMAP sees a sparse file's data ranges, and two files written
// independently share nothing; only a clone shares (see the clone tests).
func TestExtentsOnXFS(t *testing.T) {
	dir := xfstest.Mount(t, 512*MiB)
	a, b := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	regions := []region{{0, 1 * MiB}, {8 * MiB, 2 * MiB}}
	writeSparse(t, a, 16*MiB, 0o600, regions...)
	writeSparse(t, b, 16*MiB, 0o600, regions...)

	ext, err := Extents(a)
	if err != nil {
		t.Fatal(err)
	}
	if len(ext) == 0 || ext[len(ext)-1].Flags&ExtentLast == 0 {
		t.Fatalf("extents %+v: want some, the last flagged last", ext)
	}
	var mapped uint64
	for _, e := range ext {
		mapped += e.Length
		inside := false
		for _, r := range regions {
			inside = inside || (e.Logical >= uint64(r.off) && e.Logical+e.Length <= uint64(r.off+r.len))
		}
		if !inside {
			t.Fatalf("extent %+v lies outside the written ranges %+v", e, regions)
		}
		if e.Flags&ExtentShared != 0 {
			t.Fatalf("extent of a plain file is shared: %+v", e)
		}
	}
	if mapped != 3*MiB {
		t.Fatalf("extents map %d bytes, want %d", mapped, 3*MiB)
	}
	if all, err := AllExtentsShared(a); err != nil || all {
		t.Fatalf("AllExtentsShared(plain file) = %v, %v; want false", all, err)
	}
	shared, total, err := SharedBytes(a, b)
	if err != nil || shared != 0 || total != 3*MiB {
		t.Fatalf("SharedBytes(independent files) = %d, %d, %v; want 0 of 3 MiB", shared, total, err)
	}

	empty := filepath.Join(dir, "empty")
	writeSparse(t, empty, 4*MiB, 0o600)
	if all, err := AllExtentsShared(empty); err != nil || all {
		t.Fatalf("AllExtentsShared(hole only) = %v, %v; want false", all, err)
	}
}

// A file larger than one FIEMAP batch of extents is read completely.
func TestExtentsManyBatches(t *testing.T) {
	dir := xfstest.Mount(t, 512*MiB)
	p := filepath.Join(dir, "fragmented")
	const n = fiemapBatch + 44
	regions := make([]region, n)
	for i := range regions {
		regions[i] = region{int64(i) * 64 << 10, 4 << 10} // 4 KiB data, 60 KiB hole
	}
	writeSparse(t, p, int64(n)*64<<10, 0o600, regions...)
	ext, err := Extents(p)
	if err != nil {
		t.Fatal(err)
	}
	if len(ext) != n {
		t.Fatalf("got %d extents, want %d", len(ext), n)
	}
	for i, e := range ext {
		if e.Logical != uint64(regions[i].off) || e.Length != 4<<10 {
			t.Fatalf("extent %d = %+v, want logical %d length 4096", i, e, regions[i].off)
		}
	}
}

func TestExtentsUnsupported(t *testing.T) {
	dir := tmpfs(t)
	p := filepath.Join(dir, "f")
	writeSparse(t, p, MiB, 0o600, region{0, 4096})
	if _, err := Extents(p); !errors.Is(err, syscall.EOPNOTSUPP) {
		t.Fatalf("FIEMAP on tmpfs: %v, want EOPNOTSUPP", err)
	}
	if _, err := Extents(filepath.Join(dir, "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("FIEMAP of a missing file: %v", err)
	}
}

func TestAllocatedBytes(t *testing.T) {
	dir := t.TempDir()
	sparse, full := filepath.Join(dir, "sparse"), filepath.Join(dir, "full")
	writeSparse(t, sparse, 64*MiB, 0o600, region{0, 1 * MiB})
	writeSparse(t, full, 1*MiB, 0o600, region{0, 1 * MiB})
	if got, err := AllocatedBytes(sparse); err != nil || got < MiB || got >= 4*MiB {
		t.Fatalf("AllocatedBytes(sparse) = %d, %v; want about 1 MiB", got, err)
	}
	if s, err := IsSparse(sparse); err != nil || !s {
		t.Fatalf("IsSparse(sparse) = %v, %v", s, err)
	}
	if s, err := IsSparse(full); err != nil || s {
		t.Fatalf("IsSparse(full) = %v, %v", s, err)
	}
	if _, err := AllocatedBytes(filepath.Join(dir, "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("AllocatedBytes(missing): %v", err)
	}
}

func TestExtentFlagString(t *testing.T) {
	for f, want := range map[ExtentFlag]string{
		ExtentShared | ExtentLast: "last|shared",
		ExtentUnwritten:           "unwritten",
		0:                         "",
		0x40000 | ExtentShared:    "shared|0x40000",
	} {
		if got := f.String(); got != want {
			t.Errorf("%#x.String() = %q, want %q", uint32(f), got, want)
		}
	}
}
