package fsx

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"hash"
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// ContentSum digests a file's content without reading its holes: the size,
// then every 4 KiB page that is not all zero, with its offset. Equal bytes
// give equal sums whatever the hole layout (a reflink, a sparse copy, a
// hard link), and a sparse guest memory file costs only its data.
func ContentSum(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return "", err
	}
	h := NewContentHash(st.Size())
	if err := DataRuns(f, st.Size(), func(off int64, run []byte) error {
		h.Add(off, run)
		return nil
	}); err != nil {
		return "", err
	}
	return h.Sum(), nil
}

// ContentHash computes ContentSum from a file's runs of non-zero pages
// (DataRuns), for a caller that reads them anyway (a copy that sums what
// it writes).
type ContentHash struct {
	h    hash.Hash
	word [8]byte
}

// NewContentHash starts the ContentSum of a file of size bytes.
func NewContentHash(size int64) *ContentHash {
	c := &ContentHash{h: sha256.New()}
	c.put(uint64(size))
	return c
}

func (c *ContentHash) put(v uint64) {
	binary.LittleEndian.PutUint64(c.word[:], v)
	c.h.Write(c.word[:])
}

// Add hashes run, non-zero pages at offset off, page by page, as
// ContentSum does.
func (c *ContentHash) Add(off int64, run []byte) {
	for p := 0; p < len(run); p += pageSize {
		c.put(uint64(off) + uint64(p))
		c.h.Write(run[p:min(p+pageSize, len(run))])
	}
}

// Sum is the hex digest, ContentSum's.
func (c *ContentHash) Sum() string { return hex.EncodeToString(c.h.Sum(nil)) }

const pageSize = 4096

// DataRuns calls fn, in offset order, with each run of consecutive 4 KiB
// pages of f that are not all zero (its first size bytes), skipping holes
// (SEEK_DATA, SEEK_HOLE) unread. run is only valid during the call. A file
// shorter than size ends the walk at its end.
//
// The reads run one chunk ahead of fn in a goroutine of their own (f is read
// with pread only), so a caller that hashes or writes each run (the archive's
// copy and read-back, ContentSum) overlaps that work with the next read
// instead of waiting for the disk and then the CPU in turn. The goroutine
// has ended when DataRuns returns.
func DataRuns(f *os.File, size int64, fn func(off int64, run []byte) error) error {
	// Two buffers: fn scans one while the reader fills the other.
	bufSize := int(min(int64(chunkSize), max(pageSize, (size+pageSize-1)&^(pageSize-1))))
	free := make(chan []byte, 2)
	free <- make([]byte, bufSize)
	free <- make([]byte, bufSize)
	full := make(chan readChunk, 2)
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer close(full)
		readChunks(f, size, free, full, stop)
	}()
	err := scanChunks(full, free, fn)
	close(stop)
	for range full { // unblock a reader waiting to send, then let it end
	}
	<-done
	return err
}

// chunkSize is DataRuns' read size.
const chunkSize = 1 << 20

// readChunk is one read of DataRuns: n bytes of buf read at pos, or the
// error that ends the walk.
type readChunk struct {
	pos int64
	buf []byte
	n   int
	err error
}

// readChunks reads f's data ranges (below size) chunk by chunk into buffers
// from free and sends them to full, until the end, an error or stop.
func readChunks(f *os.File, size int64, free chan []byte, full chan<- readChunk, stop <-chan struct{}) {
	fd := int(f.Fd())
	send := func(c readChunk) bool {
		select {
		case full <- c:
			return true
		case <-stop:
			return false
		}
	}
	for off := int64(0); off < size; {
		data, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			return
		}
		if err != nil {
			send(readChunk{err: err})
			return
		}
		hole, err := unix.Seek(fd, data, unix.SEEK_HOLE)
		if err != nil {
			send(readChunk{err: err})
			return
		}
		hole = min(hole, size)
		for pos := data &^ (pageSize - 1); pos < hole; {
			var buf []byte
			select {
			case buf = <-free:
			case <-stop:
				return
			}
			n, err := f.ReadAt(buf[:min(int64(len(buf)), hole-pos)], pos)
			if n == 0 {
				if err != nil && err != io.EOF {
					send(readChunk{err: err})
				}
				return
			}
			if !send(readChunk{pos: pos, buf: buf, n: n}) {
				return
			}
			pos += int64(n)
		}
		off = hole
	}
}

// scanChunks calls fn with the runs of non-zero pages of each chunk from
// full, returning each buffer to free once scanned.
func scanChunks(full <-chan readChunk, free chan<- []byte, fn func(off int64, run []byte) error) error {
	var zero [pageSize]byte
	for c := range full {
		if c.err != nil {
			return c.err
		}
		buf, n := c.buf, c.n
		// A run ends at a zero page or at the end of what was read.
		run := -1
		for p := 0; ; p += pageSize {
			p = min(p, n)
			zeroPage := p == n || bytes.Equal(buf[p:min(p+pageSize, n)], zero[:min(pageSize, n-p)])
			switch {
			case zeroPage && run >= 0:
				if err := fn(c.pos+int64(run), buf[run:p]); err != nil {
					return err
				}
				run = -1
			case !zeroPage && run < 0:
				run = p
			}
			if p == n {
				break
			}
		}
		free <- buf
	}
	return nil
}
