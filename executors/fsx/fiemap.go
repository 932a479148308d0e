package fsx

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ExtentFlag is the fe_flags field of a FIEMAP extent (linux/fiemap.h).
type ExtentFlag uint32

// FIEMAP extent flags.
const (
	ExtentLast          ExtentFlag = 0x1
	ExtentUnknown       ExtentFlag = 0x2
	ExtentDelalloc      ExtentFlag = 0x4
	ExtentEncoded       ExtentFlag = 0x8
	ExtentDataEncrypted ExtentFlag = 0x80
	ExtentNotAligned    ExtentFlag = 0x100
	ExtentDataInline    ExtentFlag = 0x200
	ExtentDataTail      ExtentFlag = 0x400
	ExtentUnwritten     ExtentFlag = 0x800
	ExtentMerged        ExtentFlag = 0x1000
	ExtentShared        ExtentFlag = 0x2000
)

var extentFlagNames = []struct {
	f    ExtentFlag
	name string
}{
	{ExtentLast, "last"}, {ExtentUnknown, "unknown"}, {ExtentDelalloc, "delalloc"},
	{ExtentEncoded, "encoded"}, {ExtentDataEncrypted, "encrypted"}, {ExtentNotAligned, "not_aligned"},
	{ExtentDataInline, "inline"}, {ExtentDataTail, "tail"}, {ExtentUnwritten, "unwritten"},
	{ExtentMerged, "merged"}, {ExtentShared, "shared"},
}

func (f ExtentFlag) String() string {
	var parts []string
	rest := f
	for _, n := range extentFlagNames {
		if f&n.f != 0 {
			parts = append(parts, n.name)
			rest &^= n.f
		}
	}
	if rest != 0 {
		parts = append(parts, fmt.Sprintf("%#x", uint32(rest)))
	}
	return strings.Join(parts, "|")
}

// Extent is one FIEMAP extent, in bytes.
type Extent struct {
	Logical  uint64
	Physical uint64
	Length   uint64
	Flags    ExtentFlag
}

// Kernel ABI of struct fiemap and struct fiemap_extent (linux/fiemap.h).
type fiemapHdr struct {
	start         uint64
	length        uint64
	flags         uint32
	mappedExtents uint32
	extentCount   uint32
	reserved      uint32
}

type fiemapExtent struct {
	logical    uint64
	physical   uint64
	length     uint64
	reserved64 [2]uint64
	flags      uint32
	reserved   [3]uint32
}

const (
	fiemapBatch     = 256
	fiemapFlagSync  = 0x1
	iocFiemap       = 0xC020660B // _IOWR('f', 11, struct fiemap)
	fiemapMaxLength = ^uint64(0)
)

type fiemapReq struct {
	hdr fiemapHdr
	ext [fiemapBatch]fiemapExtent
}

// Extents returns the extents of path as FIEMAP reports them, after flushing
// delayed allocation (FIEMAP_FLAG_SYNC). Filesystems without FIEMAP (tmpfs) return
// an error wrapping EOPNOTSUPP.
func Extents(path string) ([]Extent, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("fsx: fiemap: %w", err)
	}
	defer f.Close()
	fd := f.Fd()
	var out []Extent
	req := new(fiemapReq)
	start := uint64(0)
	for {
		*req = fiemapReq{}
		req.hdr = fiemapHdr{start: start, length: fiemapMaxLength - start, flags: fiemapFlagSync, extentCount: fiemapBatch}
		_, _, errno := unix.Syscall(unix.SYS_IOCTL, fd, iocFiemap, uintptr(unsafe.Pointer(req)))
		if errno != 0 {
			return nil, fmt.Errorf("fsx: fiemap %s: %w", path, errno)
		}
		n := int(req.hdr.mappedExtents)
		if n == 0 {
			return out, nil
		}
		for _, e := range req.ext[:n] {
			out = append(out, Extent{Logical: e.logical, Physical: e.physical, Length: e.length, Flags: ExtentFlag(e.flags)})
		}
		last := req.ext[n-1]
		if ExtentFlag(last.flags)&ExtentLast != 0 {
			return out, nil
		}
		start = last.logical + last.length
	}
}

// AllExtentsShared reports whether path has at least one extent and every extent
// carries FIEMAP_EXTENT_SHARED: the proof that a reflink clone copied no data.
func AllExtentsShared(path string) (bool, error) {
	ext, err := Extents(path)
	if err != nil {
		return false, err
	}
	for _, e := range ext {
		if e.Flags&ExtentShared == 0 {
			return false, nil
		}
	}
	return len(ext) > 0, nil
}

// SharedBytes returns how many bytes of a's extents lie on physical blocks that b's
// extents also map, and the total bytes of a's extents. shared == total means a
// holds no block of its own relative to b. Extents without a defined physical
// location (unknown, inline) count toward total but never toward shared.
func SharedBytes(a, b string) (shared, total uint64, err error) {
	ea, err := Extents(a)
	if err != nil {
		return 0, 0, err
	}
	eb, err := Extents(b)
	if err != nil {
		return 0, 0, err
	}
	type span struct{ lo, hi uint64 }
	var spans []span
	for _, e := range eb {
		if located(e) {
			spans = append(spans, span{e.Physical, e.Physical + e.Length})
		}
	}
	slices.SortFunc(spans, func(x, y span) int {
		switch {
		case x.lo < y.lo:
			return -1
		case x.lo > y.lo:
			return 1
		}
		return 0
	})
	// Merge so overlapping extents of b are not counted twice.
	merged := spans[:0]
	for _, s := range spans {
		if k := len(merged); k > 0 && s.lo <= merged[k-1].hi {
			merged[k-1].hi = max(merged[k-1].hi, s.hi)
			continue
		}
		merged = append(merged, s)
	}
	for _, e := range ea {
		total += e.Length
		if !located(e) {
			continue
		}
		lo, hi := e.Physical, e.Physical+e.Length
		for _, s := range merged {
			if s.lo >= hi {
				break
			}
			if s.hi > lo {
				shared += min(hi, s.hi) - max(lo, s.lo)
			}
		}
	}
	return shared, total, nil
}

func located(e Extent) bool {
	return e.Flags&(ExtentUnknown|ExtentDataInline|ExtentDelalloc) == 0
}

// AllocatedBytes returns the bytes allocated to path on disk (st_blocks * 512).
func AllocatedBytes(path string) (int64, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return 0, fmt.Errorf("fsx: stat %s: %w", path, err)
	}
	return st.Blocks * 512, nil
}

// IsSparse reports whether path has fewer bytes allocated than its size.
func IsSparse(path string) (bool, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return false, fmt.Errorf("fsx: stat %s: %w", path, err)
	}
	return st.Blocks*512 < st.Size, nil
}
