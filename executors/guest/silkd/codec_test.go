package silkd

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"reflect"
	"strings"
	"sync"
	"testing"
	"testing/iotest"
)

func TestBulkShapes(t *testing.T) {
	tests := []struct {
		kind Bulk
		want string
	}{
		{BulkData, `{"v":1,"op":"data","data":"aGk="}` + "\n"},
		{BulkStdin, `{"v":1,"op":"stdin","data":"aGk="}` + "\n"},
		{BulkDataReply, `{"type":"data","data":"aGk="}` + "\n"},
		{BulkStdout, `{"type":"stdout","data":"aGk="}` + "\n"},
		{BulkStderr, `{"type":"stderr","data":"aGk="}` + "\n"},
	}
	for _, tc := range tests {
		if got := string(AppendBulk(nil, tc.kind, []byte("hi"))); got != tc.want {
			t.Errorf("AppendBulk(%d) = %q, want %q", tc.kind, got, tc.want)
		}
	}
	// The typed encoders take the same path.
	for _, v := range []any{Data{Data: B64("hi")}, &Stdin{Data: B64("hi")}} {
		b, err := AppendRequest(nil, v.(Request))
		if err != nil || !strings.Contains(string(b), `"data":"aGk="}`) {
			t.Errorf("AppendRequest(%T) = %q, %v", v, b, err)
		}
	}
	// Nil payloads are "", never null.
	for _, r := range []Response{DataReply{}, Stdout{}, &Stderr{}} {
		b, err := AppendResponse(nil, r)
		if err != nil || !strings.HasSuffix(string(b), `"data":""}`+"\n") {
			t.Errorf("AppendResponse(%T) = %q, %v", r, b, err)
		}
	}
	if b, err := AppendRequest(nil, Exec{}); err != nil || string(b) != `{"v":1,"op":"exec","argv":[],"detach":false}`+"\n" {
		t.Errorf("exec without argv = %q, %v (argv must be [], not null)", b, err)
	}
}

// Frames in other shapes (keys reordered, escapes, spaces, unknown fields)
// decode through encoding/json to the same values.
func TestDecodeFallbacks(t *testing.T) {
	reqs := []struct {
		line string
		want Request
	}{
		{`{"op":"data","v":1,"data":"aGk="}`, &Data{Data: B64("hi")}},
		{`{"v":1,"op":"data","data":"a\u0047k="}`, &Data{Data: B64("hi")}},
		{`{"v":1, "op":"stdin", "data":"aGk="}`, &Stdin{Data: B64("hi")}},
		{`{"v":1,"op":"stdin","data":null}`, &Stdin{}},
		{`{"op":"info"}`, &Info{}},
		{`{"v":7,"op":"fs_stat","path":"/x","future":{"a":1}}`, &FsStat{Path: "/x"}},
		{`{"v":1,"op":"exec","argv":["a"]}`, &Exec{Argv: []string{"a"}}},
		{`  {"v":1,"op":"data_end"}  `, &DataEnd{}},
	}
	for _, tc := range reqs {
		got, err := DecodeRequest([]byte(tc.line))
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("DecodeRequest(%s) = %#v, %v; want %#v", tc.line, got, err, tc.want)
		}
	}
	resps := []struct {
		line string
		want Response
	}{
		{`{"data":"aGk=","type":"stdout"}`, &Stdout{Data: B64("hi")}},
		{`{"type":"data","data":"aGk\/"}`, &DataReply{Data: []byte{0x68, 0x69, 0x3f}}},
		{`{"code":-1,"type":"exit"}`, &Exit{Code: -1}},
		{`{"type":"info","proto":2,"extra":[1,2]}`, &InfoReply{Proto: 2}},
		{`{"type":"info","version":"x","proto":2,"uptime_secs":1,"procs":0,"sessions":0,"agent":"chsim","simulated":true}`,
			&InfoReply{Version: "x", Proto: 2, UptimeSecs: 1, Agent: "chsim", Simulated: true}},
	}
	for _, tc := range resps {
		got, err := DecodeResponse([]byte(tc.line))
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("DecodeResponse(%s) = %#v, %v; want %#v", tc.line, got, err, tc.want)
		}
	}
}

func TestDecodeErrors(t *testing.T) {
	for _, line := range []string{
		`not json`,
		`{"v":1}`,
		`{"v":1,"op":5}`,
		`{"v":1,"op":"exec","argv":"ls"}`,
		`{"v":1,"op":"port_forward","port":70000}`,
		`{"v":1,"op":"data","data":"%%%"}`,
		`{"v":1,"op":"kill","pid":-1}`,
		`[1,2]`,
	} {
		_, err := DecodeRequest([]byte(line))
		var pe *ParseError
		if !errors.As(err, &pe) || !strings.HasPrefix(err.Error(), "parse: ") {
			t.Errorf("DecodeRequest(%s) = %v, want a ParseError", line, err)
		}
	}
	for _, line := range []string{`{}`, `{"type":"exit","code":"x"}`, `{"type":"stdout","data":"!"}`} {
		if _, err := DecodeResponse([]byte(line)); err == nil {
			t.Errorf("DecodeResponse(%s) succeeded", line)
		}
	}
}

// Ops and types without a struct here still round-trip, so an agent can
// name them in its answer and a relay can pass them on.
func TestUnknownTags(t *testing.T) {
	line := `{"v":1,"op":"teleport","to":"/w"}`
	r, err := DecodeRequest([]byte(line))
	u, ok := r.(*UnknownOp)
	if err != nil || !ok || u.Name != "teleport" || string(u.Raw) != line {
		t.Fatalf("DecodeRequest = %#v, %v", r, err)
	}
	if b, err := AppendRequest(nil, u); err != nil || string(b) != line+"\n" {
		t.Fatalf("re-encoded %q, %v", b, err)
	}
	resp, err := DecodeResponse([]byte(`{"type":"beamed","where":"mars"}`))
	if ut, ok := resp.(*UnknownType); err != nil || !ok || ut.Name != "beamed" {
		t.Fatalf("DecodeResponse = %#v, %v", resp, err)
	}
}

func TestNoHTMLEscaping(t *testing.T) {
	b, err := AppendResponse(nil, &Error{Kind: KindBadRequest, Message: "a <b> & c"})
	if err != nil || string(b) != `{"type":"error","kind":"bad_request","message":"a <b> & c"}`+"\n" {
		t.Fatalf("got %q, %v", b, err)
	}
}

func TestErrorKinds(t *testing.T) {
	e := Errorf(KindNotFound, "connect %d: refused", 80)
	if !errors.Is(e, ErrNotFound) || errors.Is(e, ErrInternal) || errors.Is(e, &Error{Kind: KindNotFound, Message: "x"}) {
		t.Fatal("Is matches kinds through the sentinels only")
	}
	if e.Error() != "silkd: not_found: connect 80: refused" {
		t.Fatalf("Error() = %q", e.Error())
	}
}

func TestReaderLines(t *testing.T) {
	in := "{\"type\":\"done\"}\n\n  \n{\"type\":\"exit\",\"code\":3}\n{\"type\":\"rea"
	r := NewReader(iotest.OneByteReader(strings.NewReader(in)))
	if f, err := r.ReadResponse(); err != nil || f.Type() != TypeDone {
		t.Fatalf("first = %v, %v", f, err)
	}
	if f, err := r.ReadResponse(); err != nil || !reflect.DeepEqual(f, &Exit{Code: 3}) {
		t.Fatalf("second = %v, %v (blank lines are skipped)", f, err)
	}
	if _, err := r.ReadResponse(); !errors.Is(err, ErrTruncated) {
		t.Fatalf("a line cut by EOF = %v, want ErrTruncated", err)
	}
	if _, err := r.ReadResponse(); !errors.Is(err, io.EOF) {
		t.Fatalf("after the cut = %v, want EOF", err)
	}
	if _, err := NewReader(strings.NewReader("")).ReadLine(); !errors.Is(err, io.EOF) {
		t.Fatalf("empty stream = %v", err)
	}
}

// A frame of exactly MaxFrame bytes passes; one more byte fails for good.
func TestReaderFrameCap(t *testing.T) {
	head, tail := `{"type":"data","data":"`, `"}`
	room := MaxFrame - len(head) - len(tail)
	body := strings.Repeat("A", room/4*4)
	// Spaces before the closing brace make up the rest: exactly MaxFrame.
	max := head + body + `"` + strings.Repeat(" ", room-len(body)) + `}`
	if len(max) != MaxFrame {
		t.Fatalf("test frame is %d bytes", len(max))
	}
	r := NewReader(strings.NewReader(max + "\n" + `{"type":"done"}` + "\n"))
	f, err := r.ReadResponse()
	if err != nil || len(f.(*DataReply).Data) != len(body)/4*3 {
		t.Fatalf("a maximal frame: %v", err)
	}
	if f, err := r.ReadResponse(); err != nil || f.Type() != TypeDone {
		t.Fatalf("after it: %v, %v", f, err)
	}
	over := head + body + `"` + strings.Repeat(" ", room-len(body)+1) + `}` + "\n" + `{"type":"done"}` + "\n"
	r = NewReader(strings.NewReader(over))
	if _, err := r.ReadResponse(); !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("an oversized frame = %v", err)
	}
	if _, err := r.ReadResponse(); !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("the cap is sticky, got %v", err)
	}
	// No newline at all: the reader gives up at the cap rather than growing.
	r = NewReader(io.MultiReader(strings.NewReader(head), infinite('A')))
	if _, err := r.ReadLine(); !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("an endless line = %v", err)
	}
	if cap(r.buf) > MaxFrame+64 {
		t.Fatalf("buffer grew to %d", cap(r.buf))
	}
	// Writers refuse to emit what a reader would refuse.
	if _, err := AppendRequest(nil, Exec{Argv: []string{strings.Repeat("x", MaxFrame)}}); !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("oversized exec = %v", err)
	}
	if _, err := AppendRequest(nil, Data{Data: make([]byte, MaxPayload+1)}); !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("oversized data = %v", err)
	}
	if b, err := AppendResponse(nil, DataReply{Data: make([]byte, MaxPayload)}); err != nil || len(b)-1 > MaxFrame {
		t.Fatalf("a MaxPayload frame is %d bytes, %v", len(b), err)
	}
}

type infinite byte

func (c infinite) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = byte(c)
	}
	return len(p), nil
}

// Payloads of every size survive Writer -> Reader, whatever the split.
func TestBulkRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var stream bytes.Buffer
	w := NewWriter(&stream)
	var want [][]byte
	for _, n := range []int{0, 1, 2, 3, 4, 1000, BulkChunk, BulkChunk + 1, MaxPayload + 5} {
		p := make([]byte, n)
		for i := range p {
			p[i] = byte(rng.Uint32())
		}
		if err := w.WriteBulk(BulkDataReply, p); err != nil {
			t.Fatal(err)
		}
		want = append(want, p)
	}
	if err := w.WriteResponse(Done{}); err != nil {
		t.Fatal(err)
	}
	r := NewReader(iotest.HalfReader(&stream))
	var got []byte
	for {
		f, err := r.ReadResponse()
		if err != nil {
			t.Fatal(err)
		}
		if f.Type() == TypeDone {
			break
		}
		got = append(got, f.(*DataReply).Data...)
	}
	if !bytes.Equal(got, bytes.Join(want, nil)) {
		t.Fatalf("payloads differ: got %d bytes, want %d", len(got), len(bytes.Join(want, nil)))
	}
}

// Moving data allocates nothing per frame on either end.
func TestBulkAllocations(t *testing.T) {
	if testing.CoverMode() != "" {
		t.Skip("coverage instrumentation allocates")
	}
	p := make([]byte, BulkChunk)
	w := NewWriter(io.Discard)
	_ = w.WriteBulk(BulkData, p)
	if n := testing.AllocsPerRun(50, func() { _ = w.WriteBulk(BulkData, p) }); n != 0 {
		t.Errorf("WriteBulk: %v allocs per frame", n)
	}
	frame := AppendBulk(nil, BulkDataReply, p)
	r := NewReader(repeat(frame))
	_, _ = r.ReadResponse()
	if n := testing.AllocsPerRun(50, func() {
		if _, err := r.ReadResponse(); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("ReadResponse of a data frame: %v allocs per frame", n)
	}
	req := AppendBulk(nil, BulkStdin, p[:OutputChunk])
	rr := NewReader(repeat(req))
	_, _ = rr.ReadRequest()
	if n := testing.AllocsPerRun(50, func() {
		if _, err := rr.ReadRequest(); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("ReadRequest of a stdin frame: %v allocs per frame", n)
	}
}

type repeater struct {
	b   []byte
	off int
}

func repeat(b []byte) *repeater { return &repeater{b: b} }

func (r *repeater) Read(p []byte) (int, error) {
	n := copy(p, r.b[r.off:])
	r.off = (r.off + n) % len(r.b)
	return n, nil
}

// Frames from concurrent writers never interleave.
func TestWriterConcurrent(t *testing.T) {
	pr, pw := io.Pipe()
	w := NewWriter(pw)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p := bytes.Repeat([]byte{byte(g)}, 5000+g)
			for range 50 {
				if err := w.WriteBulk(BulkStdout, p); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	go func() { wg.Wait(); pw.Close() }()
	r := NewReader(pr)
	n := 0
	for {
		f, err := r.ReadResponse()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		d := f.(*Stdout).Data
		if len(d) != 5000+int(d[0]) || bytes.Count(d, d[:1]) != len(d) {
			t.Fatalf("frame mixes writers")
		}
		n++
	}
	if n != 400 {
		t.Fatalf("%d frames, want 400", n)
	}
}

// A failed write breaks the Writer for good.
func TestWriterSticky(t *testing.T) {
	w := NewWriter(failWriter{})
	if err := w.WriteResponse(Done{}); err == nil {
		t.Fatal("no error")
	}
	if err := w.WriteBulk(BulkStdout, []byte("x")); !errors.Is(err, errBroken) || !errors.Is(w.Err(), errBroken) {
		t.Fatalf("after a failure: %v", err)
	}
}

var errBroken = errors.New("broken")

type failWriter struct{}

func (failWriter) Write([]byte) (int, error) { return 0, errBroken }
