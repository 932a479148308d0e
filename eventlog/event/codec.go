package event

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
)

// Record layout (all integers little-endian or unsigned varints):
//
//	crc32c  uint32   checksum of everything after it
//	format  uint8    FormatV1
//	seq     uvarint
//	time    varint   unix ns
//	type    uvarint
//	version uvarint
//	aggKind uint8
//	node    uvarint length + bytes
//	aggID   uvarint length + bytes
//	opID    16 bytes
//	cause   16 bytes
//	payload uvarint length + bytes
//
// The checksum comes first so a torn or corrupted record is detected before a
// single field is trusted.
const (
	FormatV1 = 1
	// FormatCurrent is the newest record format this build writes and reads.
	FormatCurrent = FormatV1
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Codec errors.
var (
	ErrChecksum  = errors.New("record checksum mismatch")
	ErrTruncated = errors.New("record truncated")
	ErrFormat    = errors.New("record format not supported")
)

// AppendEncode appends e's record encoding to dst and returns the result.
func AppendEncode(dst []byte, e *Event) []byte {
	start := len(dst)
	dst = append(dst, 0, 0, 0, 0, FormatV1)
	dst = binary.AppendUvarint(dst, e.Seq)
	dst = binary.AppendVarint(dst, e.Time)
	dst = binary.AppendUvarint(dst, uint64(e.Type))
	dst = binary.AppendUvarint(dst, uint64(e.Version))
	dst = append(dst, byte(e.AggKind))
	dst = appendBytes(dst, []byte(e.Node))
	dst = appendBytes(dst, []byte(e.AggID))
	dst = append(dst, e.OpID[:]...)
	dst = append(dst, e.Causation[:]...)
	dst = appendBytes(dst, e.Payload)
	binary.LittleEndian.PutUint32(dst[start:], crc32.Checksum(dst[start+4:], castagnoli))
	return dst
}

// Encode returns e's record encoding.
func Encode(e *Event) []byte { return AppendEncode(nil, e) }

func appendBytes(dst, b []byte) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(b)))
	return append(dst, b...)
}

// Decode parses one record. It verifies the checksum first; the returned
// event's Payload aliases rec.
func Decode(rec []byte) (Event, error) {
	var e Event
	if len(rec) < 5 {
		return e, ErrTruncated
	}
	if binary.LittleEndian.Uint32(rec) != crc32.Checksum(rec[4:], castagnoli) {
		return e, ErrChecksum
	}
	if f := rec[4]; f != FormatV1 {
		return e, fmt.Errorf("%w: record format %d, this build reads up to %d", ErrFormat, f, FormatCurrent)
	}
	d := decoder{b: rec[5:]}
	e.Seq = d.uvarint()
	e.Time = d.varint()
	e.Type = Type(d.uvarint())
	e.Version = uint16(d.uvarint())
	e.AggKind = AggKind(d.byte())
	e.Node = string(d.bytes())
	e.AggID = string(d.bytes())
	copy(e.OpID[:], d.fixed(16))
	copy(e.Causation[:], d.fixed(16))
	e.Payload = d.bytes()
	if d.err != nil {
		return Event{}, d.err
	}
	if len(d.b) != 0 {
		return Event{}, fmt.Errorf("%w: %d trailing bytes", ErrTruncated, len(d.b))
	}
	return e, nil
}

// PeekSeq returns a record's sequence without decoding or verifying the rest.
func PeekSeq(rec []byte) (uint64, error) {
	if len(rec) < 6 {
		return 0, ErrTruncated
	}
	s, n := binary.Uvarint(rec[5:])
	if n <= 0 {
		return 0, ErrTruncated
	}
	return s, nil
}

type decoder struct {
	b   []byte
	err error
}

func (d *decoder) fail() {
	if d.err == nil {
		d.err = ErrTruncated
	}
	d.b = nil
}

func (d *decoder) uvarint() uint64 {
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail()
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) varint() int64 {
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.fail()
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) byte() byte {
	if len(d.b) < 1 {
		d.fail()
		return 0
	}
	c := d.b[0]
	d.b = d.b[1:]
	return c
}

func (d *decoder) fixed(n int) []byte {
	if len(d.b) < n {
		d.fail()
		return make([]byte, n)
	}
	v := d.b[:n]
	d.b = d.b[n:]
	return v
}

func (d *decoder) bytes() []byte {
	n := d.uvarint()
	if d.err != nil || n > uint64(len(d.b)) {
		d.fail()
		return nil
	}
	v := d.b[:n:n]
	d.b = d.b[n:]
	return v
}
