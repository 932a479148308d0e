// Package qmp is a client for the QEMU Machine Protocol over a unix socket.
//
// Dial reads the greeting and negotiates capabilities (qmp_capabilities), after
// which the connection is in command mode. Execute sends a command tagged with a
// fresh id and waits for the response carrying that id, so responses and
// asynchronous events may interleave on the wire in any order; ExecuteFD also passes
// a file descriptor with the command (SCM_RIGHTS), as getfd and add-fd need.
// Events are delivered to every Subscription whose name matches, in arrival order;
// a subscription buffers without bound, so subscribe before the command that
// triggers the event and nothing is lost.
//
// A QEMU monitor socket accepts one client at a time: hold a Client only for the
// duration of an operation and Close it.
//
// Errors: a QMP error response is an *Error (class and description as QEMU sent
// them); a connection that ends while a command waits yields an error wrapping
// ErrClosed; a peer that does not greet like QMP yields ErrNotQMP. Context
// cancellation abandons the wait (the command may still run in QEMU) and returns
// the context's error.
package qmp

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// ErrClosed is wrapped by errors of commands and waits cut short because the
// connection ended (QEMU exited, or Close was called).
var ErrClosed = errors.New("qmp: connection closed")

// ErrNotQMP is returned by Dial when the peer's first message is not a QMP greeting.
var ErrNotQMP = errors.New("qmp: peer did not send a QMP greeting")

// Error is an error response to a command.
type Error struct {
	Command string
	Class   string // e.g. "GenericError", "CommandNotFound", "DeviceNotActive"
	Desc    string
}

func (e *Error) Error() string {
	return fmt.Sprintf("qmp: %s: %s: %s", e.Command, e.Class, e.Desc)
}

// Version is QEMU's version from the greeting.
type Version struct {
	Major, Minor, Micro int
	Package             string
}

func (v Version) String() string {
	return fmt.Sprintf("%d.%d.%d%s", v.Major, v.Minor, v.Micro, v.Package)
}

// Event is an asynchronous QMP event.
type Event struct {
	Name string
	Data json.RawMessage
	// Time is QEMU's timestamp of the event.
	Time time.Time
}

type response struct {
	ret json.RawMessage
	err *Error
}

// Client is one QMP connection. It is safe for concurrent use.
type Client struct {
	conn    *net.UnixConn
	version Version

	wmu sync.Mutex // serialises writes so messages never interleave

	mu      sync.Mutex
	nextID  uint64
	pending map[string]chan response
	subs    map[*Subscription]struct{}
	done    chan struct{}
	readErr error
}

// Dial connects to the QMP socket at path, reads the greeting and leaves
// negotiation mode. ctx bounds the whole handshake.
func Dial(ctx context.Context, path string) (*Client, error) {
	var d net.Dialer
	nc, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, fmt.Errorf("qmp: dial: %w", err)
	}
	conn := nc.(*net.UnixConn)
	stop := context.AfterFunc(ctx, func() { _ = conn.SetReadDeadline(time.Unix(1, 0)) })
	br := bufio.NewReader(conn)
	dec := json.NewDecoder(br)
	var greet struct {
		QMP *struct {
			Version struct {
				QEMU struct {
					Major int `json:"major"`
					Minor int `json:"minor"`
					Micro int `json:"micro"`
				} `json:"qemu"`
				Package string `json:"package"`
			} `json:"version"`
		} `json:"QMP"`
	}
	err = dec.Decode(&greet)
	if !stop() {
		err = errors.Join(ctx.Err(), err)
	}
	_ = conn.SetReadDeadline(time.Time{})
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("qmp: greeting: %w", err)
	}
	if greet.QMP == nil {
		conn.Close()
		return nil, ErrNotQMP
	}
	c := &Client{
		conn: conn,
		version: Version{
			Major: greet.QMP.Version.QEMU.Major, Minor: greet.QMP.Version.QEMU.Minor,
			Micro: greet.QMP.Version.QEMU.Micro, Package: greet.QMP.Version.Package,
		},
		pending: make(map[string]chan response),
		subs:    make(map[*Subscription]struct{}),
		done:    make(chan struct{}),
	}
	go c.read(dec)
	if err := c.Execute(ctx, "qmp_capabilities", nil, nil); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// Version returns QEMU's version as the greeting announced it.
func (c *Client) Version() Version { return c.version }

// Close ends the connection; waiting commands fail with ErrClosed.
func (c *Client) Close() error {
	err := c.conn.Close()
	<-c.done
	return err
}

// Done is closed when the connection has ended (for instance because QEMU exited).
func (c *Client) Done() <-chan struct{} { return c.done }

// wire is every message QEMU sends after the greeting.
type wire struct {
	ID     *json.RawMessage `json:"id"`
	Return json.RawMessage  `json:"return"`
	Error  *struct {
		Class string `json:"class"`
		Desc  string `json:"desc"`
	} `json:"error"`
	Event     string          `json:"event"`
	Data      json.RawMessage `json:"data"`
	Timestamp *struct {
		Seconds      int64 `json:"seconds"`
		Microseconds int64 `json:"microseconds"`
	} `json:"timestamp"`
}

func (c *Client) read(dec *json.Decoder) {
	var err error
	for {
		var m wire
		if err = dec.Decode(&m); err != nil {
			break
		}
		switch {
		case m.Event != "":
			ev := Event{Name: m.Event, Data: m.Data}
			if m.Timestamp != nil {
				ev.Time = time.Unix(m.Timestamp.Seconds, m.Timestamp.Microseconds*1000)
			}
			c.mu.Lock()
			for s := range c.subs {
				s.push(ev)
			}
			c.mu.Unlock()
		case m.ID != nil:
			var id string
			if json.Unmarshal(*m.ID, &id) != nil {
				continue // not one of ours: we only send string ids
			}
			c.mu.Lock()
			ch := c.pending[id]
			delete(c.pending, id)
			c.mu.Unlock()
			if ch == nil {
				continue // the caller gave up waiting
			}
			r := response{ret: m.Return}
			if m.Error != nil {
				r.err = &Error{Class: m.Error.Class, Desc: m.Error.Desc}
			}
			ch <- r
		}
	}
	c.mu.Lock()
	c.readErr = err
	c.pending = nil
	for s := range c.subs {
		s.end()
	}
	close(c.done)
	c.mu.Unlock()
	c.conn.Close()
}

func (c *Client) closedErr() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.readErr == nil {
		return ErrClosed
	}
	return fmt.Errorf("%w: %w", ErrClosed, c.readErr)
}

// Execute runs command with args (nil for none; otherwise anything encoding/json
// turns into an object) and decodes the "return" value into out unless out is nil.
func (c *Client) Execute(ctx context.Context, command string, args, out any) error {
	return c.execute(ctx, command, args, out, -1)
}

// ExecuteFD is Execute with fd passed alongside the command, as QEMU's getfd and
// add-fd expect. fd stays open in the caller, who may close it once ExecuteFD
// returns: QEMU holds its own copy.
func (c *Client) ExecuteFD(ctx context.Context, command string, args, out any, fd int) error {
	if fd < 0 {
		return fmt.Errorf("qmp: %s: invalid fd %d", command, fd)
	}
	return c.execute(ctx, command, args, out, fd)
}

func (c *Client) execute(ctx context.Context, command string, args, out any, fd int) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	ch := make(chan response, 1)
	c.mu.Lock()
	if c.pending == nil {
		c.mu.Unlock()
		return fmt.Errorf("qmp: %s: %w", command, c.closedErr())
	}
	c.nextID++
	id := strconv.FormatUint(c.nextID, 10)
	c.pending[id] = ch
	c.mu.Unlock()
	forget := func() {
		c.mu.Lock()
		if c.pending != nil {
			delete(c.pending, id)
		}
		c.mu.Unlock()
	}

	msg := struct {
		Execute   string `json:"execute"`
		Arguments any    `json:"arguments,omitempty"`
		ID        string `json:"id"`
	}{command, args, id}
	b, err := json.Marshal(msg)
	if err != nil {
		forget()
		return fmt.Errorf("qmp: %s: encode arguments: %w", command, err)
	}
	if err := c.write(ctx, b, fd); err != nil {
		forget()
		return fmt.Errorf("qmp: %s: send: %w", command, err)
	}

	select {
	case r := <-ch:
		if r.err != nil {
			r.err.Command = command
			return r.err
		}
		if out != nil {
			if err := json.Unmarshal(r.ret, out); err != nil {
				return fmt.Errorf("qmp: %s: decode return %s: %w", command, r.ret, err)
			}
		}
		return nil
	case <-c.done:
		// The reader may have delivered the response just before ending.
		select {
		case r := <-ch:
			if r.err != nil {
				r.err.Command = command
				return r.err
			}
			if out != nil {
				if err := json.Unmarshal(r.ret, out); err != nil {
					return fmt.Errorf("qmp: %s: decode return %s: %w", command, r.ret, err)
				}
			}
			return nil
		default:
		}
		return fmt.Errorf("qmp: %s: %w", command, c.closedErr())
	case <-ctx.Done():
		forget()
		return fmt.Errorf("qmp: %s: %w", command, ctx.Err())
	}
}

func (c *Client) write(ctx context.Context, b []byte, fd int) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.conn.SetWriteDeadline(dl)
		defer c.conn.SetWriteDeadline(time.Time{})
	}
	b = append(b, '\n')
	if fd >= 0 {
		// The descriptor must travel with the first bytes of the command: QEMU
		// attaches the fds it receives to the command it is reading.
		n, _, err := c.conn.WriteMsgUnix(b, unix.UnixRights(fd), nil)
		if err != nil {
			return err
		}
		b = b[n:]
	}
	for len(b) > 0 {
		n, err := c.conn.Write(b)
		if err != nil {
			return err
		}
		b = b[n:]
	}
	return nil
}

// Subscription receives the events of one name (or all events, for name "").
type Subscription struct {
	c    *Client
	name string

	mu     sync.Mutex
	queue  []Event
	ended  bool
	notify chan struct{}
}

// Subscribe starts collecting events named name ("" for every event) from now on.
// Close the subscription when done with it.
func (c *Client) Subscribe(name string) *Subscription {
	s := &Subscription{c: c, name: name, notify: make(chan struct{}, 1)}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.pending == nil {
		s.ended = true
	} else {
		c.subs[s] = struct{}{}
	}
	return s
}

// Close stops the subscription.
func (s *Subscription) Close() {
	s.c.mu.Lock()
	delete(s.c.subs, s)
	s.c.mu.Unlock()
}

func (s *Subscription) push(ev Event) {
	if s.name != "" && ev.Name != s.name {
		return
	}
	s.mu.Lock()
	s.queue = append(s.queue, ev)
	s.mu.Unlock()
	select {
	case s.notify <- struct{}{}:
	default:
	}
}

func (s *Subscription) end() {
	s.mu.Lock()
	s.ended = true
	s.mu.Unlock()
	select {
	case s.notify <- struct{}{}:
	default:
	}
}

// Next returns the next event, waiting for one until ctx ends or the connection
// closes (an error wrapping ErrClosed, after every queued event was returned).
func (s *Subscription) Next(ctx context.Context) (Event, error) {
	for {
		s.mu.Lock()
		if len(s.queue) > 0 {
			ev := s.queue[0]
			s.queue = s.queue[1:]
			s.mu.Unlock()
			return ev, nil
		}
		ended := s.ended
		s.mu.Unlock()
		if ended {
			return Event{}, s.c.closedErr()
		}
		select {
		case <-s.notify:
		case <-ctx.Done():
			return Event{}, ctx.Err()
		}
	}
}

// Wait returns the first event for which match returns true (any event when match
// is nil), discarding the others.
func (s *Subscription) Wait(ctx context.Context, match func(Event) bool) (Event, error) {
	for {
		ev, err := s.Next(ctx)
		if err != nil {
			return ev, err
		}
		if match == nil || match(ev) {
			return ev, nil
		}
	}
}
