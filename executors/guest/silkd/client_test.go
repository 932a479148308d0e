package silkd

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"reflect"
	"strings"
	"testing"
	"time"
)

// script is a fake agent: for every request it reads it calls answer,
// which may read input frames and writes responses.
type script func(t *testing.T, req Request, r *Reader, w *Writer) bool

func fakeAgent(t *testing.T, answer script) (*Conn, chan []byte) {
	t.Helper()
	host, guest := net.Pipe()
	t.Cleanup(func() { host.Close(); guest.Close() })
	firstRead := make(chan []byte, 1)
	go func() {
		// The first Read shows what the client put in its first Write.
		buf := make([]byte, 64<<10)
		n, err := guest.Read(buf)
		if err != nil {
			return
		}
		firstRead <- append([]byte(nil), buf[:n]...)
		r := NewReader(io.MultiReader(bytes.NewReader(buf[:n]), guest))
		w := NewWriter(guest)
		for {
			req, err := r.ReadRequest()
			if err != nil {
				return
			}
			if !answer(t, req, r, w) {
				guest.Close()
				return
			}
		}
	}()
	return NewConn(host), firstRead
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return c
}

func TestClientInfoAndErrors(t *testing.T) {
	c, _ := fakeAgent(t, func(t *testing.T, req Request, r *Reader, w *Writer) bool {
		switch v := req.(type) {
		case *Info:
			_ = w.WriteResponse(InfoReply{Version: "v", Proto: 2})
		case *FsStat:
			if v.Path == "/missing" {
				_ = w.WriteResponse(Errorf(KindNotFound, "fs_stat: no such file"))
			} else {
				_ = w.WriteResponse(Stat{Info: StatInfo{Kind: FileDir, Mode: 0o755}})
			}
		case *FsList:
			_ = w.WriteResponse(Entries{Entries: []Entry{{Name: "a"}}})
			_ = w.WriteResponse(Entries{Entries: []Entry{{Name: "b"}}})
			_ = w.WriteResponse(Done{})
		case *FsMkdir, *FsRm, *FsRename, *Kill:
			_ = w.WriteResponse(Done{})
		default:
			_ = w.WriteResponse(Errorf(KindUnimplemented, "%s", req.Op()))
		}
		return true
	})
	info, err := c.Info(ctx(t))
	if err != nil || info.Proto != 2 || info.Version != "v" {
		t.Fatalf("Info = %+v, %v", info, err)
	}
	if _, err := c.Stat(ctx(t), "/missing"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Stat missing = %v", err)
	}
	// An error frame ends its RPC cleanly: the connection carries on.
	if st, err := c.Stat(ctx(t), "/"); err != nil || st.Kind != FileDir {
		t.Fatalf("Stat = %+v, %v", st, err)
	}
	if es, err := c.List(ctx(t), "/"); err != nil || len(es) != 2 || es[1].Name != "b" {
		t.Fatalf("List = %+v, %v", es, err)
	}
	for _, err := range []error{c.Mkdir(ctx(t), "/d", true), c.Remove(ctx(t), "/d", true), c.Rename(ctx(t), "/a", "/b"), c.Kill(ctx(t), 1, nil)} {
		if err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.PortForward(ctx(t), 1); !errors.Is(err, ErrUnimplemented) {
		t.Fatalf("PortForward = %v", err)
	}
}

func TestClientExec(t *testing.T) {
	got := make(chan Request, 4)
	c, first := fakeAgent(t, func(t *testing.T, req Request, r *Reader, w *Writer) bool {
		got <- req
		if _, ok := req.(*Exec); !ok {
			return true
		}
		_ = w.WriteResponse(Started{Pid: 7})
		_ = w.WriteResponse(Stdout{Data: B64("42\n")})
		_ = w.WriteResponse(Stderr{Data: B64("err\n")})
		_ = w.WriteResponse(Exit{Code: 3})
		return true
	})
	var out, errb bytes.Buffer
	var pid uint32
	res, err := c.Exec(ctx(t), Exec{Argv: []string{"sh"}}, ExecIO{Stdout: &out, Stderr: &errb, Started: func(p uint32) { pid = p }})
	if err != nil || res != (ExecResult{Pid: 7, Code: 3}) || out.String() != "42\n" || errb.String() != "err\n" || pid != 7 {
		t.Fatalf("Exec = %+v, %v, %q, %q", res, err, out.String(), errb.String())
	}
	// Without stdin, exec and stdin_close travel in one write.
	want := `{"v":1,"op":"exec","argv":["sh"],"detach":false}` + "\n" + `{"v":1,"op":"stdin_close"}` + "\n"
	if b := <-first; string(b) != want {
		t.Fatalf("first write %q, want %q", b, want)
	}
	if seen := []Request{<-got, <-got}; !reflect.DeepEqual(seen, []Request{&Exec{Argv: []string{"sh"}}, &StdinClose{}}) {
		t.Fatalf("agent saw %#v", seen)
	}
}

func TestClientExecStdin(t *testing.T) {
	c, _ := fakeAgent(t, func(t *testing.T, req Request, r *Reader, w *Writer) bool {
		if _, ok := req.(*Exec); !ok {
			return true
		}
		_ = w.WriteResponse(Started{Pid: 1})
		for { // cat
			in, err := r.ReadRequest()
			if err != nil {
				return false
			}
			if s, ok := in.(*Stdin); ok {
				_ = w.WriteBulk(BulkStdout, s.Data)
				continue
			}
			if _, ok := in.(*StdinClose); ok {
				break
			}
		}
		_ = w.WriteResponse(Exit{Code: 0})
		return true
	})
	in := strings.Repeat("0123456789", 10000) // several stdin chunks
	var out bytes.Buffer
	res, err := c.Exec(ctx(t), Exec{Argv: []string{"cat"}}, ExecIO{Stdin: strings.NewReader(in), Stdout: &out})
	if err != nil || res.Code != 0 || out.String() != in {
		t.Fatalf("Exec cat = %+v, %v, %d bytes", res, err, out.Len())
	}
}

func TestClientExecEnds(t *testing.T) {
	tests := []struct {
		name   string
		answer func(w *Writer)
		check  func(error) bool
	}{
		{"done without exit", func(w *Writer) { _ = w.WriteResponse(Done{}) },
			func(err error) bool { var u *UnexpectedFrameError; return errors.As(err, &u) && u.Type == TypeDone }},
		{"error frame", func(w *Writer) { _ = w.WriteResponse(Errorf(KindBadRequest, "exec: no such file")) },
			func(err error) bool { return errors.Is(err, ErrBadRequest) }},
		{"connection dropped", func(w *Writer) { _ = w.WriteResponse(Started{Pid: 1}) },
			func(err error) bool { return errors.Is(err, ErrTruncated) }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, _ := fakeAgent(t, func(t *testing.T, req Request, r *Reader, w *Writer) bool {
				if _, ok := req.(*Exec); ok {
					tc.answer(w)
					return tc.name != "connection dropped"
				}
				return true
			})
			_, err := c.Exec(ctx(t), Exec{Argv: []string{"x"}}, ExecIO{})
			if !tc.check(err) {
				t.Fatalf("Exec = %v", err)
			}
		})
	}
}

func TestClientExecCancel(t *testing.T) {
	c, _ := fakeAgent(t, func(t *testing.T, req Request, r *Reader, w *Writer) bool {
		if _, ok := req.(*Exec); ok {
			_ = w.WriteResponse(Started{Pid: 1}) // and never exits
		}
		return true
	})
	cctx, cancel := context.WithCancel(context.Background())
	_, err := c.Exec(cctx, Exec{Argv: []string{"sleep"}}, ExecIO{Started: func(uint32) { cancel() }})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Exec = %v, want canceled", err)
	}
	if _, err := c.Info(ctx(t)); !errors.Is(err, ErrConnUnusable) {
		t.Fatalf("after a canceled RPC: %v", err)
	}
}

func TestClientFiles(t *testing.T) {
	files := map[string][]byte{"/f": bytes.Repeat([]byte("x"), 3*BulkChunk+7)}
	c, _ := fakeAgent(t, func(t *testing.T, req Request, r *Reader, w *Writer) bool {
		switch v := req.(type) {
		case *FsRead:
			b, ok := files[v.Path]
			if !ok {
				_ = w.WriteResponse(Errorf(KindNotFound, "fs_read: missing"))
				return true
			}
			_, _ = BulkWriter{W: w, Kind: BulkDataReply}.Write(b)
			_ = w.WriteResponse(Done{})
		case *FsWrite:
			if strings.HasPrefix(v.Path, "/ro/") {
				_ = w.WriteResponse(Errorf(KindInternal, "fs_write: read-only"))
				return true // the upload that follows is dropped
			}
			var b []byte
			for {
				in, err := r.ReadRequest()
				if err != nil {
					return false
				}
				if d, ok := in.(*Data); ok {
					b = append(b, d.Data...)
					continue
				}
				break
			}
			files[v.Path] = b
			_ = w.WriteResponse(Done{})
		}
		return true
	})
	var out bytes.Buffer
	if n, err := c.ReadFile(ctx(t), "/f", &out); err != nil || n != int64(len(files["/f"])) || !bytes.Equal(out.Bytes(), files["/f"]) {
		t.Fatalf("ReadFile = %d, %v", n, err)
	}
	if _, err := c.ReadFile(ctx(t), "/nope", io.Discard); !errors.Is(err, ErrNotFound) {
		t.Fatalf("ReadFile missing = %v", err)
	}
	src := bytes.Repeat([]byte("y"), 2*BulkChunk+1)
	if err := c.WriteFile(ctx(t), FsWrite{Path: "/g"}, bytes.NewReader(src)); err != nil || !bytes.Equal(files["/g"], src) {
		t.Fatalf("WriteFile = %v", err)
	}
	// An early refusal stops the upload: a huge source is not sent whole.
	src2 := &countingReader{r: io.LimitReader(infinite('z'), 1<<30)}
	if err := c.WriteFile(ctx(t), FsWrite{Path: "/ro/x"}, src2); !errors.Is(err, ErrInternal) {
		t.Fatalf("WriteFile read-only = %v", err)
	}
	if src2.n > 64<<20 {
		t.Fatalf("uploaded %d bytes after the refusal", src2.n)
	}
}

type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

func TestClientPortForward(t *testing.T) {
	c, _ := fakeAgent(t, func(t *testing.T, req Request, r *Reader, w *Writer) bool {
		if _, ok := req.(*PortForward); !ok {
			return true
		}
		_ = w.WriteResponse(Ready{})
		for { // an echo server behind the port
			in, err := r.ReadRequest()
			if err != nil {
				return false
			}
			if d, ok := in.(*Data); ok {
				_ = w.WriteBulk(BulkDataReply, d.Data)
				continue
			}
			if _, ok := in.(*DataEnd); ok {
				_ = w.WriteResponse(Done{})
				return true
			}
		}
	})
	p, err := c.PortForward(ctx(t), 7)
	if err != nil {
		t.Fatal(err)
	}
	msg := bytes.Repeat([]byte("ping"), PortWriteChunk/2) // two frames
	go func() {
		_, _ = p.Write(msg)
		_ = p.CloseWrite()
	}()
	got, err := io.ReadAll(p)
	if err != nil || !bytes.Equal(got, msg) {
		t.Fatalf("echo: %d bytes, %v", len(got), err)
	}
	if _, err := p.Write([]byte("late")); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Write after CloseWrite = %v", err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
}
