package fsx

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"

	"github.com/sbxlog/sbxlog/executors/fsx/xfstest"
)

const (
	MiB = 1 << 20
)

// A golden-like disk: large, mostly holes, a few data ranges.
var diskRegions = []region{{0, 2 * MiB}, {20 * MiB, 1 * MiB}, {50 * MiB, 3 * MiB}}

const diskSize = 96 * MiB

func TestCloneReflinkSharesAllExtents(t *testing.T) {
	dir := xfstest.Mount(t, 512*MiB)
	src, dst := filepath.Join(dir, "golden.raw"), filepath.Join(dir, "cow.raw")
	writeSparse(t, src, diskSize, 0o640, diskRegions...)
	c, logs := newLogged()

	res, err := c.Clone(dst, src)
	if err != nil {
		t.Fatal(err)
	}
	if res.Method != Reflink || res.Bytes != 0 || res.Size != diskSize {
		t.Fatalf("result = %+v, want reflink of %d bytes with nothing copied", res, diskSize)
	}
	for _, p := range []string{src, dst} {
		all, err := AllExtentsShared(p)
		if err != nil {
			t.Fatal(err)
		}
		if !all {
			ext, _ := Extents(p)
			t.Fatalf("%s: not every extent is shared: %+v", p, ext)
		}
	}
	shared, total, err := SharedBytes(dst, src)
	if err != nil {
		t.Fatal(err)
	}
	if total < 6*MiB || shared != total {
		t.Fatalf("clone shares %d of %d extent bytes with its source, want all (>= 6 MiB)", shared, total)
	}
	if checksum(t, dst) != checksum(t, src) {
		t.Fatal("clone content differs from source")
	}
	st, err := os.Stat(dst)
	if err != nil {
		t.Fatal(err)
	}
	if st.Size() != diskSize || st.Mode().Perm() != 0o640 {
		t.Fatalf("clone size %d mode %v, want %d and 0640", st.Size(), st.Mode().Perm(), diskSize)
	}
	if l := logs.lines(); len(l) != 0 {
		t.Fatalf("reflink path logged %q, want nothing", l)
	}
	// Writing the clone must not touch the source (copy on write).
	sum := checksum(t, src)
	if err := os.WriteFile(dst, []byte("guest wrote here"), 0o640); err != nil {
		t.Fatal(err)
	}
	if checksum(t, src) != sum {
		t.Fatal("writing the clone changed the source")
	}
}

func TestCloneFallbackIsSparseCopy(t *testing.T) {
	cases := []struct {
		name     string
		src, dst func(t *testing.T) string
	}{
		{"tmpfs", tmpfs, nil},
		{"ext4", ext4, nil},
		// Two filesystems: FICLONE answers EXDEV even from a reflink-capable source.
		{"xfs to tmpfs", func(t *testing.T) string { return xfstest.Mount(t, 512*MiB) }, tmpfs},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			srcDir := tc.src(t)
			dstDir := srcDir
			if tc.dst != nil {
				dstDir = tc.dst(t)
			}
			src, dst := filepath.Join(srcDir, "golden.raw"), filepath.Join(dstDir, "cow.raw")
			written := writeSparse(t, src, diskSize, 0o600, diskRegions...)
			c, logs := newLogged()

			res, err := c.Clone(dst, src)
			if err != nil {
				t.Fatal(err)
			}
			if res.Method != Copy || res.Size != diskSize || res.Bytes != written {
				t.Fatalf("result = %+v, want copy of %d data bytes, size %d", res, written, diskSize)
			}
			alloc, err := AllocatedBytes(dst)
			if err != nil {
				t.Fatal(err)
			}
			// Allocation may round up to blocks and add extent metadata, never
			// approach the file size.
			if alloc < written || alloc > written+MiB {
				t.Fatalf("copy allocates %d bytes, want about %d (size %d)", alloc, written, diskSize)
			}
			if sparse, _ := IsSparse(dst); !sparse {
				t.Fatal("copy is not sparse")
			}
			if checksum(t, dst) != checksum(t, src) {
				t.Fatal("copy content differs from source")
			}
			if st, err := os.Stat(dst); err != nil || st.Size() != diskSize || st.Mode().Perm() != 0o600 {
				t.Fatalf("copy stat = %v, %v; want size %d mode 0600", st, err, diskSize)
			}
			if l := logs.lines(); len(l) != 1 {
				t.Fatalf("fallback logged %d lines (%q), want exactly 1", len(l), l)
			}
		})
	}
}

func tmpfs(t *testing.T) string {
	t.Helper()
	return xfstest.MountNoReflink(t, 512*MiB, xfstest.Tmpfs)
}

func ext4(t *testing.T) string {
	t.Helper()
	return xfstest.MountNoReflink(t, 512*MiB, xfstest.Ext4)
}

// Concurrent first clones on a filesystem without reflink must agree on the result
// and log the fallback once; later clones go straight to the copy and log nothing.
func TestCloneDetectsOncePerFilesystem(t *testing.T) {
	dir := tmpfs(t)
	src := filepath.Join(dir, "src")
	writeSparse(t, src, 8*MiB, 0o600, region{0, 64 << 10})
	c, logs := newLogged()

	const n = 8
	var wg sync.WaitGroup
	results := make([]CloneResult, n)
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i], errs[i] = c.Clone(filepath.Join(dir, fmt.Sprintf("dst%d", i)), src)
		}()
	}
	wg.Wait()
	for i := range n {
		if errs[i] != nil || results[i].Method != Copy {
			t.Fatalf("clone %d: %+v, %v", i, results[i], errs[i])
		}
	}
	if l := logs.lines(); len(l) != 1 {
		t.Fatalf("%d concurrent clones logged %d lines, want 1: %q", n, len(l), l)
	}
	if m, err := c.Detect(dir); err != nil || m != Copy {
		t.Fatalf("Detect = %v, %v; want copy", m, err)
	}
	if l := logs.lines(); len(l) != 1 {
		t.Fatalf("later clone logged again: %q", l)
	}

	// Another filesystem is detected on its own.
	xdir := xfstest.Mount(t, 512*MiB)
	if m, err := c.Detect(xdir); err != nil || m != Reflink {
		t.Fatalf("Detect(xfs) = %v, %v; want reflink", m, err)
	}
	ents, err := os.ReadDir(xdir)
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) != 0 {
		t.Fatalf("Detect left %d entries behind", len(ents))
	}
}

func TestCloneDestinationRules(t *testing.T) {
	dir := t.TempDir()
	src, dst := filepath.Join(dir, "src"), filepath.Join(dir, "dst")
	if err := os.WriteFile(src, []byte("golden"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, []byte("existing"), 0o644); err != nil {
		t.Fatal(err)
	}
	c, _ := newLogged()

	if _, err := c.Clone(dst, src); !errors.Is(err, fs.ErrExist) {
		t.Fatalf("clone onto existing file: %v, want ErrExist", err)
	}
	if b, _ := os.ReadFile(dst); string(b) != "existing" {
		t.Fatalf("refused clone changed dst to %q", b)
	}
	if _, err := c.Clone(dst, src, Overwrite()); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(dst); string(b) != "golden" {
		t.Fatalf("overwrite left %q", b)
	}
	if _, err := c.Clone(src, src, Overwrite()); !errors.Is(err, ErrSameFile) {
		t.Fatalf("overwrite onto itself: %v, want ErrSameFile", err)
	}
	if b, _ := os.ReadFile(src); string(b) != "golden" {
		t.Fatalf("self-overwrite damaged the source: %q", b)
	}
	if _, err := c.Clone(filepath.Join(dir, "x"), dir); !errors.Is(err, ErrNotRegular) {
		t.Fatalf("clone of a directory: %v, want ErrNotRegular", err)
	}
	if _, err := c.Clone(filepath.Join(dir, "y"), filepath.Join(dir, "missing")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("clone of a missing file: %v, want ErrNotExist", err)
	}
	for _, name := range []string{"x", "y"} {
		if _, err := os.Lstat(filepath.Join(dir, name)); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("failed clone left %s behind", name)
		}
	}
}

// A copy that runs out of space fails with ENOSPC (which the scheduler parks
// refills on) and leaves no partial file.
func TestCloneCopyFailureLeavesNothing(t *testing.T) {
	srcDir := tmpfs(t)
	small := xfstest.MountNoReflink(t, 1*MiB, xfstest.Tmpfs)
	src := filepath.Join(srcDir, "src")
	writeSparse(t, src, 16*MiB, 0o600, region{0, 4 * MiB})
	c, _ := newLogged()
	dst := filepath.Join(small, "dst")
	_, err := c.Clone(dst, src)
	if !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("clone into a full filesystem: %v, want ENOSPC", err)
	}
	if _, err := os.Lstat(dst); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("failed clone left %s: %v", dst, err)
	}
}

func TestMethodString(t *testing.T) {
	for m, want := range map[Method]string{Reflink: "reflink", Copy: "copy", 0: "Method(0)"} {
		if got := m.String(); got != want {
			t.Errorf("Method(%d).String() = %q, want %q", int(m), got, want)
		}
	}
}

// The recipes also clone config.json and state.json: small, unaligned and possibly
// empty files, and re-run steps overwrite an earlier attempt's file.
func TestCloneSmallFilesOnXFS(t *testing.T) {
	dir := xfstest.Mount(t, 512*MiB)
	c, _ := newLogged()
	for _, tc := range []struct {
		name string
		data string
	}{
		{"empty", ""},
		{"unaligned", `{"disks":[{"path":"/run/vm/cow.raw"}],"vsock":{"cid":3}}`},
	} {
		src := filepath.Join(dir, tc.name+".json")
		if err := os.WriteFile(src, []byte(tc.data), 0o644); err != nil {
			t.Fatal(err)
		}
		dst := filepath.Join(dir, tc.name+".clone")
		if err := os.WriteFile(dst, []byte("an earlier, longer attempt's leftover content"), 0o600); err != nil {
			t.Fatal(err)
		}
		res, err := c.Clone(dst, src, Overwrite())
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if res.Method != Reflink || res.Size != int64(len(tc.data)) {
			t.Fatalf("%s: result %+v, want reflink of %d bytes", tc.name, res, len(tc.data))
		}
		b, err := os.ReadFile(dst)
		if err != nil || string(b) != tc.data {
			t.Fatalf("%s: clone reads %q, %v; want %q", tc.name, b, err, tc.data)
		}
		if st, _ := os.Stat(dst); st.Mode().Perm() != 0o644 {
			t.Fatalf("%s: mode %v, want 0644 from the source", tc.name, st.Mode().Perm())
		}
	}
}
