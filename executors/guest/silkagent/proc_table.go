package silkagent

import (
	"cmp"
	"slices"
	"sync"
	"time"

	"github.com/sbxlog/sbxlog/executors/guest/silkd"
)

// Bounds of the process table.
const (
	// LogRing bounds the output each process keeps for logs and attach
	// (stdout and stderr together; the oldest chunks go first), as the old
	// agent's ring did.
	LogRing = 256 << 10
	// MaxExited bounds the exited processes the table remembers, so their
	// rings cannot pile up before ReapDelay: past it the oldest exited one
	// is forgotten at once. Detached and foreground processes are counted
	// apart, so a run of short execs does not push out the output of a
	// detached one (which the old agent kept for its whole ReapDelay).
	MaxExited = 64
)

// procTable is the processes the Server started (exec, detached or not,
// and pty_open), by pid, from any connection.
type procTable struct {
	mu     sync.Mutex
	m      map[uint32]*procEntry
	exited [2][]*procEntry // foreground, detached; oldest first, for MaxExited
}

// procEntry is one process: what ps shows and the output log that logs and
// attach replay.
type procEntry struct {
	p        Process
	argv     []string
	detached bool
	started  time.Time
	out      outputLog
}

func (t *procTable) add(p Process, argv []string, detached bool, now time.Time) *procEntry {
	e := &procEntry{p: p, argv: slices.Clone(argv), detached: detached, started: now}
	t.mu.Lock()
	t.m[p.Pid()] = e
	t.mu.Unlock()
	return e
}

func (t *procTable) get(pid uint32) (*procEntry, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e, ok := t.m[pid]
	return e, ok
}

// reaped records that e's process exited with code: kill no longer
// signals its pid, ps shows it exited.
func (t *procTable) reaped(e *procEntry, code int32) { e.out.reap(code) }

// ended records the end of e's output after its exit (attachers get their
// exit frame), and forgets e after ReapDelay, or sooner when MaxExited
// newer ones have ended.
func (t *procTable) ended(e *procEntry) {
	e.out.end()
	q := &t.exited[0]
	if e.detached {
		q = &t.exited[1]
	}
	t.mu.Lock()
	*q = append(*q, e)
	for len(*q) > MaxExited {
		t.forget((*q)[0])
		*q = (*q)[1:]
	}
	t.mu.Unlock()
	time.AfterFunc(ReapDelay, func() {
		t.mu.Lock()
		defer t.mu.Unlock()
		t.forget(e)
		if i := slices.Index(*q, e); i >= 0 {
			*q = slices.Delete(*q, i, i+1)
		}
	})
}

// forget removes e if its pid still names it (an OS pid is reused).
// Callers hold t.mu.
func (t *procTable) forget(e *procEntry) {
	if t.m[e.p.Pid()] == e {
		delete(t.m, e.p.Pid())
	}
}

func (t *procTable) running() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for _, e := range t.m {
		if _, exited := e.out.exitCode(); !exited {
			n++
		}
	}
	return n
}

// list is ps's answer, by pid.
func (t *procTable) list() []silkd.Proc {
	t.mu.Lock()
	out := make([]silkd.Proc, 0, len(t.m))
	for pid, e := range t.m {
		p := silkd.Proc{Pid: pid, Argv: e.argv, Detached: e.detached, State: "running",
			StartedAtEpochSecs: uint64(max(e.started.Unix(), 0))}
		if code, exited := e.out.exitCode(); exited {
			p.State, p.ExitCode = "exited", &code
		}
		out = append(out, p)
	}
	t.mu.Unlock()
	slices.SortFunc(out, func(a, b silkd.Proc) int { return cmp.Compare(a.Pid, b.Pid) })
	return out
}

// outputLog is a process's output as a numbered sequence of chunks, of
// which the last LogRing bytes are kept. A reader follows it by sequence
// number, so a replay and the live output that follows it never overlap
// or leave a gap (but what the ring dropped before a slow reader got to
// it). Chunks are never modified once appended, so readers use them
// without the lock.
type outputLog struct {
	mu     sync.Mutex
	chunks []outChunk
	first  uint64 // sequence number of chunks[0]
	bytes  int
	reaped bool // the process exited
	code   int32
	ended  bool          // and its output is complete
	wake   chan struct{} // closed at the next append or exit; nil until a reader waits
}

type outChunk struct {
	kind silkd.Bulk // BulkStdout or BulkStderr
	data []byte
}

// append records a copy of p.
func (l *outputLog) append(kind silkd.Bulk, p []byte) {
	if len(p) == 0 {
		return
	}
	c := outChunk{kind: kind, data: slices.Clone(p)}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.chunks = append(l.chunks, c)
	l.bytes += len(p)
	for l.bytes > LogRing && len(l.chunks) > 1 {
		l.bytes -= len(l.chunks[0].data)
		l.chunks[0] = outChunk{}
		l.chunks = l.chunks[1:]
		l.first++
	}
	l.signal()
}

func (l *outputLog) reap(code int32) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.reaped, l.code = true, code
}

func (l *outputLog) end() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ended = true
	l.signal()
}

// signal wakes the waiting readers. Callers hold l.mu.
func (l *outputLog) signal() {
	if l.wake != nil {
		close(l.wake)
		l.wake = nil
	}
}

// exitCode is the process's exit code once it has exited.
func (l *outputLog) exitCode() (int32, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.code, l.reaped
}

// since returns the chunks from sequence number seq on (from the oldest
// kept if seq is older), the number after them, and whether the output
// had ended by then (and the exit code); wake is closed when there is more
// to read.
func (l *outputLog) since(seq uint64) (chunks []outChunk, next uint64, ended bool, code int32, wake <-chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	seq = max(seq, l.first)
	end := l.first + uint64(len(l.chunks))
	chunks = slices.Clone(l.chunks[seq-l.first:])
	if l.wake == nil {
		l.wake = make(chan struct{})
	}
	return chunks, end, l.ended, l.code, l.wake
}
