package chsim

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"os"
	"slices"

	"golang.org/x/sys/unix"
)

const pageSize = 4096

// extent is a page-aligned range of guest memory that holds data; the rest
// is zero and stays a hole in memory-ranges.
type extent struct {
	Off int64 `json:"off"`
	Len int64 `json:"len"`
}

// guestMemory is a guest's RAM: anonymous memory after a boot or a Copy
// restore, a MAP_PRIVATE mapping of memory-ranges after a CopyOnWrite (or
// OnDemand) restore.
type guestMemory struct {
	data    []byte
	file    *os.File // backing file of a private mapping
	mode    string
	extents []extent
	next    int // round-robin cursor of touchNext
	// expect is the checksum a mapped restore's memory must have; the guest
	// checks it on its first run.
	expect *uint32
}

func newAnonMemory(size int64) (*guestMemory, error) {
	data, err := unix.Mmap(-1, 0, int(size), unix.PROT_READ|unix.PROT_WRITE,
		unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	if err != nil {
		return nil, fmt.Errorf("mmap %d bytes: %w", size, err)
	}
	return &guestMemory{data: data, mode: "anonymous"}, nil
}

// mapPrivate maps f copy-on-write: guest writes land in anonymous pages, the
// file and its page cache pages stay untouched and shared.
func mapPrivate(f *os.File, size int64, mode string) (*guestMemory, error) {
	data, err := unix.Mmap(int(f.Fd()), 0, int(size), unix.PROT_READ|unix.PROT_WRITE,
		unix.MAP_PRIVATE|unix.MAP_NORESERVE)
	if err != nil {
		return nil, fmt.Errorf("mmap memory-ranges: %w", err)
	}
	return &guestMemory{data: data, file: f, mode: mode}, nil
}

func (m *guestMemory) close() {
	if m.data != nil {
		_ = unix.Munmap(m.data)
		m.data = nil
	}
	if m.file != nil {
		m.file.Close()
		m.file = nil
	}
}

// fillBoot writes n bytes of recognisable data, spread over up to 64 chunks
// across memory as a booted kernel's working set would be. Every page starts
// with its page number and the boot id.
func (m *guestMemory) fillBoot(n int64, bootID uint64) {
	pages := n / pageSize
	if pages == 0 {
		return
	}
	total := int64(len(m.data)) / pageSize
	chunks := min(int64(64), pages)
	per := pages / chunks
	stride := total / chunks
	var tmpl [pageSize]byte
	for i := range tmpl {
		tmpl[i] = byte(i*7 + int(bootID))
	}
	for c := int64(0); c < chunks; c++ {
		first := c * stride
		count := per
		if c == chunks-1 {
			count = pages - per*(chunks-1)
		}
		count = min(count, total-first)
		for p := first; p < first+count; p++ {
			pg := m.data[p*pageSize : (p+1)*pageSize]
			copy(pg, tmpl[:])
			binary.LittleEndian.PutUint64(pg[0:], uint64(p))
			binary.LittleEndian.PutUint64(pg[8:], bootID)
		}
		m.markData(first*pageSize, count*pageSize)
	}
}

// heartbeat is the guest's periodic write, into page 0.
func (m *guestMemory) heartbeat(n int64) {
	binary.LittleEndian.PutUint64(m.data[64:], uint64(n))
	m.markData(0, pageSize)
}

// touchNext reads one data page, round robin, as a running guest does.
func (m *guestMemory) touchNext() byte {
	var pages int64
	for _, e := range m.extents {
		pages += e.Len / pageSize
	}
	if pages == 0 {
		return 0
	}
	m.next = (m.next + 1) % int(pages)
	idx := int64(m.next)
	for _, e := range m.extents {
		if n := e.Len / pageSize; idx < n {
			return m.data[e.Off+idx*pageSize+pageSize/2]
		} else {
			idx -= n
		}
	}
	return 0
}

// markData records [off, off+n) as holding data, keeping extents sorted and
// merged.
func (m *guestMemory) markData(off, n int64) {
	if n <= 0 {
		return
	}
	m.extents = mergeExtents(append(m.extents, extent{off, n}))
}

func mergeExtents(in []extent) []extent {
	slices.SortFunc(in, func(a, b extent) int {
		switch {
		case a.Off < b.Off:
			return -1
		case a.Off > b.Off:
			return 1
		}
		return 0
	})
	out := in[:0]
	for _, e := range in {
		if k := len(out); k > 0 && e.Off <= out[k-1].Off+out[k-1].Len {
			out[k-1].Len = max(out[k-1].Len, e.Off+e.Len-out[k-1].Off)
			continue
		}
		out = append(out, e)
	}
	return out
}

func (m *guestMemory) dataBytes() int64 {
	var n int64
	for _, e := range m.extents {
		n += e.Len
	}
	return n
}

// checksum is CRC-32C over the data extents, in order.
func (m *guestMemory) checksum() uint32 {
	h := crc32.New(crc32.MakeTable(crc32.Castagnoli))
	for _, e := range m.extents {
		h.Write(m.data[e.Off : e.Off+e.Len])
	}
	return h.Sum32()
}
