package qmp

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

const greeting = `{"QMP": {"version": {"qemu": {"micro": 22, "minor": 2, "major": 7}, "package": "Debian 1:7.2"}, "capabilities": ["oob"]}}`

// peer is the QEMU end of a test connection: it reads one command at a time and
// lets the test answer in any order.
type peer struct {
	t    *testing.T
	conn *net.UnixConn
	br   *bufio.Reader
}

type cmd struct {
	Execute   string          `json:"execute"`
	Arguments json.RawMessage `json:"arguments"`
	ID        string          `json:"id"`
	fds       []int
}

// serve starts a listener and returns the socket path and a channel that yields the
// peer once a client connected, greeted and negotiated.
func serve(t *testing.T, greet string) (string, <-chan *peer) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "qmp.sock")
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	ch := make(chan *peer, 1)
	go func() {
		c, err := l.AcceptUnix()
		if err != nil {
			return
		}
		t.Cleanup(func() { c.Close() })
		p := &peer{t: t, conn: c, br: bufio.NewReader(c)}
		if _, err := c.Write([]byte(greet + "\r\n")); err != nil {
			return
		}
		if !strings.Contains(greet, `"QMP"`) {
			ch <- p
			return
		}
		m, err := p.next()
		if err != nil || m.Execute != "qmp_capabilities" {
			t.Errorf("first command %+v, %v; want qmp_capabilities", m, err)
			return
		}
		p.send(`{"return": {}, "id": %q}`, m.ID)
		ch <- p
	}()
	return path, ch
}

// next reads one command line, collecting descriptors passed with it.
func (p *peer) next() (cmd, error) {
	var m cmd
	buf := make([]byte, 4096)
	oob := make([]byte, unix.CmsgSpace(4*4))
	var line []byte
	for !strings.Contains(string(line), "\n") {
		n, oobn, _, _, err := p.conn.ReadMsgUnix(buf, oob)
		if err != nil {
			return m, err
		}
		line = append(line, buf[:n]...)
		if oobn > 0 {
			msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
			if err != nil {
				return m, err
			}
			for _, cm := range msgs {
				fds, err := unix.ParseUnixRights(&cm)
				if err != nil {
					return m, err
				}
				m.fds = append(m.fds, fds...)
			}
		}
	}
	err := json.Unmarshal(line, &m)
	return m, err
}

func (p *peer) send(format string, args ...any) {
	p.t.Helper()
	msg := fmt.Sprintf(format, args...)
	if _, err := p.conn.Write([]byte(msg + "\r\n")); err != nil {
		p.t.Errorf("peer send: %v", err)
	}
}

func dialPeer(t *testing.T) (*Client, *peer) {
	t.Helper()
	path, ch := serve(t, greeting)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := Dial(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	select {
	case p := <-ch:
		return c, p
	case <-ctx.Done():
		t.Fatal("peer never negotiated")
	}
	return nil, nil
}

func TestDialReadsVersion(t *testing.T) {
	c, _ := dialPeer(t)
	if v := c.Version(); v.Major != 7 || v.Minor != 2 || v.Micro != 22 || v.String() != "7.2.22Debian 1:7.2" {
		t.Fatalf("version %+v (%s)", v, v)
	}
}

func TestDialRejectsNonQMP(t *testing.T) {
	path, _ := serve(t, `{"hello": 1}`)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := Dial(ctx, path); !errors.Is(err, ErrNotQMP) {
		t.Fatalf("Dial = %v, want ErrNotQMP", err)
	}
}

func TestDialHonoursContext(t *testing.T) {
	// A listener that accepts but never greets.
	path := filepath.Join(t.TempDir(), "mute.sock")
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := Dial(ctx, path); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Dial = %v, want deadline exceeded", err)
	}
}

func TestResponsesMatchedByID(t *testing.T) {
	c, p := dialPeer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()

	type res struct {
		st  Status
		err error
	}
	first, second := make(chan res, 1), make(chan res, 1)
	go func() { st, err := c.QueryStatus(ctx); first <- res{st, err} }()
	m1, err := p.next()
	if err != nil {
		t.Fatal(err)
	}
	go func() { st, err := c.QueryStatus(ctx); second <- res{st, err} }()
	m2, err := p.next()
	if err != nil {
		t.Fatal(err)
	}
	if m1.ID == m2.ID {
		t.Fatalf("two commands share id %q", m1.ID)
	}
	// Answer out of order with an event in between.
	p.send(`{"return": {"running": false, "status": "paused"}, "id": %q}`, m2.ID)
	p.send(`{"event": "STOP", "timestamp": {"seconds": 1, "microseconds": 2}}`)
	p.send(`{"return": {"running": true, "status": "running"}, "id": %q}`, m1.ID)
	r1, r2 := <-first, <-second
	if r1.err != nil || r2.err != nil {
		t.Fatal(r1.err, r2.err)
	}
	if !r1.st.Running || r1.st.Status != "running" || r2.st.Running || r2.st.Status != "paused" {
		t.Fatalf("first %+v second %+v", r1.st, r2.st)
	}
}

func TestErrorResponseIsTyped(t *testing.T) {
	c, p := dialPeer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- c.Execute(ctx, "cont", nil, nil) }()
	m, err := p.next()
	if err != nil {
		t.Fatal(err)
	}
	p.send(`{"error": {"class": "GenericError", "desc": "Migration is not finalized yet"}, "id": %q}`, m.ID)
	var qe *Error
	if err := <-errc; !errors.As(err, &qe) || qe.Class != "GenericError" || qe.Command != "cont" ||
		qe.Desc != "Migration is not finalized yet" {
		t.Fatalf("err = %v (%#v)", err, qe)
	}
}

func TestArgumentsAreSent(t *testing.T) {
	c, p := dialPeer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- c.SetMigrationCapabilities(ctx, "x-ignore-shared", "events") }()
	m, err := p.next()
	if err != nil {
		t.Fatal(err)
	}
	var args struct {
		Capabilities []Capability `json:"capabilities"`
	}
	if err := json.Unmarshal(m.Arguments, &args); err != nil {
		t.Fatal(err)
	}
	want := []Capability{{"x-ignore-shared", true}, {"events", true}}
	if m.Execute != "migrate-set-capabilities" || len(args.Capabilities) != 2 ||
		args.Capabilities[0] != want[0] || args.Capabilities[1] != want[1] {
		t.Fatalf("got %s %s", m.Execute, m.Arguments)
	}
	p.send(`{"return": {}, "id": %q}`, m.ID)
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}

func TestExecuteFDPassesDescriptor(t *testing.T) {
	c, p := dialPeer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	f, err := os.CreateTemp(t.TempDir(), "fd")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString("migration stream"); err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- c.GetFD(ctx, "state", int(f.Fd())) }()
	m, err := p.next()
	if err != nil {
		t.Fatal(err)
	}
	if m.Execute != "getfd" || len(m.fds) != 1 || !strings.Contains(string(m.Arguments), `"fdname":"state"`) {
		t.Fatalf("got %+v", m)
	}
	got := os.NewFile(uintptr(m.fds[0]), "passed")
	defer got.Close()
	buf := make([]byte, 64)
	n, err := got.ReadAt(buf, 0)
	if string(buf[:n]) != "migration stream" {
		t.Fatalf("passed fd reads %q (%v)", buf[:n], err)
	}
	p.send(`{"return": {}, "id": %q}`, m.ID)
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if err := c.ExecuteFD(ctx, "getfd", nil, nil, -1); err == nil {
		t.Fatal("ExecuteFD accepted fd -1")
	}
}

func TestSubscriptionsFilterAndQueue(t *testing.T) {
	c, p := dialPeer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	mig := c.Subscribe("MIGRATION")
	defer mig.Close()
	all := c.Subscribe("")
	defer all.Close()
	p.send(`{"event": "MIGRATION", "data": {"status": "setup"}, "timestamp": {"seconds": 5, "microseconds": 0}}`)
	p.send(`{"event": "STOP", "timestamp": {"seconds": 6, "microseconds": 0}}`)
	p.send(`{"event": "MIGRATION", "data": {"status": "completed"}, "timestamp": {"seconds": 7, "microseconds": 0}}`)

	ev, err := mig.Wait(ctx, func(ev Event) bool { return strings.Contains(string(ev.Data), "completed") })
	if err != nil || ev.Name != "MIGRATION" || ev.Time.Unix() != 7 {
		t.Fatalf("Wait = %+v, %v", ev, err)
	}
	var names []string
	for range 3 {
		ev, err := all.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, ev.Name)
	}
	if strings.Join(names, ",") != "MIGRATION,STOP,MIGRATION" {
		t.Fatalf("all events: %v", names)
	}
}

func TestCloseFailsWaiters(t *testing.T) {
	c, p := dialPeer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	sub := c.Subscribe("SHUTDOWN")
	defer sub.Close()
	errc := make(chan error, 1)
	go func() { errc <- c.Execute(ctx, "quit", nil, nil) }()
	if _, err := p.next(); err != nil {
		t.Fatal(err)
	}
	p.conn.Close() // QEMU exits without answering
	if err := <-errc; !errors.Is(err, ErrClosed) {
		t.Fatalf("Execute after peer close = %v, want ErrClosed", err)
	}
	if _, err := sub.Next(ctx); !errors.Is(err, ErrClosed) {
		t.Fatalf("Next after peer close = %v, want ErrClosed", err)
	}
	select {
	case <-c.Done():
	case <-ctx.Done():
		t.Fatal("Done not closed")
	}
	if err := c.Execute(ctx, "query-status", nil, nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("Execute on closed client = %v", err)
	}
	if s := c.Subscribe("X"); s != nil {
		if _, err := s.Next(ctx); !errors.Is(err, ErrClosed) {
			t.Fatalf("Next on subscription of closed client = %v", err)
		}
	}
}

func TestContextAbandonsWait(t *testing.T) {
	c, p := dialPeer(t)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- c.Execute(ctx, "migrate", nil, nil) }()
	m, err := p.next()
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want canceled", err)
	}
	// The late answer is dropped and the connection keeps working.
	p.send(`{"return": {}, "id": %q}`, m.ID)
	ctx2, cancel2 := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel2()
	go func() {
		m, err := p.next()
		if err == nil {
			p.send(`{"return": {"running": true, "status": "running"}, "id": %q}`, m.ID)
		}
	}()
	if st, err := c.QueryStatus(ctx2); err != nil || st.Status != "running" {
		t.Fatalf("QueryStatus after abandoned command = %+v, %v", st, err)
	}
}
