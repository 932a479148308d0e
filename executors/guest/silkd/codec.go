package silkd

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"sync"
)

// Bulk names the five bulk frame shapes, the ones built and parsed without
// encoding/json.
type Bulk uint8

// Bulk frames: the request ops data and stdin, the response types data,
// stdout and stderr.
const (
	BulkData Bulk = iota
	BulkStdin
	BulkDataReply
	BulkStdout
	BulkStderr
)

var bulkPrefix = [...]string{
	BulkData:      `{"v":1,"op":"data","data":"`,
	BulkStdin:     `{"v":1,"op":"stdin","data":"`,
	BulkDataReply: `{"type":"data","data":"`,
	BulkStdout:    `{"type":"stdout","data":"`,
	BulkStderr:    `{"type":"stderr","data":"`,
}

const bulkSuffix = `"}`

// AppendBulk appends one bulk frame of kind carrying p, newline included.
// p must be at most MaxPayload bytes.
func AppendBulk(dst []byte, kind Bulk, p []byte) []byte {
	dst = append(dst, bulkPrefix[kind]...)
	dst = base64.StdEncoding.AppendEncode(dst, p)
	dst = append(dst, bulkSuffix...)
	return append(dst, '\n')
}

// bulkBody returns the base64 text of line if line has exactly the shape of
// a kind frame and the text needs no JSON unescaping.
func bulkBody(line []byte, kind Bulk) ([]byte, bool) {
	p := bulkPrefix[kind]
	if len(line) < len(p)+len(bulkSuffix) || string(line[:len(p)]) != p ||
		string(line[len(line)-len(bulkSuffix):]) != bulkSuffix {
		return nil, false
	}
	body := line[len(p) : len(line)-len(bulkSuffix)]
	if bytes.IndexByte(body, '"') >= 0 || bytes.IndexByte(body, '\\') >= 0 {
		return nil, false
	}
	return body, true
}

// encode marshals v compactly without HTML escaping (so "<" stays "<").
func encode(v any) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(b.Bytes(), []byte{'\n'}), nil
}

// appendTagged appends {"<key>":"<tag>", ...fields of v} and a newline.
func appendTagged(dst []byte, head string, tag string, v any) ([]byte, error) {
	body, err := encode(v)
	if err != nil {
		return dst, err
	}
	name, err := encode(tag)
	if err != nil {
		return dst, err
	}
	start := len(dst)
	dst = append(dst, head...)
	dst = append(dst, name...)
	if len(body) > 2 {
		dst = append(dst, ',')
		dst = append(dst, body[1:]...)
	} else {
		dst = append(dst, '}')
	}
	if len(dst)-start > MaxFrame {
		return dst[:start], ErrFrameTooLarge
	}
	return append(dst, '\n'), nil
}

// bulkFramer is implemented by the five bulk frame types.
type bulkFramer interface{ bulkFrame() (Bulk, []byte) }

func (d Data) bulkFrame() (Bulk, []byte)      { return BulkData, d.Data }
func (d Stdin) bulkFrame() (Bulk, []byte)     { return BulkStdin, d.Data }
func (d DataReply) bulkFrame() (Bulk, []byte) { return BulkDataReply, d.Data }
func (d Stdout) bulkFrame() (Bulk, []byte)    { return BulkStdout, d.Data }
func (d Stderr) bulkFrame() (Bulk, []byte)    { return BulkStderr, d.Data }

// rawFramer is implemented by the frames kept as their raw line.
type rawFramer interface{ rawFrame() []byte }

func (u UnknownOp) rawFrame() []byte   { return u.Raw }
func (u UnknownType) rawFrame() []byte { return u.Raw }

// appendSpecial appends the frames not encoded through encoding/json.
func appendSpecial(dst []byte, v any) ([]byte, bool, error) {
	switch f := v.(type) {
	case bulkFramer:
		kind, p := f.bulkFrame()
		b, err := appendBulkChecked(dst, kind, p)
		return b, true, err
	case rawFramer:
		b, err := appendRaw(dst, f.rawFrame())
		return b, true, err
	}
	return dst, false, nil
}

// AppendRequest appends r as one request line, newline included: the
// prefix {"v":1,"op":"<op>" and then r's fields in declaration order.
func AppendRequest(dst []byte, r Request) ([]byte, error) {
	if b, ok, err := appendSpecial(dst, r); ok {
		return b, err
	}
	// argv is required: an exec without one says [] rather than null.
	switch v := r.(type) {
	case Exec:
		if v.Argv == nil {
			v.Argv = []string{}
			r = v
		}
	case *Exec:
		if v.Argv == nil {
			c := *v
			c.Argv = []string{}
			r = c
		}
	}
	return appendTagged(dst, `{"v":1,"op":`, r.Op(), r)
}

// AppendResponse appends r as one response line, newline included: the
// prefix {"type":"<type>" and then r's fields in declaration order.
func AppendResponse(dst []byte, r Response) ([]byte, error) {
	if b, ok, err := appendSpecial(dst, r); ok {
		return b, err
	}
	return appendTagged(dst, `{"type":`, r.Type(), r)
}

func appendBulkChecked(dst []byte, kind Bulk, p []byte) ([]byte, error) {
	if len(p) > MaxPayload {
		return dst, ErrFrameTooLarge
	}
	return AppendBulk(dst, kind, p), nil
}

func appendRaw(dst, raw []byte) ([]byte, error) {
	raw = bytes.TrimSuffix(raw, []byte{'\n'})
	if len(raw) > MaxFrame {
		return dst, ErrFrameTooLarge
	}
	return append(append(dst, raw...), '\n'), nil
}

// decodeAs unmarshals line into a new T; wrong field types are a ParseError.
func decodeAs[T any](line []byte) (*T, error) {
	v := new(T)
	if err := json.Unmarshal(line, v); err != nil {
		return nil, &ParseError{Err: err}
	}
	return v, nil
}

// tag returns the value of key (op or type) in line. A frame whose tag is
// first, as every encoder here writes it, is read without a JSON parse.
func tag(line []byte, fast string, key string) (string, error) {
	if len(line) > len(fast) && string(line[:len(fast)]) == fast {
		rest := line[len(fast):]
		if i := bytes.IndexByte(rest, '"'); i >= 0 && bytes.IndexByte(rest[:i], '\\') < 0 {
			if t, ok := internTag(rest[:i]); ok {
				return t, nil
			}
		}
	}
	var env map[string]json.RawMessage
	if err := json.Unmarshal(line, &env); err != nil {
		return "", &ParseError{Err: err}
	}
	raw, ok := env[key]
	if !ok {
		return "", &ParseError{Err: errors.New(`missing "` + key + `"`)}
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", &ParseError{Err: errors.New(`"` + key + `" is not a string`)}
	}
	return s, nil
}

// tags maps the byte form of every known op and type to its constant, so
// the fast tag scan allocates nothing.
var tags = func() map[string]string {
	m := map[string]string{}
	for _, op := range Ops {
		m[op] = op
	}
	for _, t := range []string{TypeStarted, TypeStdout, TypeStderr, TypeExit, TypeDone, TypeReady,
		TypeError, TypeInfo, TypeProcs, TypeData, TypeEntries, TypeStat, TypeSessionCreated,
		TypeSessions, TypeLspStarted, TypeMatch, TypeReplaced, TypeEvent,
		TypeGitStatusResult, TypeGitCommitResult, TypeGitBranches} {
		m[t] = t
	}
	return m
}()

func internTag(b []byte) (string, bool) {
	t, ok := tags[string(b)]
	return t, ok
}

// DecodeRequest parses one request line (without its newline). The result
// is a pointer to the op's type (*Exec, *Data, ...), or *UnknownOp for an op
// the package has no type for. A malformed line is a *ParseError.
func DecodeRequest(line []byte) (Request, error) {
	return decodeRequest(line, nil)
}

var (
	requestBulks  = []Bulk{BulkData, BulkStdin}
	responseBulks = []Bulk{BulkDataReply, BulkStdout, BulkStderr}
)

// decodeBulk decodes line if it has the exact shape of one of kinds. With a
// Reader, the frame and its payload are the Reader's, reused by its next
// read; without one they are new.
func decodeBulk(line []byte, r *Reader, kinds []Bulk) (any, bool, error) {
	for _, kind := range kinds {
		body, ok := bulkBody(line, kind)
		if !ok {
			continue
		}
		if r == nil {
			r = &Reader{}
		}
		p, err := base64.StdEncoding.AppendDecode(r.payload[:0], body)
		if err != nil {
			return nil, true, &ParseError{Err: err}
		}
		r.payload = p
		switch kind {
		case BulkData:
			r.data.Data = p
			return &r.data, true, nil
		case BulkStdin:
			r.stdin.Data = p
			return &r.stdin, true, nil
		case BulkDataReply:
			r.dataReply.Data = p
			return &r.dataReply, true, nil
		case BulkStdout:
			r.stdout.Data = p
			return &r.stdout, true, nil
		}
		r.stderr.Data = p
		return &r.stderr, true, nil
	}
	return nil, false, nil
}

func decodeRequest(line []byte, r *Reader) (Request, error) {
	if f, ok, err := decodeBulk(line, r, requestBulks); ok {
		if err != nil {
			return nil, err
		}
		return f.(Request), nil
	}
	op, err := tag(line, `{"v":1,"op":"`, "op")
	if err != nil {
		return nil, err
	}
	switch op {
	case OpInfo:
		return decodeAs[Info](line)
	case OpExec:
		return decodeAs[Exec](line)
	case OpStdin:
		return decodeAs[Stdin](line)
	case OpStdinClose:
		return decodeAs[StdinClose](line)
	case OpKill:
		return decodeAs[Kill](line)
	case OpPs:
		return decodeAs[Ps](line)
	case OpAttach:
		return decodeAs[Attach](line)
	case OpLogs:
		return decodeAs[Logs](line)
	case OpSessionCreate:
		return decodeAs[SessionCreate](line)
	case OpSessionList:
		return decodeAs[SessionList](line)
	case OpSessionRm:
		return decodeAs[SessionRm](line)
	case OpFsWrite:
		return decodeAs[FsWrite](line)
	case OpFsRead:
		return decodeAs[FsRead](line)
	case OpFsList:
		return decodeAs[FsList](line)
	case OpFsStat:
		return decodeAs[FsStat](line)
	case OpFsMkdir:
		return decodeAs[FsMkdir](line)
	case OpFsRm:
		return decodeAs[FsRm](line)
	case OpFsRename:
		return decodeAs[FsRename](line)
	case OpFsPush:
		return decodeAs[FsPush](line)
	case OpFsPull:
		return decodeAs[FsPull](line)
	case OpFsFind:
		return decodeAs[FsFind](line)
	case OpFsWatch:
		return decodeAs[FsWatch](line)
	case OpPtyOpen:
		return decodeAs[PtyOpen](line)
	case OpPtyResize:
		return decodeAs[PtyResize](line)
	case OpPortForward:
		return decodeAs[PortForward](line)
	case OpData:
		return decodeAs[Data](line)
	case OpDataEnd:
		return decodeAs[DataEnd](line)
	case OpFsReplace:
		return decodeAs[FsReplace](line)
	case OpGitClone:
		return decodeAs[GitClone](line)
	case OpGitStatus:
		return decodeAs[GitStatus](line)
	case OpGitAdd:
		return decodeAs[GitAdd](line)
	case OpGitCommit:
		return decodeAs[GitCommit](line)
	case OpGitPush:
		return decodeAs[GitPush](line)
	case OpGitPull:
		return decodeAs[GitPull](line)
	case OpGitBranch:
		return decodeAs[GitBranch](line)
	case OpLspStart:
		return decodeAs[LspStart](line)
	case OpLspRequest:
		return decodeAs[LspRequest](line)
	case OpLspStop:
		return decodeAs[LspStop](line)
	}
	return &UnknownOp{Name: op, Raw: bytes.Clone(line)}, nil
}

// DecodeResponse parses one response line (without its newline). The
// result is a pointer to the type's struct (*Exit, *DataReply, *Error,
// ...), or *UnknownType. A malformed line is a *ParseError.
func DecodeResponse(line []byte) (Response, error) {
	return decodeResponse(line, nil)
}

func decodeResponse(line []byte, r *Reader) (Response, error) {
	if f, ok, err := decodeBulk(line, r, responseBulks); ok {
		if err != nil {
			return nil, err
		}
		return f.(Response), nil
	}
	t, err := tag(line, `{"type":"`, "type")
	if err != nil {
		return nil, err
	}
	switch t {
	case TypeStarted:
		return decodeAs[Started](line)
	case TypeStdout:
		return decodeAs[Stdout](line)
	case TypeStderr:
		return decodeAs[Stderr](line)
	case TypeExit:
		return decodeAs[Exit](line)
	case TypeDone:
		return decodeAs[Done](line)
	case TypeReady:
		return decodeAs[Ready](line)
	case TypeError:
		return decodeAs[Error](line)
	case TypeInfo:
		return decodeAs[InfoReply](line)
	case TypeProcs:
		return decodeAs[Procs](line)
	case TypeData:
		return decodeAs[DataReply](line)
	case TypeEntries:
		return decodeAs[Entries](line)
	case TypeStat:
		return decodeAs[Stat](line)
	case TypeSessionCreated:
		return decodeAs[SessionCreated](line)
	case TypeSessions:
		return decodeAs[Sessions](line)
	case TypeLspStarted:
		return decodeAs[LspStarted](line)
	case TypeMatch:
		return decodeAs[Match](line)
	case TypeReplaced:
		return decodeAs[Replaced](line)
	case TypeEvent:
		return decodeAs[Event](line)
	case TypeGitStatusResult:
		return decodeAs[GitStatusResult](line)
	case TypeGitCommitResult:
		return decodeAs[GitCommitResult](line)
	case TypeGitBranches:
		return decodeAs[GitBranches](line)
	}
	return &UnknownType{Name: t, Raw: bytes.Clone(line)}, nil
}

// Reader reads frames from a stream. Lines are assembled in one buffer that
// grows up to the Reader's frame bound (MaxFrame unless SetMaxFrame lowered
// it), and bulk payloads are decoded into one reused buffer, so reading
// data frames allocates nothing per frame. Either buffer, once grown past
// readerKeep by a rare large frame, is dropped at the next read, so such a
// frame does not pin megabytes per connection. It is not safe for
// concurrent use.
type Reader struct {
	rd   io.Reader
	buf  []byte
	r, w int
	err  error
	max  int // the frame bound; 0 is MaxFrame

	payload   []byte
	data      Data
	stdin     Stdin
	dataReply DataReply
	stdout    Stdout
	stderr    Stderr
}

const readerInitial = 64 << 10

// readerKeep is the largest line or payload buffer a Reader keeps between
// reads (as writerKeep for a Writer); a streamed bulk frame fits in it.
const readerKeep = 1 << 20

// NewReader returns a Reader on rd.
func NewReader(rd io.Reader) *Reader {
	return &Reader{rd: rd}
}

// SetMaxFrame bounds the lines read from now on at n bytes (n <= 0, or
// over MaxFrame, is MaxFrame): a longer one is ErrFrameTooLarge, and the
// line buffer never grows past what an n-byte line needs. A host reading a
// stream whose frames are known to be small uses it so that a guest cannot
// make it buffer MaxFrame.
func (r *Reader) SetMaxFrame(n int) {
	if n <= 0 || n > MaxFrame {
		n = 0
	}
	r.max = n
}

// maxFrame is the current frame bound.
func (r *Reader) maxFrame() int {
	if r.max == 0 {
		return MaxFrame
	}
	return r.max
}

// release drops a line or payload buffer a large frame grew past
// readerKeep, keeping the unread bytes. It runs when a read starts, once
// the previous frame (which may point into either buffer) is no longer
// needed.
func (r *Reader) release() {
	if len(r.buf) > readerKeep && r.w-r.r <= readerInitial {
		nb := make([]byte, readerInitial)
		r.r, r.w = 0, copy(nb, r.buf[r.r:r.w])
		r.buf = nb
	}
	if cap(r.payload) > readerKeep {
		r.payload = nil
	}
}

// Buffered returns the bytes read from the stream but not yet returned.
func (r *Reader) Buffered() []byte { return r.buf[r.r:r.w] }

// ReadLine returns the next line without its newline. It stays valid until
// the next read. A clean end of the stream between lines is io.EOF; an end
// inside a line is ErrTruncated; a line over the frame bound (MaxFrame, or
// SetMaxFrame's) is ErrFrameTooLarge (sticky: the stream cannot be
// resynchronised).
func (r *Reader) ReadLine() ([]byte, error) {
	r.release()
	limit := r.maxFrame()
	scanned := 0
	for {
		if i := bytes.IndexByte(r.buf[r.r+scanned:r.w], '\n'); i >= 0 {
			end := r.r + scanned + i
			line := r.buf[r.r:end]
			r.r = end + 1
			if len(line) > limit {
				r.err = ErrFrameTooLarge
				return nil, r.err
			}
			return line, nil
		}
		scanned = r.w - r.r
		if scanned > limit {
			r.err = ErrFrameTooLarge
			return nil, r.err
		}
		if r.err != nil {
			if errors.Is(r.err, io.EOF) {
				if scanned > 0 {
					r.r = r.w
					return nil, ErrTruncated
				}
				return nil, io.EOF
			}
			return nil, r.err
		}
		r.fill(limit)
	}
}

// fill reads more bytes, first making room: unread bytes move to the front,
// and a full buffer doubles (up to what a line of limit bytes needs).
func (r *Reader) fill(limit int) {
	if r.buf == nil {
		r.buf = make([]byte, readerInitial)
	}
	if r.r > 0 {
		n := copy(r.buf, r.buf[r.r:r.w])
		r.r, r.w = 0, n
	}
	if r.w == len(r.buf) {
		size := min(2*len(r.buf), limit+2)
		if size <= len(r.buf) {
			size = len(r.buf) + 1 // only reached with a line already over the cap
		}
		nb := make([]byte, size)
		copy(nb, r.buf[:r.w])
		r.buf = nb
	}
	n, err := r.rd.Read(r.buf[r.w:])
	r.w += n
	if err != nil {
		r.err = err
	}
}

// ReadRequest reads the next request, skipping blank lines. A *Data or
// *Stdin result, and its payload, are reused by the next read. A malformed
// line is a *ParseError, after which reading may go on.
func (r *Reader) ReadRequest() (Request, error) {
	for {
		line, err := r.ReadLine()
		if err != nil {
			return nil, err
		}
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		return decodeRequest(line, r)
	}
}

// ReadResponse reads the next response, skipping blank lines. A
// *DataReply, *Stdout or *Stderr result, and its payload, are reused by the
// next read. A malformed line is a *ParseError.
func (r *Reader) ReadResponse() (Response, error) {
	for {
		line, err := r.ReadLine()
		if err != nil {
			return nil, err
		}
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		return decodeResponse(line, r)
	}
}

// Writer writes frames to a stream, one Write per frame (or per batch), so
// frames from concurrent writers never interleave. After a failed write it
// returns the same error for good: the stream is broken.
type Writer struct {
	mu  sync.Mutex
	w   io.Writer
	buf []byte
	err error
}

// NewWriter returns a Writer on w.
func NewWriter(w io.Writer) *Writer { return &Writer{w: w} }

// writerKeep is the largest buffer a Writer keeps between frames; a rare
// huge frame must not pin megabytes per connection.
const writerKeep = 1 << 20

func (w *Writer) flushLocked() error {
	if w.err != nil {
		return w.err
	}
	_, err := w.w.Write(w.buf)
	if cap(w.buf) > writerKeep {
		w.buf = nil
	} else {
		w.buf = w.buf[:0]
	}
	if err != nil {
		w.err = err
	}
	return err
}

// Err returns the error that broke the stream, if any.
func (w *Writer) Err() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

// WriteRequest writes one request frame.
func (w *Writer) WriteRequest(r Request) error { return w.WriteRequests(r) }

// WriteRequests writes several request frames in one Write (the buffered
// exec sends exec and stdin_close together).
func (w *Writer) WriteRequests(rs ...Request) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil {
		return w.err
	}
	w.buf = w.buf[:0]
	for _, r := range rs {
		b, err := AppendRequest(w.buf, r)
		if err != nil {
			return err
		}
		w.buf = b
	}
	return w.flushLocked()
}

// WriteResponse writes one response frame.
func (w *Writer) WriteResponse(r Response) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil {
		return w.err
	}
	b, err := AppendResponse(w.buf[:0], r)
	if err != nil {
		return err
	}
	w.buf = b
	return w.flushLocked()
}

// WriteBulk writes p as bulk frames of kind, at most MaxPayload bytes each
// (one frame, with an empty payload, when p is empty). It allocates nothing
// once its buffer has grown to the frame size.
func (w *Writer) WriteBulk(kind Bulk, p []byte) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	for {
		if w.err != nil {
			return w.err
		}
		n := min(len(p), MaxPayload)
		w.buf = AppendBulk(w.buf[:0], kind, p[:n])
		if err := w.flushLocked(); err != nil {
			return err
		}
		p = p[n:]
		if len(p) == 0 {
			return nil
		}
	}
}

// BulkWriter is an io.Writer that sends what it is given as bulk frames of
// one kind, at most Chunk bytes each (BulkChunk when zero).
type BulkWriter struct {
	W     *Writer
	Kind  Bulk
	Chunk int
}

// Write implements io.Writer.
func (b BulkWriter) Write(p []byte) (int, error) {
	chunk := b.Chunk
	if chunk <= 0 {
		chunk = BulkChunk
	}
	chunk = min(chunk, MaxPayload)
	done := 0
	for done < len(p) {
		n := min(len(p)-done, chunk)
		if err := b.W.WriteBulk(b.Kind, p[done:done+n]); err != nil {
			return done, err
		}
		done += n
	}
	return done, nil
}
