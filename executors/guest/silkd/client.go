package silkd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Chunk sizes the client sends in.
const (
	// StdinChunk is the payload of one stdin frame.
	StdinChunk = 32 << 10
	// PortWriteChunk is the payload of one data frame a PortConn writes.
	// The old SDK sent 1 MiB; a receiver assembles each line in its own
	// buffer, so a smaller frame keeps hundreds of concurrent streams
	// affordable on the agent side at no cost in throughput.
	PortWriteChunk = BulkChunk
)

// ErrConnUnusable: an earlier RPC left the connection in a state where
// another RPC on it could be misread (a stdin pump still blocked in its
// reader, a stream abandoned halfway, a broken stream).
var ErrConnUnusable = errors.New("silkd: connection unusable for another RPC")

// Conn is the client end of one agent connection: a net.Conn that already
// speaks silkd frames (a relay after its 101, or what a driver's DialAgent
// returned). Its RPC methods run one RPC each and must not overlap. A
// context ending during an RPC closes the connection. Against a
// ProtoOneShot agent each RPC needs its own Conn; against ProtoKeepAlive
// they may follow one another on one Conn.
type Conn struct {
	nc       net.Conn
	R        *Reader
	W        *Writer
	unusable atomic.Bool
}

// NewConn wraps nc.
func NewConn(nc net.Conn) *Conn {
	return &Conn{nc: nc, R: NewReader(nc), W: NewWriter(nc)}
}

// NetConn returns the underlying connection.
func (c *Conn) NetConn() net.Conn { return c.nc }

// Close closes the connection.
func (c *Conn) Close() error { return c.nc.Close() }

// rpc runs f under ctx: the connection is closed if ctx ends first, and the
// context's error is reported rather than the I/O error it caused. Any
// failure other than an error frame makes the Conn unusable.
func (c *Conn) rpc(ctx context.Context, f func() error) error {
	if c.unusable.Load() {
		return ErrConnUnusable
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	stop := context.AfterFunc(ctx, func() { c.nc.Close() })
	err := f()
	if !stop() {
		// The context ended and closed the connection; an RPC that had
		// completed keeps its result.
		c.unusable.Store(true)
		if err != nil {
			return fmt.Errorf("%w (%w)", ctx.Err(), err)
		}
	}
	var fe *Error
	if err != nil && !errors.As(err, &fe) {
		c.unusable.Store(true)
	}
	return err
}

// next reads one response; the end of the stream is ErrTruncated.
func (c *Conn) next() (Response, error) {
	r, err := c.R.ReadResponse()
	if errors.Is(err, io.EOF) {
		return nil, ErrTruncated
	}
	return r, err
}

// one sends req and reads its single answer frame.
func (c *Conn) one(ctx context.Context, req Request) (Response, error) {
	var resp Response
	err := c.rpc(ctx, func() error {
		if err := c.W.WriteRequest(req); err != nil {
			return err
		}
		r, err := c.next()
		if err != nil {
			return err
		}
		if e, ok := r.(*Error); ok {
			return e
		}
		resp = r
		return nil
	})
	return resp, err
}

func unexpected(op string, r Response) error {
	return &UnexpectedFrameError{Op: op, Type: r.Type()}
}

// Info runs the info RPC (the readiness probe).
func (c *Conn) Info(ctx context.Context) (*InfoReply, error) {
	r, err := c.one(ctx, Info{})
	if err != nil {
		return nil, err
	}
	if v, ok := r.(*InfoReply); ok {
		return v, nil
	}
	c.unusable.Store(true)
	return nil, unexpected(OpInfo, r)
}

// done runs an RPC whose answer is done.
func (c *Conn) done(ctx context.Context, req Request) error {
	r, err := c.one(ctx, req)
	if err != nil {
		return err
	}
	if _, ok := r.(*Done); !ok {
		c.unusable.Store(true)
		return unexpected(req.Op(), r)
	}
	return nil
}

// Stat runs fs_stat.
func (c *Conn) Stat(ctx context.Context, path string) (StatInfo, error) {
	r, err := c.one(ctx, FsStat{Path: path})
	if err != nil {
		return StatInfo{}, err
	}
	if v, ok := r.(*Stat); ok {
		return v.Info, nil
	}
	c.unusable.Store(true)
	return StatInfo{}, unexpected(OpFsStat, r)
}

// Mkdir runs fs_mkdir.
func (c *Conn) Mkdir(ctx context.Context, path string, parents bool) error {
	return c.done(ctx, FsMkdir{Path: path, Parents: parents})
}

// Remove runs fs_rm.
func (c *Conn) Remove(ctx context.Context, path string, recursive bool) error {
	return c.done(ctx, FsRm{Path: path, Recursive: recursive})
}

// Rename runs fs_rename.
func (c *Conn) Rename(ctx context.Context, from, to string) error {
	return c.done(ctx, FsRename{From: from, To: to})
}

// Kill runs kill; a nil signal is SIGKILL. Its answer is bounded by
// MaxStreamFrame.
func (c *Conn) Kill(ctx context.Context, pid uint32, signal *int32) error {
	defer c.boundFrames()()
	return c.done(ctx, Kill{Pid: pid, Signal: signal})
}

// boundFrames bounds the frames read from now on at MaxStreamFrame (see
// there), and returns what puts the previous bound back.
func (c *Conn) boundFrames() (restore func()) {
	prev := c.R.max
	c.R.SetMaxFrame(MaxStreamFrame)
	return func() { c.R.max = prev }
}

// errStreamEnd, returned by a stream's each, ends the RPC successfully
// at a terminal frame other than done.
var errStreamEnd = errors.New("silkd: end of stream")

// stream sends req and hands each answer to each until done (nil) or an
// error frame (returned); each rejects the types it does not expect.
func (c *Conn) stream(ctx context.Context, req Request, each func(Response) error) error {
	return c.rpc(ctx, func() error {
		if err := c.W.WriteRequest(req); err != nil {
			return err
		}
		for {
			r, err := c.next()
			if err != nil {
				return err
			}
			switch v := r.(type) {
			case *Done:
				return nil
			case *Error:
				return v
			}
			if err := each(r); err != nil {
				if err == errStreamEnd {
					return nil
				}
				return err
			}
		}
	})
}

// List runs fs_list and concatenates its batches.
func (c *Conn) List(ctx context.Context, path string) ([]Entry, error) {
	var out []Entry
	err := c.stream(ctx, FsList{Path: path}, func(r Response) error {
		v, ok := r.(*Entries)
		if !ok {
			return unexpected(OpFsList, r)
		}
		out = append(out, v.Entries...)
		return nil
	})
	return out, err
}

// ReadFile runs fs_read, writing the file to w; it returns the bytes
// written.
func (c *Conn) ReadFile(ctx context.Context, path string, w io.Writer) (int64, error) {
	return c.download(ctx, FsRead{Path: path}, w)
}

// download runs req, a download op (fs_read, fs_pull), writing its data
// frames to w; it returns the bytes written.
func (c *Conn) download(ctx context.Context, req Request, w io.Writer) (int64, error) {
	var n int64
	err := c.stream(ctx, req, func(r Response) error {
		v, ok := r.(*DataReply)
		if !ok {
			return unexpected(req.Op(), r)
		}
		k, err := w.Write(v.Data)
		n += int64(k)
		return err
	})
	return n, err
}

// WriteFile runs fs_write with the contents of src, sent in BulkChunk
// frames. An answer that arrives before the upload is complete (the agent
// refused the path) stops the upload and is returned.
func (c *Conn) WriteFile(ctx context.Context, req FsWrite, src io.Reader) error {
	return c.upload(ctx, req, req.Path, src)
}

// upload runs req, an upload op (fs_write, fs_push), with the contents of
// src, as WriteFile describes; what names the upload in errors.
func (c *Conn) upload(ctx context.Context, req Request, what string, src io.Reader) error {
	return c.rpc(ctx, func() error {
		if err := c.W.WriteRequest(req); err != nil {
			return err
		}
		type answer struct {
			r   Response
			err error
		}
		ans := make(chan answer, 1)
		go func() {
			r, err := c.next()
			ans <- answer{r, err}
		}()
		early := func() (answer, bool) {
			select {
			case a := <-ans:
				return a, true
			default:
				return answer{}, false
			}
		}
		finish := func(a answer) error {
			if a.err != nil {
				return a.err
			}
			switch v := a.r.(type) {
			case *Done:
				return nil
			case *Error:
				return v
			}
			return unexpected(req.Op(), a.r)
		}
		buf := make([]byte, BulkChunk)
		for {
			if a, ok := early(); ok {
				if a.err == nil {
					if _, isDone := a.r.(*Done); isDone {
						return unexpected(req.Op(), a.r) // done before data_end
					}
				}
				return finish(a)
			}
			n, rerr := io.ReadFull(src, buf)
			if n > 0 {
				if err := c.W.WriteBulk(BulkData, buf[:n]); err != nil {
					return err
				}
			}
			if rerr == io.EOF || rerr == io.ErrUnexpectedEOF {
				break
			}
			if rerr != nil {
				return fmt.Errorf("silkd: %s %s: reading the source: %w", req.Op(), what, rerr)
			}
		}
		if err := c.W.WriteRequest(DataEnd{}); err != nil {
			return err
		}
		return finish(<-ans)
	})
}

// ExecIO is where an exec's streams go. A nil Stdin sends stdin_close at
// once (in the same write as the exec frame); nil Stdout or Stderr discard.
type ExecIO struct {
	Stdin          io.Reader
	Stdout, Stderr io.Writer
	// Started, if set, is called with the pid once the process runs.
	Started func(pid uint32)
}

// ExecResult is how an exec ended. A detached exec reports only its pid.
type ExecResult struct {
	Pid  uint32
	Code int32
}

// Exec runs exec. A foreground exec returns at its exit frame; done
// without exit is an *UnexpectedFrameError. A detached exec returns at
// started. If Stdin is still being read when the process exits, the Conn
// is unusable afterwards (stray stdin could reach a later RPC). Its
// answers are bounded by MaxStreamFrame.
func (c *Conn) Exec(ctx context.Context, req Exec, sio ExecIO) (ExecResult, error) {
	defer c.boundFrames()()
	var res ExecResult
	var pump chan struct{}
	err := c.rpc(ctx, func() error {
		var err error
		if sio.Stdin == nil {
			err = c.W.WriteRequests(req, StdinClose{})
		} else {
			err = c.W.WriteRequest(req)
			if err == nil && !req.Detach {
				pump = make(chan struct{})
				go func() {
					defer close(pump)
					_, _ = io.Copy(BulkWriter{W: c.W, Kind: BulkStdin, Chunk: StdinChunk}, sio.Stdin)
					_ = c.W.WriteRequest(StdinClose{})
				}()
			}
		}
		if err != nil {
			return err
		}
		for {
			r, err := c.next()
			if err != nil {
				return err
			}
			switch v := r.(type) {
			case *Started:
				res.Pid = v.Pid
				if sio.Started != nil {
					sio.Started(v.Pid)
				}
				if req.Detach {
					return nil
				}
			case *Stdout:
				if sio.Stdout != nil {
					if _, err := sio.Stdout.Write(v.Data); err != nil {
						return err
					}
				}
			case *Stderr:
				if sio.Stderr != nil {
					if _, err := sio.Stderr.Write(v.Data); err != nil {
						return err
					}
				}
			case *Exit:
				res.Code = v.Code
				return nil
			case *Error:
				return v
			default:
				return unexpected(OpExec, r)
			}
		}
	})
	if pump != nil {
		select {
		case <-pump:
		default:
			c.unusable.Store(true)
		}
	}
	return res, err
}

// PortForward runs port_forward and returns the stream once the agent is
// connected to the guest port (ready). An *Error of kind not_found means
// nothing listens there. Its answers, the stream's included, are bounded
// by MaxStreamFrame.
func (c *Conn) PortForward(ctx context.Context, port uint16) (*PortConn, error) {
	return c.openStream(ctx, PortForward{Port: port})
}

// openStream runs req, a byte-stream op (port_forward, lsp_request), and
// returns the stream once the agent answered ready.
func (c *Conn) openStream(ctx context.Context, req Request) (*PortConn, error) {
	restore := c.boundFrames()
	r, err := c.one(ctx, req)
	if err != nil {
		restore()
		return nil, err
	}
	if _, ok := r.(*Ready); !ok {
		c.unusable.Store(true)
		return nil, unexpected(req.Op(), r)
	}
	c.unusable.Store(true) // the stream owns the connection from now on
	return &PortConn{c: c, op: req.Op()}, nil
}

// PortConn is a forwarded guest port as a net.Conn: Write sends data
// frames, CloseWrite sends data_end (the guest socket's write half closes),
// Read returns the guest's bytes and io.EOF at its done. Deadlines and
// addresses are the underlying connection's.
type PortConn struct {
	c       *Conn
	op      string // the op that opened the stream, for errors
	in      frameReader
	wmu     sync.Mutex
	wclosed bool
}

var _ net.Conn = (*PortConn)(nil)

// Read implements io.Reader.
func (p *PortConn) Read(b []byte) (int, error) {
	return p.in.read(b, p.c, func(r Response) ([]byte, error) {
		switch v := r.(type) {
		case *DataReply:
			return v.Data, nil
		case *Done:
			return nil, io.EOF
		case *Error:
			return nil, v
		}
		return nil, unexpected(p.op, r)
	})
}

// frameReader reads a stream of frames as bytes: payload gives a frame's
// bytes, or the error that ends the stream (io.EOF at its clean end).
type frameReader struct {
	rest []byte // unread part of the last frame (the Reader's buffer)
	err  error
}

func (f *frameReader) read(b []byte, c *Conn, payload func(Response) ([]byte, error)) (int, error) {
	for len(f.rest) == 0 {
		if f.err != nil {
			return 0, f.err
		}
		r, err := c.next()
		if err == nil {
			f.rest, err = payload(r)
		}
		f.err = err
	}
	n := copy(b, f.rest)
	f.rest = f.rest[n:]
	return n, nil
}

// Write implements io.Writer.
func (p *PortConn) Write(b []byte) (int, error) {
	p.wmu.Lock()
	defer p.wmu.Unlock()
	if p.wclosed {
		return 0, net.ErrClosed
	}
	return BulkWriter{W: p.c.W, Kind: BulkData, Chunk: PortWriteChunk}.Write(b)
}

// CloseWrite sends data_end: the guest socket sees EOF, reads go on.
func (p *PortConn) CloseWrite() error {
	p.wmu.Lock()
	defer p.wmu.Unlock()
	if p.wclosed {
		return nil
	}
	p.wclosed = true
	return p.c.W.WriteRequest(DataEnd{})
}

// Close closes the connection.
func (p *PortConn) Close() error { return p.c.Close() }

// LocalAddr implements net.Conn.
func (p *PortConn) LocalAddr() net.Addr { return p.c.nc.LocalAddr() }

// RemoteAddr implements net.Conn.
func (p *PortConn) RemoteAddr() net.Addr { return p.c.nc.RemoteAddr() }

// SetDeadline implements net.Conn.
func (p *PortConn) SetDeadline(t time.Time) error { return p.c.nc.SetDeadline(t) }

// SetReadDeadline implements net.Conn.
func (p *PortConn) SetReadDeadline(t time.Time) error { return p.c.nc.SetReadDeadline(t) }

// SetWriteDeadline implements net.Conn.
func (p *PortConn) SetWriteDeadline(t time.Time) error { return p.c.nc.SetWriteDeadline(t) }
