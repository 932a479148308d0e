package silkd

import (
	"context"
	"io"
	"strings"
	"sync"
)

// The client's process table, session and terminal RPCs.

// Ps runs ps.
func (c *Conn) Ps(ctx context.Context) ([]Proc, error) {
	r, err := c.one(ctx, Ps{})
	if err != nil {
		return nil, err
	}
	if v, ok := r.(*Procs); ok {
		return v.Procs, nil
	}
	c.unusable.Store(true)
	return nil, unexpected(OpPs, r)
}

// ProcOutput is how a logs or attach ended: Exited with Code once the
// process has exited; not Exited for logs of a running process, or an
// attach the agent stopped (done).
type ProcOutput struct {
	Code   int32
	Exited bool
}

// Logs runs logs: pid's kept output to stdout and stderr (nil discards),
// then whether it has exited. Its answers are bounded by MaxStreamFrame.
func (c *Conn) Logs(ctx context.Context, pid uint32, stdout, stderr io.Writer) (ProcOutput, error) {
	return c.procOutput(ctx, Logs{Pid: pid}, stdout, stderr)
}

// Attach runs attach: pid's kept output, then its live output, to stdout
// and stderr (nil discards), until it exits.
func (c *Conn) Attach(ctx context.Context, pid uint32, stdout, stderr io.Writer) (ProcOutput, error) {
	return c.procOutput(ctx, Attach{Pid: pid}, stdout, stderr)
}

// procOutput reads output frames, then exit (for logs, followed by done)
// or done.
func (c *Conn) procOutput(ctx context.Context, req Request, stdout, stderr io.Writer) (ProcOutput, error) {
	defer c.boundFrames()()
	var res ProcOutput
	err := c.stream(ctx, req, func(r Response) error {
		switch v := r.(type) {
		case *Stdout:
			return write(stdout, v.Data)
		case *Stderr:
			return write(stderr, v.Data)
		case *Exit:
			res = ProcOutput{Code: v.Code, Exited: true}
			if req.Op() == OpAttach {
				return errStreamEnd
			}
			return nil
		}
		return unexpected(req.Op(), r)
	})
	return res, err
}

func write(w io.Writer, p []byte) error {
	if w == nil {
		return nil
	}
	_, err := w.Write(p)
	return err
}

// CreateSession runs session_create and returns the session's id.
func (c *Conn) CreateSession(ctx context.Context, req SessionCreate) (string, error) {
	r, err := c.one(ctx, req)
	if err != nil {
		return "", err
	}
	if v, ok := r.(*SessionCreated); ok {
		return v.ID, nil
	}
	c.unusable.Store(true)
	return "", unexpected(OpSessionCreate, r)
}

// Sessions runs session_list.
func (c *Conn) Sessions(ctx context.Context) ([]string, error) {
	r, err := c.one(ctx, SessionList{})
	if err != nil {
		return nil, err
	}
	if v, ok := r.(*Sessions); ok {
		return v.Sessions, nil
	}
	c.unusable.Store(true)
	return nil, unexpected(OpSessionList, r)
}

// RemoveSession runs session_rm.
func (c *Conn) RemoveSession(ctx context.Context, id string) error {
	return c.done(ctx, SessionRm{ID: id})
}

// ResizePty runs pty_resize. A terminal is resized over another
// connection than its own, which its pty_open holds.
func (c *Conn) ResizePty(ctx context.Context, pid uint32, cols, rows uint16) error {
	return c.done(ctx, PtyResize{Pid: pid, Cols: cols, Rows: rows})
}

// OpenPty runs pty_open and returns the terminal once its shell runs. The
// Pty owns the connection from then on. Its answers are bounded by
// MaxStreamFrame.
func (c *Conn) OpenPty(ctx context.Context, req PtyOpen) (*Pty, error) {
	restore := c.boundFrames()
	r, err := c.one(ctx, req)
	if err != nil {
		restore()
		return nil, err
	}
	v, ok := r.(*Started)
	if !ok {
		c.unusable.Store(true)
		return nil, unexpected(OpPtyOpen, r)
	}
	c.unusable.Store(true)
	return &Pty{Pid: v.Pid, c: c}, nil
}

// Pty is an open terminal: Read is its output (io.EOF once the shell has
// exited, then ExitCode holds its code), Write types into it, Close hangs
// up (the agent kills the shell).
type Pty struct {
	Pid  uint32
	c    *Conn
	in   frameReader
	code int32
	wmu  sync.Mutex
}

// Read implements io.Reader.
func (p *Pty) Read(b []byte) (int, error) {
	return p.in.read(b, p.c, func(r Response) ([]byte, error) {
		switch v := r.(type) {
		case *Stdout:
			return v.Data, nil
		case *Exit:
			p.code = v.Code
			return nil, io.EOF
		case *Error:
			return nil, v
		}
		return nil, unexpected(OpPtyOpen, r)
	})
}

// Write implements io.Writer.
func (p *Pty) Write(b []byte) (int, error) {
	p.wmu.Lock()
	defer p.wmu.Unlock()
	return BulkWriter{W: p.c.W, Kind: BulkStdin, Chunk: StdinChunk}.Write(b)
}

// ExitCode is the shell's exit code, once Read has returned io.EOF.
func (p *Pty) ExitCode() int32 { return p.code }

// Close closes the connection: the agent hangs up the terminal.
func (p *Pty) Close() error { return p.c.Close() }

// ShellLine is argv as one command line of a POSIX shell, each argument a
// word taken literally: what a session's shell runs for an exec's argv.
func ShellLine(argv []string) string {
	words := make([]string, len(argv))
	for i, a := range argv {
		words[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
	}
	return strings.Join(words, " ")
}
