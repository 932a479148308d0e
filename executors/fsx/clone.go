package fsx

import (
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"syscall"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"
)

// Method says how Clone produced its copy.
type Method int

const (
	// Reflink: FICLONE; the copy shares every extent with its source.
	Reflink Method = iota + 1
	// Copy: the sparse-copy fallback; data ranges were copied, holes kept.
	Copy
)

func (m Method) String() string {
	switch m {
	case Reflink:
		return "reflink"
	case Copy:
		return "copy"
	}
	return fmt.Sprintf("Method(%d)", int(m))
}

// CloneResult reports what a Clone did, for the recipe's result event.
type CloneResult struct {
	Method Method
	// Size is the file size of the new file (equal to the source's).
	Size int64
	// Bytes is how many bytes were physically copied: 0 for a reflink, the sum of
	// the source's data ranges for a copy.
	Bytes int64
}

// ErrSameFile is returned by Clone with Overwrite when dst already is src: the
// overwrite would truncate the source.
var ErrSameFile = errors.New("fsx: destination is the source file")

// ErrNotRegular is returned by Clone when src is not a regular file.
var ErrNotRegular = errors.New("fsx: not a regular file")

// CloneOption changes how Clone creates its destination.
type CloneOption func(*cloneConfig)

type cloneConfig struct {
	overwrite bool
}

// Overwrite lets Clone replace an existing dst instead of failing with fs.ErrExist.
// A recipe re-running a step after a crash uses it, since the earlier attempt may
// have left a complete or empty file there.
func Overwrite() CloneOption {
	return func(c *cloneConfig) { c.overwrite = true }
}

type devPair struct{ src, dst uint64 }

type support int

const (
	supportUnknown support = iota
	supportReflink
	supportCopy
)

// Cloner clones files and remembers, per pair of filesystems, whether reflink works
// there. It is safe for concurrent use. The zero value is not usable; use NewCloner.
type Cloner struct {
	log zerolog.Logger

	mu   sync.Mutex
	devs map[devPair]support
}

// NewCloner returns a Cloner that logs the copy fallback (once per filesystem pair)
// on log.
func NewCloner(log zerolog.Logger) *Cloner {
	return &Cloner{log: log, devs: make(map[devPair]support)}
}

// Detect reports whether files in dir clone by reflink or by copy, by cloning a
// small temp file there (which also primes the per-filesystem cache, so the fallback
// is logged at start-up rather than in the middle of the first recipe).
func (c *Cloner) Detect(dir string) (Method, error) {
	f, err := os.CreateTemp(dir, TempPrefix+"detect-*")
	if err != nil {
		return 0, fmt.Errorf("fsx: detect: %w", err)
	}
	src := f.Name()
	defer os.Remove(src)
	_, werr := f.Write(make([]byte, 4096))
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr != nil {
		return 0, fmt.Errorf("fsx: detect: %w", werr)
	}
	dst := src + ".clone"
	res, err := c.Clone(dst, src)
	if err != nil {
		return 0, fmt.Errorf("fsx: detect: %w", err)
	}
	_ = os.Remove(dst)
	return res.Method, nil
}

func (c *Cloner) support(k devPair) support {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.devs[k]
}

// learn records s for k and reports whether this call was the one that decided it.
func (c *Cloner) learn(k devPair, s support) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.devs[k] != supportUnknown {
		return false
	}
	c.devs[k] = s
	return true
}

// noReflink reports whether FICLONE failed because the filesystem (or the pair of
// filesystems) cannot share extents, as opposed to a real I/O or permission error.
func noReflink(err error) bool {
	return errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.EXDEV) ||
		errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOTTY) || errors.Is(err, unix.ENOSYS)
}

// Clone makes dst a copy of src; see the package doc for the contract.
func (c *Cloner) Clone(dst, src string, opts ...CloneOption) (res CloneResult, err error) {
	var cfg cloneConfig
	for _, o := range opts {
		o(&cfg)
	}
	sf, err := os.Open(src)
	if err != nil {
		return res, fmt.Errorf("fsx: clone: %w", err)
	}
	defer sf.Close()
	var sst unix.Stat_t
	if err := unix.Fstat(int(sf.Fd()), &sst); err != nil {
		return res, fmt.Errorf("fsx: clone: stat %s: %w", src, err)
	}
	if sst.Mode&unix.S_IFMT != unix.S_IFREG {
		return res, fmt.Errorf("fsx: clone %s: %w", src, ErrNotRegular)
	}

	flags := os.O_WRONLY | os.O_CREATE | os.O_EXCL
	if cfg.overwrite {
		if st, err := os.Stat(dst); err == nil {
			if ss, err := sf.Stat(); err == nil && os.SameFile(st, ss) {
				return res, fmt.Errorf("fsx: clone %s onto %s: %w", src, dst, ErrSameFile)
			}
		}
		flags = os.O_WRONLY | os.O_CREATE | os.O_TRUNC
	}
	df, err := os.OpenFile(dst, flags, 0o600)
	if err != nil {
		return res, fmt.Errorf("fsx: clone: %w", err)
	}
	defer func() {
		if cerr := df.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("fsx: clone: close %s: %w", dst, cerr)
		}
		if err != nil {
			_ = os.Remove(dst)
		}
	}()
	var dst2 unix.Stat_t
	if err := unix.Fstat(int(df.Fd()), &dst2); err != nil {
		return res, fmt.Errorf("fsx: clone: stat %s: %w", dst, err)
	}
	key := devPair{src: uint64(sst.Dev), dst: uint64(dst2.Dev)}
	res.Size = sst.Size

	res.Method = Copy
	if state := c.support(key); state != supportCopy {
		cerr := unix.IoctlFileClone(int(df.Fd()), int(sf.Fd()))
		switch {
		case cerr == nil:
			c.learn(key, supportReflink)
			res.Method = Reflink
		case !noReflink(cerr):
			return res, fmt.Errorf("fsx: clone %s to %s: FICLONE: %w", src, dst, cerr)
		case state == supportUnknown:
			if c.learn(key, supportCopy) {
				c.log.Warn().Err(cerr).Uint64("src_dev", key.src).Uint64("dst_dev", key.dst).
					Str("src", src).Str("dst", dst).
					Msg("filesystem cannot reflink; clones here are sparse copies (full data cost)")
			}
		default:
			// The filesystem reflinked before; one file refusing is unusual enough to
			// say every time, and the copy still gives a correct result.
			c.log.Warn().Err(cerr).Str("src", src).Str("dst", dst).
				Msg("FICLONE refused on a filesystem that reflinks; copying this file")
		}
	}
	if res.Method == Copy {
		n, err := sparseCopy(df, sf, sst.Size)
		res.Bytes = n
		if err != nil {
			return res, fmt.Errorf("fsx: clone %s to %s: copy: %w", src, dst, err)
		}
	}
	if err := unix.Fchmod(int(df.Fd()), sst.Mode&0o7777); err != nil {
		return res, fmt.Errorf("fsx: clone: chmod %s: %w", dst, err)
	}
	return res, nil
}

// sparseCopy copies the data ranges of src (as SEEK_DATA/SEEK_HOLE report them) to
// the same offsets of dst and sets dst's size to size, leaving holes unallocated.
func sparseCopy(dst, src *os.File, size int64) (int64, error) {
	sfd, dfd := int(src.Fd()), int(dst.Fd())
	cp := rangeCopier{src: sfd, dst: dfd}
	var copied int64
	for off := int64(0); off < size; {
		data, err := unix.Seek(sfd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // only a hole remains
		}
		hole := size
		if err != nil {
			if !errors.Is(err, unix.EINVAL) {
				return copied, fmt.Errorf("SEEK_DATA: %w", err)
			}
			// No SEEK_DATA here: the whole remainder counts as data.
			data = off
		} else {
			hole, err = unix.Seek(sfd, data, unix.SEEK_HOLE)
			if err != nil {
				return copied, fmt.Errorf("SEEK_HOLE: %w", err)
			}
		}
		if hole > size {
			hole = size
		}
		if data >= hole {
			break
		}
		n, err := cp.copy(data, hole-data)
		copied += n
		if err != nil {
			return copied, err
		}
		off = hole
	}
	if err := unix.Ftruncate(dfd, size); err != nil {
		return copied, fmt.Errorf("truncate: %w", err)
	}
	return copied, nil
}

// rangeCopier copies byte ranges at equal offsets, in the kernel with
// copy_file_range where it can and with pread/pwrite where it cannot.
type rangeCopier struct {
	src, dst int
	noCFR    bool
	buf      []byte
}

func (r *rangeCopier) copy(off, n int64) (int64, error) {
	var done int64
	for done < n && !r.noCFR {
		roff, woff := off+done, off+done
		chunk := min(n-done, 1<<30)
		m, err := unix.CopyFileRange(r.src, &roff, r.dst, &woff, int(chunk), 0)
		if err != nil {
			if done == 0 && (errors.Is(err, unix.EXDEV) || errors.Is(err, unix.EOPNOTSUPP) ||
				errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EINVAL)) {
				r.noCFR = true
				break
			}
			if errors.Is(err, syscall.EINTR) {
				continue
			}
			return done, fmt.Errorf("copy_file_range: %w", err)
		}
		if m == 0 {
			return done, fmt.Errorf("copy_file_range at %d: %w", off+done, io.ErrUnexpectedEOF)
		}
		done += int64(m)
	}
	if r.buf == nil && done < n {
		r.buf = make([]byte, 1<<20)
	}
	for done < n {
		chunk := r.buf[:min(n-done, int64(len(r.buf)))]
		m, err := unix.Pread(r.src, chunk, off+done)
		if err != nil {
			if errors.Is(err, syscall.EINTR) {
				continue
			}
			return done, fmt.Errorf("pread: %w", err)
		}
		if m == 0 {
			return done, fmt.Errorf("pread at %d: %w", off+done, io.ErrUnexpectedEOF)
		}
		if _, err := writeFullAt(r.dst, chunk[:m], off+done); err != nil {
			return done, err
		}
		done += int64(m)
	}
	return done, nil
}

func writeFullAt(fd int, p []byte, off int64) (int, error) {
	var w int
	for w < len(p) {
		m, err := unix.Pwrite(fd, p[w:], off+int64(w))
		if err != nil {
			if errors.Is(err, syscall.EINTR) {
				continue
			}
			return w, fmt.Errorf("pwrite: %w", err)
		}
		w += m
	}
	return w, nil
}
