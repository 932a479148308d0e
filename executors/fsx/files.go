package fsx

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// TempPrefix starts the name of every temporary entry fsx creates (temp dirs in the
// snapshot store, WriteFileAtomic's temp files), so leftovers of a crash are
// recognisable and SweepTemp can remove them.
const TempPrefix = ".sbx-tmp-"

// Link makes dst a hard link to src. If dst already is src (same inode) it succeeds
// without change, so a re-run recipe step is a no-op; any other existing dst is an
// error wrapping fs.ErrExist.
func Link(dst, src string) error {
	err := os.Link(src, dst)
	if err == nil || !errors.Is(err, fs.ErrExist) {
		return err
	}
	ds, derr := os.Lstat(dst)
	ss, serr := os.Stat(src)
	if derr == nil && serr == nil && os.SameFile(ds, ss) {
		return nil
	}
	return err
}

// WriteFileAtomic replaces path with data: a temp file in the same directory is
// written, given perm, fsynced and renamed over path, then the directory is
// fsynced. On error the temp file is removed and path is untouched.
func WriteFileAtomic(path string, data []byte, perm fs.FileMode) (err error) {
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	f, err := os.CreateTemp(dir, TempPrefix+base+"-*")
	if err != nil {
		return fmt.Errorf("fsx: write %s: %w", path, err)
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			_ = f.Close()
			_ = os.Remove(tmp)
		}
	}()
	if _, err := f.Write(data); err != nil {
		return fmt.Errorf("fsx: write %s: %w", path, err)
	}
	if err := f.Chmod(perm); err != nil {
		return fmt.Errorf("fsx: write %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("fsx: write %s: fsync: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("fsx: write %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("fsx: write %s: %w", path, err)
	}
	return SyncDir(dir)
}

// SyncTree makes dir and everything below it durable. Order: every regular file
// (in lexical walk order), then every directory below dir deepest first, then dir,
// then dir's parent. Symlinks and special files are not opened; the fsync of the
// directory that holds them makes their entries durable.
func SyncTree(dir string) error { return syncTree(dir, syncPath) }

// syncTree takes the fsync so a test can observe the order.
func syncTree(dir string, sync func(string) error) error {
	var files, dirs []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		switch {
		case d.Type().IsRegular():
			files = append(files, p)
		case d.IsDir() && p != dir:
			dirs = append(dirs, p)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("fsx: sync tree %s: %w", dir, err)
	}
	for _, p := range files {
		if err := sync(p); err != nil {
			return fmt.Errorf("fsx: sync tree %s: %w", dir, err)
		}
	}
	sep := string(filepath.Separator)
	slices.SortStableFunc(dirs, func(a, b string) int {
		return strings.Count(b, sep) - strings.Count(a, sep)
	})
	for _, p := range append(dirs, dir, filepath.Dir(filepath.Clean(dir))) {
		if err := sync(p); err != nil {
			return fmt.Errorf("fsx: sync tree %s: %w", dir, err)
		}
	}
	return nil
}

func syncPath(p string) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	serr := f.Sync()
	cerr := f.Close()
	if serr != nil {
		return fmt.Errorf("fsync %s: %w", p, serr)
	}
	return cerr
}

// SyncDir fsyncs the directory dir, which makes the entries created, renamed or
// removed in it durable (a file's own fsync does not).
func SyncDir(dir string) error {
	if err := syncPath(dir); err != nil {
		return fmt.Errorf("fsx: %w", err)
	}
	return nil
}

// MkTempDir creates a new directory inside storeDir named TempPrefix+prefix+"-"+random
// and returns its path. Keeping it inside the store keeps it on the store's
// filesystem, so moving it into place later is an atomic rename.
func MkTempDir(storeDir, prefix string) (string, error) {
	if strings.ContainsRune(prefix, filepath.Separator) {
		return "", fmt.Errorf("fsx: temp dir prefix %q contains a path separator", prefix)
	}
	d, err := os.MkdirTemp(storeDir, TempPrefix+prefix+"-*")
	if err != nil {
		return "", fmt.Errorf("fsx: %w", err)
	}
	return d, nil
}

// SweepTemp removes every entry of storeDir whose name starts with TempPrefix and
// returns the removed paths. It must run before any recipe uses the store (at
// start-up): it cannot tell a crashed recipe's leftovers from a running one's.
func SweepTemp(storeDir string) ([]string, error) {
	ents, err := os.ReadDir(storeDir)
	if err != nil {
		return nil, fmt.Errorf("fsx: sweep: %w", err)
	}
	var removed []string
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), TempPrefix) {
			continue
		}
		p := filepath.Join(storeDir, e.Name())
		if err := os.RemoveAll(p); err != nil {
			return removed, fmt.Errorf("fsx: sweep: %w", err)
		}
		removed = append(removed, p)
	}
	if len(removed) > 0 {
		if err := SyncDir(storeDir); err != nil {
			return removed, err
		}
	}
	return removed, nil
}

// RenameDir renames oldpath to newpath (a directory or a file) without replacing an
// existing newpath (that is an error wrapping fs.ErrExist), then fsyncs the parent
// of newpath and, if different, the parent of oldpath, so the move is durable.
func RenameDir(oldpath, newpath string) error {
	err := unix.Renameat2(unix.AT_FDCWD, oldpath, unix.AT_FDCWD, newpath, unix.RENAME_NOREPLACE)
	if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS) {
		// The filesystem has no RENAME_NOREPLACE; check-then-rename is racy, but only
		// against another writer of the store, which the daemon does not have.
		if _, serr := os.Lstat(newpath); serr == nil {
			err = unix.EEXIST
		} else {
			err = os.Rename(oldpath, newpath)
		}
	}
	if err != nil {
		var le *os.LinkError
		if errors.As(err, &le) {
			return fmt.Errorf("fsx: %w", err)
		}
		return fmt.Errorf("fsx: %w", &os.LinkError{Op: "rename", Old: oldpath, New: newpath, Err: err})
	}
	np, op := filepath.Dir(newpath), filepath.Dir(oldpath)
	if err := SyncDir(np); err != nil {
		return err
	}
	if op != np {
		return SyncDir(op)
	}
	return nil
}
