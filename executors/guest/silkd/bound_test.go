package silkd

import (
	"bytes"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
)

// SetMaxFrame lowers the frame bound: a line up to it is read, one past it
// is ErrFrameTooLarge, and the line buffer never grows past the bound.
func TestReaderSetMaxFrame(t *testing.T) {
	const limit = 100 << 10
	for _, tc := range []struct {
		name string
		line int
		err  error
	}{
		{"at the bound", limit, nil},
		{"past the bound", limit + 1, ErrFrameTooLarge},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := NewReader(strings.NewReader(strings.Repeat("x", tc.line) + "\n"))
			r.SetMaxFrame(limit)
			line, err := r.ReadLine()
			if !errors.Is(err, tc.err) || (err == nil && len(line) != tc.line) {
				t.Fatalf("a %d-byte line = %d bytes, %v; want %v", tc.line, len(line), err, tc.err)
			}
		})
	}
	r := NewReader(infinite('A'))
	r.SetMaxFrame(limit)
	if _, err := r.ReadLine(); !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("an endless line = %v", err)
	}
	if len(r.buf) > limit+2 {
		t.Fatalf("the buffer grew to %d bytes with a %d-byte bound", len(r.buf), limit)
	}
	// Out of range is MaxFrame.
	for _, n := range []int{0, -1, MaxFrame + 1} {
		r.SetMaxFrame(n)
		if r.maxFrame() != MaxFrame {
			t.Fatalf("SetMaxFrame(%d) bound %d", n, r.maxFrame())
		}
	}
}

// A large frame's line and payload buffers are dropped at the next read,
// which still sees what was buffered after the frame.
func TestReaderReleasesGrownBuffers(t *testing.T) {
	payload := bytes.Repeat([]byte{7}, 3<<20)
	var in bytes.Buffer
	w := NewWriter(&in)
	if err := w.WriteBulk(BulkDataReply, payload); err != nil {
		t.Fatal(err)
	}
	if err := w.WriteResponse(Done{}); err != nil {
		t.Fatal(err)
	}
	r := NewReader(&in)
	f, err := r.ReadResponse()
	if err != nil || !bytes.Equal(f.(*DataReply).Data, payload) {
		t.Fatalf("the large frame: %v", err)
	}
	if len(r.buf) <= readerKeep || cap(r.payload) <= readerKeep {
		t.Fatalf("test frame too small: buffers %d and %d", len(r.buf), cap(r.payload))
	}
	if f, err := r.ReadResponse(); err != nil || f.Type() != TypeDone {
		t.Fatalf("after it: %v, %v", f, err)
	}
	if len(r.buf) > readerKeep || cap(r.payload) > readerKeep {
		t.Fatalf("kept buffers of %d and %d bytes", len(r.buf), cap(r.payload))
	}
	if _, err := r.ReadResponse(); !errors.Is(err, io.EOF) {
		t.Fatalf("end = %v", err)
	}
}

// The RPCs the host's relays parse (exec, kill, port_forward) read frames
// of at most MaxStreamFrame: a bulk frame of BulkChunk passes, a guest's
// larger frame ends the RPC with ErrFrameTooLarge. Other RPCs keep
// MaxFrame.
func TestClientStreamFrameBound(t *testing.T) {
	big := make([]byte, MaxStreamFrame) // its base64 is well past the bound
	for _, tc := range []struct {
		name    string
		payload []byte
		err     error
	}{
		{"bulk chunk", make([]byte, BulkChunk), nil},
		{"oversized", big, ErrFrameTooLarge},
	} {
		t.Run(tc.name, func(t *testing.T) {
			answer := func(t *testing.T, req Request, r *Reader, w *Writer) bool {
				switch req.(type) {
				case *Exec:
					_ = w.WriteResponse(Started{Pid: 9})
					_ = w.WriteBulk(BulkStdout, tc.payload)
					_ = w.WriteResponse(Exit{Code: 0})
				case *Kill:
					_ = w.WriteResponse(&Error{Kind: KindNotFound, Message: string(bytes.Repeat([]byte("e"), len(tc.payload)))})
				case *PortForward:
					_ = w.WriteResponse(Ready{})
					_ = w.WriteBulk(BulkDataReply, tc.payload)
					_ = w.WriteResponse(Done{})
				case *FsStat:
					_ = w.WriteResponse(&Error{Kind: KindNotFound, Message: string(big)})
				}
				return true
			}
			c, _ := fakeAgent(t, answer)
			var out bytes.Buffer
			_, err := c.Exec(ctx(t), Exec{Argv: []string{"x"}}, ExecIO{Stdout: &out})
			if !errors.Is(err, tc.err) || (err == nil && out.Len() != len(tc.payload)) {
				t.Fatalf("exec: %d bytes, %v; want %v", out.Len(), err, tc.err)
			}

			c, _ = fakeAgent(t, answer)
			err = c.Kill(ctx(t), 9, nil)
			if tc.err == nil && !errors.Is(err, ErrNotFound) || tc.err != nil && !errors.Is(err, tc.err) {
				t.Fatalf("kill: %v", err)
			}
			if tc.err == nil {
				// The bound ends with the RPC: fs_stat may answer up to MaxFrame.
				if _, err := c.Stat(ctx(t), "/"); !errors.Is(err, ErrNotFound) {
					t.Fatalf("stat after kill: %v", err)
				}
			}

			c, _ = fakeAgent(t, answer)
			p, err := c.PortForward(ctx(t), 7)
			if err != nil {
				t.Fatal(err)
			}
			got, err := io.ReadAll(p)
			if !errors.Is(err, tc.err) || (err == nil && len(got) != len(tc.payload)) {
				t.Fatalf("port_forward: %d bytes, %v; want %v", len(got), err, tc.err)
			}
		})
	}
}

// StreamConnMemory bounds what a Conn's frame buffers hold with frames
// bounded at MaxStreamFrame: the largest data frame a guest may send
// within the bound (read and decoded) and a PortWriteChunk written, the
// line, payload and write buffers stay within it.
func TestStreamConnMemoryBound(t *testing.T) {
	// The largest payload whose frame fits MaxStreamFrame.
	p := (MaxStreamFrame - 64) / 4 * 3
	for len(AppendBulk(nil, BulkDataReply, make([]byte, p)))-1 > MaxStreamFrame {
		p -= 3
	}
	var in bytes.Buffer
	in.Write(AppendBulk(nil, BulkDataReply, bytes.Repeat([]byte{9}, p)))
	if err := NewWriter(&in).WriteResponse(Done{}); err != nil {
		t.Fatal(err)
	}
	c := NewConn(nopConn{Reader: &in})
	c.R.SetMaxFrame(MaxStreamFrame)
	r, err := c.R.ReadResponse()
	if d, ok := r.(*DataReply); err != nil || !ok || len(d.Data) != p {
		t.Fatalf("the largest bounded data frame: %T %v", r, err)
	}
	if _, err := (BulkWriter{W: c.W, Kind: BulkData, Chunk: PortWriteChunk}).Write(make([]byte, PortWriteChunk)); err != nil {
		t.Fatal(err)
	}
	held := cap(c.R.buf) + cap(c.R.payload) + cap(c.W.buf)
	if held > StreamConnMemory {
		t.Fatalf("frame buffers hold %d bytes (line %d, payload %d, writer %d), StreamConnMemory is %d",
			held, cap(c.R.buf), cap(c.R.payload), cap(c.W.buf), StreamConnMemory)
	}
	t.Logf("held %d of StreamConnMemory %d", held, StreamConnMemory)
}

// nopConn is a net.Conn that reads from Reader and discards what is
// written; nothing else is called.
type nopConn struct {
	net.Conn
	Reader io.Reader
}

func (c nopConn) Read(p []byte) (int, error) { return c.Reader.Read(p) }
func (nopConn) Write(p []byte) (int, error)  { return len(p), nil }
