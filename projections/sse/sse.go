// Package sse writes Server-Sent Events: framing (id, event, data lines),
// flushing after every event, and heartbeat comments so proxies and clients
// can tell an idle stream from a dead one.
package sse

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// ErrNoFlusher means the ResponseWriter cannot stream.
var ErrNoFlusher = errors.New("sse: response writer does not support flushing")

// Writer frames events onto one HTTP response.
type Writer struct {
	w   http.ResponseWriter
	rc  *http.ResponseController
	buf bytes.Buffer
}

// Start sends the SSE headers and returns a Writer. Call it once, before any
// event.
func Start(w http.ResponseWriter) (*Writer, error) {
	if _, ok := w.(http.Flusher); !ok {
		return nil, ErrNoFlusher
	}
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("Connection", "keep-alive")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	sw := &Writer{w: w, rc: http.NewResponseController(w)}
	return sw, sw.rc.Flush()
}

// Event writes one event. id may be empty (no id line); data is split on
// newlines into several data lines, as the format requires.
func (s *Writer) Event(id, event string, data []byte) error {
	s.buf.Reset()
	if id != "" {
		s.buf.WriteString("id: ")
		s.buf.WriteString(id)
		s.buf.WriteByte('\n')
	}
	if event != "" {
		s.buf.WriteString("event: ")
		s.buf.WriteString(event)
		s.buf.WriteByte('\n')
	}
	for _, line := range bytes.Split(data, []byte("\n")) {
		s.buf.WriteString("data: ")
		s.buf.Write(line)
		s.buf.WriteByte('\n')
	}
	s.buf.WriteByte('\n')
	if _, err := s.w.Write(s.buf.Bytes()); err != nil {
		return err
	}
	return s.rc.Flush()
}

// Comment writes a comment line (": text"), used as a heartbeat.
func (s *Writer) Comment(text string) error {
	if _, err := fmt.Fprintf(s.w, ": %s\n\n", strings.ReplaceAll(text, "\n", " ")); err != nil {
		return err
	}
	return s.rc.Flush()
}

// SetWriteDeadline bounds the next writes; a client that stops reading is then
// disconnected instead of holding a goroutine forever.
func (s *Writer) SetWriteDeadline(t time.Time) error { return s.rc.SetWriteDeadline(t) }

// DefaultHeartbeat is the interval between heartbeat comments.
const DefaultHeartbeat = 15 * time.Second

// Cursor returns the sequence a client asked to resume after: Last-Event-ID
// (the last id it saw, so the stream starts at id+1) or ?from=N (the first id
// it wants). It returns ok=false when neither is given, and an error for a
// malformed value.
func Cursor(r *http.Request) (from uint64, ok bool, err error) {
	if v := r.Header.Get("Last-Event-ID"); v != "" {
		n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
		if err != nil {
			return 0, false, fmt.Errorf("invalid Last-Event-ID %q", v)
		}
		// The largest id has no successor: saturate rather than wrap to 0,
		// which would read as the oldest cursor instead of one beyond the
		// head of any log.
		return n + min(1, math.MaxUint64-n), true, nil
	}
	if v := r.URL.Query().Get("from"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return 0, false, fmt.Errorf("invalid from %q", v)
		}
		return n, true, nil
	}
	return 0, false, nil
}
