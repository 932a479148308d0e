package node

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// lockFile, in the data dir, is held (flock) by the one sandboxd using the
// dir and holds its pid, so a second one is refused at once, naming the
// first, before it touches the log (Pebble's own lock said only "resource
// temporarily unavailable"), and a data dir sandboxd cannot write is
// reported as such rather than as the first file it failed to create.
const lockFile = "sandboxd.lock"

// PrepareDataDir makes dir (with its parents) and checks that this
// process can create files in it, before anything is written there: a dir
// it cannot use is reported as the data dir's fault, naming it, and not as
// the first file that failed (the daemon writes its token file before
// Start, and a read-only data dir used to be that file's error). Start
// calls it too.
func PrepareDataDir(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return dataDirError(dir, err)
	}
	f, err := os.CreateTemp(dir, ".writable-")
	if err != nil {
		return dataDirError(dir, err)
	}
	f.Close()
	return os.Remove(f.Name())
}

// dataDirError says what is wrong with data dir dir, given the error of a
// file operation in it.
func dataDirError(dir string, err error) error {
	switch {
	case errors.Is(err, os.ErrPermission) || errors.Is(err, unix.EROFS):
		return fmt.Errorf("data dir %s is not writable by this process (uid %d): %w", dir, os.Getuid(), err)
	case errors.Is(err, unix.ENOTDIR):
		return fmt.Errorf("data dir %s cannot be made: a part of its path is not a directory: %w", dir, err)
	}
	return fmt.Errorf("data dir %s: %w", dir, err)
}

// lockDataDir takes dir's lock; closing the file releases it.
func lockDataDir(dir string) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(dir, lockFile), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, dataDirError(dir, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		pid, _ := io.ReadAll(io.LimitReader(f, 32))
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("another sandboxd holds %s (pid %s): stop it, or start this one with another data dir (-data)", dir, strings.TrimSpace(string(pid)))
		}
		return nil, fmt.Errorf("data dir %s: lock: %w", dir, err)
	}
	if err := f.Truncate(0); err == nil {
		_, err = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return f, nil
}
