package stream

// The stream's message format. A message carries one event: its payload is
// the event's checksummed record (event.Encode, the bytes the node's log
// holds), and its headers say what the event is, so the standard NATS
// tools (nats stream view, nats stream get) show each event's type and ids
// without decoding the record.
//
// Formats only ratchet up: a build writes the newest it knows and reads
// every older one.
//   - 1 (up to issue 15): the record, and Nats-Msg-Id only.
//   - 2: the record, Nats-Msg-Id and the Sbx-* headers below, starting
//     with Sbx-Format: 2. Every header must agree with the record.

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sbxlog/sbxlog/eventlog/event"
)

// Message formats.
const (
	// FormatRecord is the record with Nats-Msg-Id only: a message without
	// an Sbx-Format header.
	FormatRecord = 1
	// FormatHeaders adds the Sbx-* headers.
	FormatHeaders = 2
	// FormatCurrent is what this build writes; it reads every format up to
	// it.
	FormatCurrent = FormatHeaders
)

// Headers of format 2. Values are the event's fields as text; a value that
// would not survive a header line as it is (control characters, leading or
// trailing spaces, invalid UTF-8) is written Go-quoted ("...").
const (
	HdrFormat  = "Sbx-Format"   // message format, "2"
	HdrNode    = "Sbx-Node"     // node id, as configured (the subject has its token)
	HdrSeq     = "Sbx-Seq"      // the event's sequence in the node's log
	HdrType    = "Sbx-Type"     // event type name (claim_created, ...)
	HdrVersion = "Sbx-Version"  // the payload's schema version
	HdrAggKind = "Sbx-Agg-Kind" // aggregate kind (claim, vm, pool, golden, node)
	HdrAggID   = "Sbx-Agg-Id"   // aggregate id (a claim id, a VM id, a pool key)
	HdrOp      = "Sbx-Op"       // op id (ULID)
	HdrCause   = "Sbx-Cause"    // causing op id (ULID); absent for an external command
	HdrTime    = "Sbx-Time"     // event time, RFC 3339 with nanoseconds, UTC
)

// ErrFormat means a message's format is newer than this build reads.
var ErrFormat = errors.New("stream: message format not supported")

// Message is the stream message of node's event ev, in the current format.
func (c Config) Message(ev *event.Event) *nats.Msg {
	m := nats.NewMsg(c.Subject(ev.Node))
	m.Header.Set(jetstream.MsgIDHeader, MsgID(ev.Node, ev.Seq))
	for _, kv := range headers(ev) {
		m.Header.Set(kv[0], kv[1])
	}
	m.Data = event.Encode(ev)
	return m
}

func headers(ev *event.Event) [][2]string {
	h := [][2]string{
		{HdrFormat, strconv.Itoa(FormatCurrent)},
		{HdrNode, headerValue(ev.Node)},
		{HdrSeq, strconv.FormatUint(ev.Seq, 10)},
		{HdrType, ev.Type.String()},
		{HdrVersion, strconv.FormatUint(uint64(ev.Version), 10)},
		{HdrAggKind, ev.AggKind.String()},
		{HdrAggID, headerValue(ev.AggID)},
		{HdrOp, ev.OpID.String()},
	}
	if ev.Causation != event.ZeroOpID {
		h = append(h, [2]string{HdrCause, ev.Causation.String()})
	}
	return append(h, [2]string{HdrTime, time.Unix(0, ev.Time).UTC().Format(time.RFC3339Nano)})
}

// HeaderBytes is how many bytes the headers of ev's message take on the
// wire (they count against the server's max_payload with the record).
func HeaderBytes(ev *event.Event) int {
	n := len("NATS/1.0\r\n\r\n") + len(jetstream.MsgIDHeader) + 4 + len(MsgID(ev.Node, ev.Seq))
	for _, kv := range headers(ev) {
		n += len(kv[0]) + len(kv[1]) + 4
	}
	return n
}

func headerValue(s string) string {
	if s == "" || !utf8.ValidString(s) || strings.TrimSpace(s) != s || strings.HasPrefix(s, `"`) {
		return strconv.Quote(s)
	}
	for _, r := range s {
		if !unicode.IsPrint(r) {
			return strconv.Quote(s)
		}
	}
	return s
}

// MessageFormat is the format of a message with headers h.
func MessageFormat(h nats.Header) (int, error) {
	v := h.Get(HdrFormat)
	if v == "" {
		return FormatRecord, nil
	}
	f, err := strconv.Atoi(v)
	switch {
	case err != nil || f < FormatHeaders:
		return 0, fmt.Errorf("%w: %s %q", ErrFormat, HdrFormat, v)
	case f > FormatCurrent:
		return 0, fmt.Errorf("%w: format %d, this build reads up to %d (upgrade the consumer)", ErrFormat, f, FormatCurrent)
	}
	return f, nil
}

// CheckMessage verifies a message's headers against the event its record
// decoded to: its message id, and in format 2 every Sbx-* header. It
// returns the message's format.
func CheckMessage(h nats.Header, ev *event.Event) (int, error) {
	if id := h.Get(jetstream.MsgIDHeader); id != MsgID(ev.Node, ev.Seq) {
		return 0, fmt.Errorf("seq %d under message id %q", ev.Seq, id)
	}
	f, err := MessageFormat(h)
	if err != nil || f == FormatRecord {
		return f, err
	}
	want := headers(ev)
	for _, kv := range want {
		if got := h.Get(kv[0]); got != kv[1] {
			return 0, fmt.Errorf("header %s is %q, the record says %q", kv[0], got, kv[1])
		}
	}
	if ev.Causation == event.ZeroOpID && h.Get(HdrCause) != "" {
		return 0, fmt.Errorf("header %s is %q, the record has no cause", HdrCause, h.Get(HdrCause))
	}
	return f, nil
}
