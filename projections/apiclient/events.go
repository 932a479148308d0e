package apiclient

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sbxlog/sbxlog/projections/api"
)

// Event is one Server-Sent Event.
type Event struct {
	// ID is the event's id line: the op-log sequence in the log view, a
	// per-connection counter in the VM view, "" when the event has none.
	ID string
	// Event is the event type: an op-log type ("claim_created"), or "sync",
	// "change" in the VM view.
	Event string
	Data  []byte
}

// Seq returns the op-log sequence of a log-view event.
func (e Event) Seq() (uint64, bool) {
	n, err := strconv.ParseUint(e.ID, 10, 64)
	return n, err == nil
}

// LogEvent decodes a log-view event's data.
func (e Event) LogEvent() (api.EventJSON, error) {
	var out api.EventJSON
	err := json.Unmarshal(e.Data, &out)
	return out, err
}

// StreamError is the `event: error` that ends a stream: a cursor the node
// cannot serve, or a client that fell too far behind.
type StreamError struct {
	Message string `json:"error"`
	// Cursor is the sequence the server could not continue from.
	Cursor uint64 `json:"cursor"`
}

func (e *StreamError) Error() string {
	return fmt.Sprintf("event stream ended by the server at cursor %d: %s", e.Cursor, e.Message)
}

// EventsOptions select what /v1/events sends.
type EventsOptions struct {
	// From is the first sequence wanted (?from=N); 0 sends none.
	From uint64
	// LastEventID resumes after that sequence (the Last-Event-ID header);
	// it wins over From on the server.
	LastEventID string
	// View is "" (the op log) or "vms" (root only).
	View string
	// IdleTimeout ends a stream that has sent nothing, not even a heartbeat,
	// for this long (default 45 s: three missed 15 s heartbeats), so a
	// dead connection is noticed. Negative disables it.
	IdleTimeout time.Duration
}

// Stream is one open /v1/events connection. Next is not safe for concurrent
// use; Close may be called from any goroutine to end a blocked Next.
type Stream struct {
	body   io.ReadCloser
	br     *bufio.Reader
	lastID string
	idle   time.Duration
	timer  *time.Timer
	done   bool

	closeOnce sync.Once
	mu        sync.Mutex
	timedOut  bool
}

// ErrIdle is returned by Stream.Next when the server sent nothing for the
// stream's IdleTimeout.
var ErrIdle = errors.New("apiclient: event stream idle past its timeout (no heartbeat)")

// Events opens /v1/events. A non-200 answer (401, 403, 400) is an *Error.
func (c *Client) Events(ctx context.Context, o EventsOptions) (*Stream, error) {
	q := url.Values{}
	if o.From > 0 {
		q.Set("from", strconv.FormatUint(o.From, 10))
	}
	if o.View != "" {
		q.Set("view", o.View)
	}
	req, err := c.request(ctx, http.MethodGet, "/v1/events", q, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "text/event-stream")
	if o.LastEventID != "" {
		req.Header.Set("Last-Event-ID", o.LastEventID)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		return nil, errorOf(resp, http.MethodGet, "/v1/events")
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
		resp.Body.Close()
		return nil, fmt.Errorf("apiclient: GET /v1/events: content type %q, want text/event-stream", ct)
	}
	s := &Stream{body: resp.Body, br: bufio.NewReaderSize(resp.Body, 64<<10), lastID: o.LastEventID, idle: o.IdleTimeout}
	if s.idle == 0 {
		s.idle = 45 * time.Second
	}
	if s.idle > 0 {
		s.timer = time.AfterFunc(s.idle, func() {
			s.mu.Lock()
			s.timedOut = true
			s.mu.Unlock()
			s.closeBody()
		})
	}
	return s, nil
}

// LastEventID returns the id of the last event read (or the one the stream
// was opened with): the cursor to resume from.
func (s *Stream) LastEventID() string { return s.lastID }

// Close ends the stream.
func (s *Stream) Close() error {
	if s.timer != nil {
		s.timer.Stop()
	}
	return s.closeBody()
}

func (s *Stream) closeBody() error {
	var err error
	s.closeOnce.Do(func() { err = s.body.Close() })
	return err
}

// Next returns the next event. Comments (heartbeats) are skipped. The end of
// the stream is io.EOF; the server's `event: error` is a *StreamError (and
// the stream ends there).
func (s *Stream) Next() (Event, error) {
	if s.done {
		return Event{}, io.EOF
	}
	var ev Event
	var data []string
	hasData := false
	for {
		line, err := s.br.ReadString('\n')
		if err != nil {
			s.done = true
			s.mu.Lock()
			idle := s.timedOut
			s.mu.Unlock()
			switch {
			case idle:
				return Event{}, ErrIdle
			case errors.Is(err, io.EOF) && line == "":
				return Event{}, io.EOF
			case errors.Is(err, io.EOF):
				return Event{}, io.ErrUnexpectedEOF // cut mid-event
			}
			return Event{}, err
		}
		if s.timer != nil {
			s.timer.Reset(s.idle)
		}
		line = strings.TrimSuffix(strings.TrimSuffix(line, "\n"), "\r")
		if line == "" {
			// Dispatch. Per the SSE rules an event without data is dropped,
			// but its id still moves the cursor.
			if !hasData {
				if ev.ID != "" {
					s.lastID = ev.ID
				}
				ev = Event{}
				continue
			}
			ev.Data = []byte(strings.Join(data, "\n"))
			if ev.Event == "" {
				ev.Event = "message"
			}
			if ev.Event == "error" {
				s.done = true
				se := &StreamError{}
				if json.Unmarshal(ev.Data, se) != nil || se.Message == "" {
					se.Message = string(ev.Data)
				}
				return ev, se
			}
			if ev.ID != "" {
				s.lastID = ev.ID
			}
			return ev, nil
		}
		if line[0] == ':' {
			continue // comment: heartbeat
		}
		field, value, _ := strings.Cut(line, ":")
		value = strings.TrimPrefix(value, " ")
		switch field {
		case "id":
			ev.ID = value
		case "event":
			ev.Event = value
		case "data":
			data = append(data, value)
			hasData = true
		}
	}
}

// FollowOptions configure Follow.
type FollowOptions struct {
	EventsOptions
	// MinBackoff and MaxBackoff bound the wait between reconnects (default
	// 100 ms doubling up to 5 s; reset once a connection delivers events).
	MinBackoff, MaxBackoff time.Duration
	// OnReconnect, if set, is called before each reconnect with the error
	// that ended the previous connection and the cursor resumed from.
	OnReconnect func(err error, lastEventID string)
}

// Follow streams events to fn until ctx ends, fn returns an error, or the
// stream fails for good. After a disconnect it reconnects with Last-Event-ID
// set to the last id seen, so fn sees each op-log event once, in order, with
// no gap. With neither From nor LastEventID it starts after the node's
// current end (read from /v1/info). (The VM view is not resumable: a reconnect starts with a fresh
// sync.) It returns fn's error, ctx's error, a 4xx *Error (a token or
// request the server refuses), or a *StreamError the server sent before any
// event on that connection (a cursor it cannot serve).
func (c *Client) Follow(ctx context.Context, o FollowOptions, fn func(Event) error) error {
	minB, maxB := o.MinBackoff, o.MaxBackoff
	if minB <= 0 {
		minB = 100 * time.Millisecond
	}
	if maxB < minB {
		maxB = max(5*time.Second, minB)
	}
	backoff := minB
	opts := o.EventsOptions
	if opts.From == 0 && opts.LastEventID == "" && opts.View != "vms" {
		// Without a cursor the server starts at its current end, which
		// moves: pin it now so a reconnect before the first event cannot
		// skip what was appended in between.
		in, err := c.Info(ctx)
		if err != nil {
			return err
		}
		opts.From = in.LogSeq + 1
	}
	for {
		progress, err := c.followOnce(ctx, opts, fn, &opts)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		var fe *fnError
		if errors.As(err, &fe) {
			return fe.err
		}
		var se *StreamError
		if errors.As(err, &se) && !progress {
			return err
		}
		if st := StatusOf(err); st >= 400 && st < 500 {
			return err
		}
		if progress {
			backoff = minB
		}
		if o.OnReconnect != nil {
			o.OnReconnect(err, opts.LastEventID)
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		backoff = min(backoff*2, maxB)
	}
}

// fnError marks an error returned by Follow's callback.
type fnError struct{ err error }

func (e *fnError) Error() string { return e.err.Error() }

// followOnce runs one connection; next is updated with the cursor to resume
// from. progress reports whether any event arrived.
func (c *Client) followOnce(ctx context.Context, o EventsOptions, fn func(Event) error, next *EventsOptions) (progress bool, err error) {
	s, err := c.Events(ctx, o)
	if err != nil {
		return false, err
	}
	defer s.Close()
	stop := context.AfterFunc(ctx, func() { s.Close() })
	defer stop()
	for {
		ev, err := s.Next()
		if err != nil {
			return progress, err
		}
		progress = true
		if o.View != "vms" && ev.ID != "" {
			// Resume after this event; From is moot once a cursor exists.
			next.LastEventID, next.From = ev.ID, 0
		}
		if err := fn(ev); err != nil {
			return progress, &fnError{err}
		}
	}
}
