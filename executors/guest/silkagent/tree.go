package silkagent

import (
	"fmt"
	"io"
	"io/fs"
	"os"
	"syscall"

	"github.com/sbxlog/sbxlog/executors/guest/silkd"
)

// TreeFS is what the whole-tree ops (fs_push, fs_pull, fs_find and
// fs_replace) need of a file tree beyond FS. An FS that is not a TreeFS
// leaves them unimplemented.
type TreeFS interface {
	FS
	// Lstat describes path without following a final symlink.
	Lstat(path string) (silkd.StatInfo, error)
	// Readlink returns a symlink's target.
	Readlink(path string) (string, error)
	// Symlink creates path as a symlink to target; path must not exist.
	Symlink(target, path string) error
	// WriteNew creates path, which must not exist (a symlink there is not
	// followed), with mode and the contents of r. It is not atomic: fs_push
	// writes into a staging directory that only it sees.
	WriteNew(path string, mode uint32, r io.Reader) error
}

// Limits bound the whole-tree ops and the watch queue. A zero field is its
// default (DefaultLimits).
type Limits struct {
	// TarBytes bounds the file data of one fs_push or fs_pull archive.
	TarBytes int64
	// TarEntries bounds the entries (files, directories, links) of one.
	TarEntries int
	// FindFileBytes: fs_find skips larger files unread, fs_replace leaves
	// them alone (0 replacements), as the old agent did.
	FindFileBytes int64
	// FindMatches bounds the match frames of one fs_find; past it the find
	// ends with a bad_request saying so.
	FindMatches int
	// WatchQueue bounds the events of one fs_watch waiting for the client;
	// past it the watch ends with an internal "watch event queue overflow".
	WatchQueue int
	// GitStatusFiles bounds git_status's files (then truncated is set).
	GitStatusFiles int
}

// DefaultLimits are the bounds a zero Limits field stands for.
var DefaultLimits = Limits{
	TarBytes:       4 << 30,
	TarEntries:     500_000,
	FindFileBytes:  8 << 20,
	FindMatches:    100_000,
	WatchQueue:     256,
	GitStatusFiles: 10_000,
}

// withDefaults fills l's zero fields from DefaultLimits.
func (l Limits) withDefaults() Limits {
	d := DefaultLimits
	return Limits{
		TarBytes:       orDefault(l.TarBytes, d.TarBytes),
		TarEntries:     orDefault(l.TarEntries, d.TarEntries),
		FindFileBytes:  orDefault(l.FindFileBytes, d.FindFileBytes),
		FindMatches:    orDefault(l.FindMatches, d.FindMatches),
		WatchQueue:     orDefault(l.WatchQueue, d.WatchQueue),
		GitStatusFiles: orDefault(l.GitStatusFiles, d.GitStatusFiles),
	}
}

// orDefault is v, or d when v is not positive.
func orDefault[T int | int64](v, d T) T {
	if v > 0 {
		return v
	}
	return d
}

// tree returns the Server's FS as a TreeFS, or nil.
func (s *Server) tree() TreeFS {
	t, _ := s.FS.(TreeFS)
	return t
}

// Lstat implements TreeFS.
func (OSFS) Lstat(p string) (silkd.StatInfo, error) { return statInfo(os.Lstat(p)) }

// Readlink implements TreeFS.
func (OSFS) Readlink(p string) (string, error) { return os.Readlink(p) }

// Symlink implements TreeFS.
func (OSFS) Symlink(target, p string) error { return os.Symlink(target, p) }

// WriteNew implements TreeFS.
func (OSFS) WriteNew(p string, mode uint32, r io.Reader) error {
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	_, err = io.Copy(f, r)
	if err == nil {
		// Chmod, not the open's mode: the umask must not strip the archive's bits.
		err = f.Chmod(unixMode(mode))
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(p)
	}
	return err
}

// unixMode turns wire permission bits into an fs.FileMode.
func unixMode(b uint32) fs.FileMode {
	m := fs.FileMode(b & 0o777)
	if b&0o4000 != 0 {
		m |= fs.ModeSetuid
	}
	if b&0o2000 != 0 {
		m |= fs.ModeSetgid
	}
	if b&0o1000 != 0 {
		m |= fs.ModeSticky
	}
	return m
}

// Lstat implements TreeFS: a MemFS holds no symlinks.
func (m *MemFS) Lstat(p string) (silkd.StatInfo, error) { return m.Stat(p) }

// Readlink implements TreeFS: a MemFS holds no symlinks.
func (m *MemFS) Readlink(p string) (string, error) {
	return "", &fs.PathError{Op: "readlink", Path: p, Err: syscall.EINVAL}
}

// Symlink implements TreeFS: the simulated guest refuses symlinks.
func (m *MemFS) Symlink(target, p string) error {
	return badRequest("symlink %s: the simulated guest holds no symlinks", p)
}

// WriteNew implements TreeFS.
func (m *MemFS) WriteNew(p string, mode uint32, r io.Reader) error {
	if _, err := m.Stat(p); err == nil {
		return &fs.PathError{Op: "create", Path: p, Err: fs.ErrExist}
	}
	up, err := m.Create(p, &mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(up, r); err != nil {
		up.Abort()
		return err
	}
	return up.Commit()
}

// errLimit is a bound of Limits passed; it is the client's doing.
func errLimit(op, format string, args ...any) error {
	return badRequest("%s: %s", op, fmt.Sprintf(format, args...))
}
