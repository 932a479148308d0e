package silkagent

import (
	"cmp"
	"encoding/binary"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/sbxlog/sbxlog/executors/guest/silkd"
)

// inotifyMask is what a watch asks the kernel for: the changes the
// protocol's event kinds name.
const inotifyMask = unix.IN_CREATE | unix.IN_DELETE | unix.IN_MODIFY | unix.IN_ATTRIB |
	unix.IN_MOVED_FROM | unix.IN_MOVED_TO | unix.IN_DELETE_SELF | unix.IN_MOVE_SELF

// inotifyKind maps an inotify event to the protocol's kind as the old
// agent (inotify through the notify crate) named it: a move is "renamed"
// at both ends, the name it left and the name it took (also when it came
// from outside the watch), a change of content or metadata "modified".
// Empty: not reported.
func inotifyKind(mask uint32) string {
	switch {
	case mask&unix.IN_CREATE != 0:
		return "created"
	case mask&(unix.IN_DELETE|unix.IN_DELETE_SELF) != 0:
		return "deleted"
	case mask&(unix.IN_MOVED_FROM|unix.IN_MOVED_TO|unix.IN_MOVE_SELF) != 0:
		return "renamed"
	case mask&(unix.IN_MODIFY|unix.IN_ATTRIB) != 0:
		return "modified"
	}
	return ""
}

// inotifyWatch is one fs_watch of the real tree: an inotify instance and
// the path of each of its watches. The instance is read through Go's
// poller (non-blocking), so closing it ends the reader.
type inotifyWatch struct {
	f         *os.File
	root      string
	recursive bool
	mu        sync.Mutex
	paths     map[int32]string // watch descriptor -> path
}

// add watches q; with the same inode watched already (a directory moved
// within the tree) the kernel answers its descriptor, which now names q.
func (w *inotifyWatch) add(q string) error {
	rc, err := w.f.SyscallConn()
	if err != nil {
		return err
	}
	var wd int
	cerr := rc.Control(func(fd uintptr) { wd, err = unix.InotifyAddWatch(int(fd), q, inotifyMask) })
	if err = cmp.Or(cerr, err); err != nil {
		return &fs.PathError{Op: "watch", Path: q, Err: err}
	}
	w.mu.Lock()
	w.paths[int32(wd)] = q
	w.mu.Unlock()
	return nil
}

// addTree watches root and, for a recursive watch, every directory below
// it; only a failure at root is an error (a directory below it may go
// away or be unreadable).
func (w *inotifyWatch) addTree(root string) error {
	if !w.recursive {
		return w.add(root)
	}
	return filepath.WalkDir(root, func(q string, d fs.DirEntry, err error) error {
		if err != nil {
			if q == root {
				return err
			}
			return nil
		}
		if d.IsDir() {
			if err := w.add(q); err != nil && q == root {
				return err
			}
		}
		return nil
	})
}

// Watch implements Watcher with inotify. A recursive watch adds the
// directories created or moved in below it as they appear; a change of a
// directory below the root (its chmod, removal, move) is reported once,
// by its parent's watch, not again by its own.
func (OSFS) Watch(p string, recursive bool, emit func(silkd.Event), fail func(error)) (func(), error) {
	st, err := os.Stat(p)
	if err != nil {
		return nil, err
	}
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return nil, os.NewSyscallError("inotify_init1", err)
	}
	w := &inotifyWatch{f: os.NewFile(uintptr(fd), "inotify"), root: filepath.Clean(p), recursive: recursive && st.IsDir(), paths: map[int32]string{}}
	if err := w.addTree(w.root); err != nil {
		w.f.Close()
		return nil, err
	}
	go w.read(emit, fail)
	return func() { w.f.Close() }, nil
}

// read reports the instance's events until it is closed.
func (w *inotifyWatch) read(emit func(silkd.Event), fail func(error)) {
	buf := make([]byte, 64<<10)
	for {
		n, err := w.f.Read(buf)
		if err != nil {
			if !errors.Is(err, os.ErrClosed) {
				fail(err)
			}
			return
		}
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			wd := int32(binary.NativeEndian.Uint32(buf[off:]))
			mask := binary.NativeEndian.Uint32(buf[off+4:])
			nameLen := int(binary.NativeEndian.Uint32(buf[off+12:]))
			name := buf[off+unix.SizeofInotifyEvent : off+unix.SizeofInotifyEvent+nameLen]
			off += unix.SizeofInotifyEvent + nameLen
			if mask&unix.IN_Q_OVERFLOW != 0 {
				fail(errors.New(overflowMessage + " (inotify)"))
				return
			}
			w.event(wd, mask, string(trimNUL(name)), emit)
		}
	}
}

func trimNUL(b []byte) []byte {
	for len(b) > 0 && b[len(b)-1] == 0 {
		b = b[:len(b)-1]
	}
	return b
}

// event reports one inotify event of the watch wd.
func (w *inotifyWatch) event(wd int32, mask uint32, name string, emit func(silkd.Event)) {
	w.mu.Lock()
	dir, ok := w.paths[wd]
	if mask&unix.IN_IGNORED != 0 {
		delete(w.paths, wd)
	}
	w.mu.Unlock()
	kind := inotifyKind(mask)
	if !ok || kind == "" {
		return
	}
	p := dir
	if name != "" {
		p = filepath.Join(dir, name)
	} else if dir != w.root {
		return // about a directory below the root: its parent's watch said it
	}
	if mask&unix.IN_ISDIR != 0 && mask&(unix.IN_CREATE|unix.IN_MOVED_TO) != 0 && w.recursive {
		_ = w.addTree(p)
	}
	emit(silkd.Event{Kind: kind, Path: p})
}
