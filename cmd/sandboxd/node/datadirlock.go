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

// lockDataDir takes dir's lock; closing the file releases it.
func lockDataDir(dir string) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(dir, lockFile), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		if errors.Is(err, os.ErrPermission) || errors.Is(err, unix.EROFS) {
			return nil, fmt.Errorf("data dir %s is not writable by this process (uid %d): %w", dir, os.Getuid(), err)
		}
		return nil, fmt.Errorf("data dir %s: %w", dir, err)
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
