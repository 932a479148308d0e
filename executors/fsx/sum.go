package fsx

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
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
	size := st.Size()
	h := sha256.New()
	var word [8]byte
	binary.LittleEndian.PutUint64(word[:], uint64(size))
	h.Write(word[:])
	fd := int(f.Fd())
	buf := make([]byte, 1<<20)
	var zero [4096]byte
	for off := int64(0); off < size; {
		data, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break
		}
		if err != nil {
			return "", err
		}
		hole, err := unix.Seek(fd, data, unix.SEEK_HOLE)
		if err != nil {
			return "", err
		}
		for pos := data &^ 4095; pos < hole; {
			n, err := f.ReadAt(buf[:min(int64(len(buf)), hole-pos)], pos)
			if n == 0 && err != nil {
				return "", err
			}
			for p := 0; p < n; p += 4096 {
				page := buf[p:min(p+4096, n)]
				if bytes.Equal(page, zero[:len(page)]) {
					continue
				}
				binary.LittleEndian.PutUint64(word[:], uint64(pos)+uint64(p))
				h.Write(word[:])
				h.Write(page)
			}
			pos += int64(n)
		}
		off = hole
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
