package fsx

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// DefaultExtentBound is the extent count past which a disk image is
// rewritten densely (RewriteDense). FICLONE's cost grows with the source's
// extents (it walks and shares each one), and every hibernate/wake
// generation of a VM whose guest writes adds copy-on-write fragments; the
// bound keeps a long chain's clone in the low milliseconds (docs/
// architecture.md, "Disk generations", and the genbench figures).
const DefaultExtentBound = 512

// RewriteResult says what RewriteDense found and did.
type RewriteResult struct {
	// Before and After are the extent counts (After equals Before when the
	// file was within the bound).
	Before, After int
	Rewritten     bool
	// Bytes is what the rewrite copied (data ranges only).
	Bytes int64
}

// RewriteDense rewrites path as a fresh, densely written copy when it has
// more than bound extents, and swaps it in crash-safely: the copy is a
// TempPrefix file in path's directory, written sequentially (data ranges
// only: holes stay holes), fsynced, renamed over path, and the directory
// fsynced. A crash leaves path whole (old or new, same content) and at
// most a temp file, which the recipes' temp sweeps or a re-run remove.
// The file must not be open for writing by anyone (a stopped VM's image):
// readers holding the old inode keep reading the old, equal content.
func RewriteDense(path string, bound int) (RewriteResult, error) {
	var res RewriteResult
	ext, err := Extents(path)
	if err != nil {
		return res, err
	}
	res.Before, res.After = len(ext), len(ext)
	if len(ext) <= bound {
		return res, nil
	}
	src, err := os.Open(path)
	if err != nil {
		return res, fmt.Errorf("fsx: rewrite: %w", err)
	}
	defer src.Close()
	st, err := src.Stat()
	if err != nil {
		return res, fmt.Errorf("fsx: rewrite: %w", err)
	}
	dir, base := filepath.Split(path)
	tmp, err := os.CreateTemp(dir, TempPrefix+base+"-dense-*")
	if err != nil {
		return res, fmt.Errorf("fsx: rewrite: %w", err)
	}
	done := false
	defer func() {
		if !done {
			_ = tmp.Close()
			_ = os.Remove(tmp.Name())
		}
	}()
	if res.Bytes, err = denseCopy(tmp, src, st.Size()); err != nil {
		return res, fmt.Errorf("fsx: rewrite %s: %w", path, err)
	}
	if err := tmp.Chmod(st.Mode().Perm()); err != nil {
		return res, fmt.Errorf("fsx: rewrite: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		return res, fmt.Errorf("fsx: rewrite %s: fsync: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return res, fmt.Errorf("fsx: rewrite: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return res, fmt.Errorf("fsx: rewrite: %w", err)
	}
	done = true
	if err := SyncDir(filepath.Clean(dir)); err != nil {
		return res, err
	}
	res.Rewritten = true
	if ext, err := Extents(path); err == nil {
		res.After = len(ext)
	}
	return res, nil
}

// denseCopy writes src's data ranges to dst in file order with large
// sequential writes (the allocator lays them out in few extents) and sets
// dst's size.
func denseCopy(dst, src *os.File, size int64) (int64, error) {
	fd := int(src.Fd())
	buf := make([]byte, 4<<20)
	var total int64
	for off := int64(0); off < size; {
		data, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break
		}
		if err != nil {
			return total, err
		}
		hole, err := unix.Seek(fd, data, unix.SEEK_HOLE)
		if err != nil {
			return total, err
		}
		for pos := data; pos < hole; {
			n, err := src.ReadAt(buf[:min(int64(len(buf)), hole-pos)], pos)
			if n > 0 {
				if _, werr := dst.WriteAt(buf[:n], pos); werr != nil {
					return total, werr
				}
				total += int64(n)
				pos += int64(n)
			}
			if err != nil && err != io.EOF {
				return total, err
			}
			if n == 0 {
				break
			}
		}
		off = hole
	}
	return total, dst.Truncate(size)
}
