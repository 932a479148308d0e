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
func DataRuns(f *os.File, size int64, fn func(off int64, run []byte) error) error {
	fd := int(f.Fd())
	buf := make([]byte, 1<<20)
	var zero [pageSize]byte
	for off := int64(0); off < size; {
		data, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			return nil
		}
		if err != nil {
			return err
		}
		hole, err := unix.Seek(fd, data, unix.SEEK_HOLE)
		if err != nil {
			return err
		}
		hole = min(hole, size)
		for pos := data &^ (pageSize - 1); pos < hole; {
			n, err := f.ReadAt(buf[:min(int64(len(buf)), hole-pos)], pos)
			if n == 0 {
				if err == nil || err == io.EOF {
					return nil
				}
				return err
			}
			// A run ends at a zero page or at the end of what was read.
			run := -1
			for p := 0; ; p += pageSize {
				p = min(p, n)
				zeroPage := p == n || bytes.Equal(buf[p:min(p+pageSize, n)], zero[:min(pageSize, n-p)])
				switch {
				case zeroPage && run >= 0:
					if err := fn(pos+int64(run), buf[run:p]); err != nil {
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
			pos += int64(n)
		}
		off = hole
	}
	return nil
}
