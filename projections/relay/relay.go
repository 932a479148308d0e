// Package relay splices a client connection to a guest connection, both
// ways, for sandboxd's data plane (the agent and ports routes after their
// 101, and anything else that moves bytes between a client and a guest).
//
// Contract:
//   - Bytes flow as they come, with backpressure both ways: each direction
//     is one blocking copy, nothing is queued beyond a copy's buffer, so a
//     slow reader slows its writer and nobody else.
//   - The fast path is the kernel's: between a *net.TCPConn and a
//     *net.TCPConn or a stream *net.UnixConn, io.Copy runs splice(2) with
//     no user-space copy. Callers keep it reachable by handing in the raw
//     connections (no wrappers after a handshake). Any other pair copies
//     through a pooled buffer (Options.Buffer bytes): nothing is allocated
//     per chunk, or per relay once the pool is warm.
//   - Half-close: a clean EOF from one side is passed on with CloseWrite
//     where the other side has one (TCP, unix stream, or a wrapper that
//     implements it); the other direction then runs for as long as it
//     makes progress, and is cut once nothing moved for Options.Drain (a
//     peer that stopped, not one that is slow: a bound on the time since
//     the half-close would cut a stream that is still moving, and on a
//     loaded node it did). A side without CloseWrite is closed, which ends
//     the relay. A copy error (not EOF) closes both at once.
//   - Never a silent short stream: a relay the drain bound cuts resets the
//     client (TCP RST: its read fails, ECONNRESET, after what did arrive)
//     rather than closing it with a FIN that would read as a complete
//     answer, and ends with ReasonDrain.
//   - Idle: with Options.Idle > 0, a relay through which no byte moved in
//     either direction for that long ends with ReasonIdle. For a TCP client
//     the count is the kernel's (TCP_INFO bytes received and acknowledged),
//     so the spliced path is watched without being slowed; otherwise the
//     copies count what they move. The drain bound watches the same count.
//   - Stop ends a relay from outside with a reason (a release, a shutdown):
//     the guest is closed, the client gets a FIN (CloseWrite) and, after a
//     short grace for it to notice, is closed too.
//   - Run returns once both directions ended and both connections are
//     closed, with the bytes each way and why it ended: ReasonDrain if the
//     drain bound cut it, else the first of ReasonClient (the client's EOF
//     or error came first), ReasonGuest, ReasonIdle, or Stop's reason.
package relay

import (
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Reasons a relay ends with, besides Stop's.
const (
	ReasonClient = "client" // the client ended first (EOF, error or reset)
	ReasonGuest  = "guest"  // the guest ended first
	ReasonIdle   = "idle"   // nothing moved for Options.Idle
	ReasonDrain  = "drain"  // one side ended, then nothing moved the other way for Options.Drain
)

// Defaults of Options.
const (
	// DefaultDrain is how long the other direction may make no progress
	// after one side ended cleanly (the old daemon's drain grace).
	DefaultDrain = 30 * time.Second
	// DefaultBuffer is the copy buffer of the pooled path, held for a
	// relay's life by each of its directions: large enough that a frame
	// per write costs little, small enough for hundreds of relays.
	DefaultBuffer = 64 << 10
	// stopGrace is how long a stopped relay's client has, after its FIN,
	// before it is closed.
	stopGrace = time.Second
)

// Options tune a relay; zero values take the defaults.
type Options struct {
	// Idle ends a relay through which nothing moved for that long (0: no
	// idle limit).
	Idle time.Duration
	// Drain cuts the other direction once one side ended and nothing
	// moved for that long (DefaultDrain).
	Drain time.Duration
	// Pool is the buffer pool of the copying path (nil: a package pool of
	// DefaultBuffer buffers).
	Pool *Pool
	// Now is the clock the idle and drain watches read (default time.Now).
	Now func() time.Time
}

// Result is how a relay went.
type Result struct {
	// In is what reached the guest from the client (pending bytes
	// included); Out what reached the client from the guest.
	In, Out int64
	// Reason says why it ended (see the package doc).
	Reason string
	// Spliced reports whether each direction ran on the kernel's splice
	// path (client to guest, guest to client).
	Spliced [2]bool
}

// Pool is a pool of copy buffers of one size.
type Pool struct {
	size int
	p    sync.Pool
}

// NewPool returns a pool of size-byte buffers.
func NewPool(size int) *Pool {
	pl := &Pool{size: size}
	pl.p.New = func() any { b := make([]byte, size); return &b }
	return pl
}

func (p *Pool) get() *[]byte  { return p.p.Get().(*[]byte) }
func (p *Pool) put(b *[]byte) { p.p.Put(b) }

var defaultPool = NewPool(DefaultBuffer)

// Relay is one client-guest splice. Create with Splice, run with Run.
type Relay struct {
	client, guest net.Conn
	o             Options

	mu         sync.Mutex
	reason     string // the first end, once known
	stopped    bool
	stopDrain  func() // ends the drain watch, once a side half-closed
	ends       int    // directions that ended
	closed     bool
	kernelMove func() (int64, bool) // the TCP side's count (tcpCounter), or nil

	moved atomic.Int64 // bytes the copying path moved (with kernelMove, the watches' count)
}

// Splice returns a relay between client and guest; nothing moves until Run.
func Splice(client, guest net.Conn, o Options) *Relay {
	if o.Drain <= 0 {
		o.Drain = DefaultDrain
	}
	if o.Pool == nil {
		o.Pool = defaultPool
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	kernel := tcpCounter(client)
	if kernel == nil {
		kernel = tcpCounter(guest)
	}
	return &Relay{client: client, guest: guest, o: o, kernelMove: kernel}
}

// setReason records why the relay ends, if nothing did before.
func (r *Relay) setReason(reason string) {
	r.mu.Lock()
	if r.reason == "" {
		r.reason = reason
	}
	r.mu.Unlock()
}

// closeAll closes both connections once.
func (r *Relay) closeAll() {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return
	}
	r.closed = true
	stopDrain := r.stopDrain
	r.mu.Unlock()
	if stopDrain != nil {
		stopDrain()
	}
	_ = r.guest.Close()
	_ = r.client.Close()
}

// cut ends the relay with ReasonDrain: a direction still owed bytes, so
// the client is reset, which its read reports as an error, instead of
// being closed with a FIN that it would take for a complete stream. A
// Stop's reason stays (its FIN is the contract of a release), and a relay
// whose directions both ended meanwhile is left to end cleanly.
func (r *Relay) cut() {
	r.mu.Lock()
	if r.stopped || r.closed || r.ends == 2 {
		r.mu.Unlock()
		return
	}
	r.reason = ReasonDrain
	r.mu.Unlock()
	if l, ok := r.client.(interface{ SetLinger(int) error }); ok {
		_ = l.SetLinger(0) // close sends RST
	}
	r.closeAll()
}

// Stop ends the relay with reason: the guest is closed, the client sees a
// clean end (FIN) and is closed after a short grace. Safe to call at any
// time, more than once, and concurrently with Run; the first reason wins.
func (r *Relay) Stop(reason string) {
	r.setReason(reason)
	r.mu.Lock()
	if r.stopped || r.closed {
		r.mu.Unlock()
		return
	}
	r.stopped = true
	r.mu.Unlock()
	_ = r.guest.Close()
	if cw, ok := r.client.(closeWriter); ok && cw.CloseWrite() == nil {
		time.AfterFunc(stopGrace, r.closeAll)
		return
	}
	r.closeAll()
}

type closeWriter interface{ CloseWrite() error }

// ended handles a direction's end: src's EOF (err nil) is passed to dst as
// a half-close and arms the drain bound; anything else closes both.
func (r *Relay) ended(dst net.Conn, err error, reason string) {
	r.setReason(reason)
	r.mu.Lock()
	r.ends++
	stopped := r.stopped
	r.mu.Unlock()
	if stopped {
		return // Stop closes both, after the client's grace
	}
	if err == nil {
		if cw, ok := dst.(closeWriter); ok && cw.CloseWrite() == nil {
			r.mu.Lock()
			if !r.closed && r.stopDrain == nil {
				r.stopDrain = r.watchStall(r.o.Drain, r.cut)
			}
			r.mu.Unlock()
			return
		}
	}
	r.closeAll()
}

// Run relays until both directions ended. pending are bytes the client sent
// ahead (read with its request head); they reach the guest first. Run
// clears the client's deadlines; both connections are closed when it
// returns.
func (r *Relay) Run(pending []byte) Result {
	_ = r.client.SetDeadline(time.Time{})
	var res Result
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		var n int64
		var err error
		if len(pending) > 0 {
			var m int
			m, err = r.guest.Write(pending)
			n = int64(m)
		}
		if err == nil {
			var m int64
			m, res.Spliced[0], err = r.copy(r.guest, r.client)
			n += m
		}
		res.In = n
		r.ended(r.guest, copyEnd(err), ReasonClient)
	}()
	go func() {
		defer wg.Done()
		n, spliced, err := r.copy(r.client, r.guest)
		res.Out, res.Spliced[1] = n, spliced
		r.ended(r.client, copyEnd(err), ReasonGuest)
	}()
	stopIdle := func() {}
	if r.o.Idle > 0 {
		stopIdle = r.watchStall(r.o.Idle, func() {
			r.setReason(ReasonIdle)
			r.closeAll()
		})
	}
	wg.Wait()
	stopIdle()
	r.closeAll()
	r.mu.Lock()
	res.Reason = r.reason
	r.mu.Unlock()
	return res
}

// copyEnd maps a copy's end to nil for a clean EOF.
func copyEnd(err error) error {
	if errors.Is(err, io.EOF) {
		return nil
	}
	if err == nil {
		return nil
	}
	return err
}

// copy moves src to dst until src's EOF or an error: splice where the pair
// allows, a pooled buffer otherwise.
func (r *Relay) copy(dst, src net.Conn) (int64, bool, error) {
	if Spliceable(dst, src) {
		n, err := io.Copy(dst, src)
		return n, true, err
	}
	buf := r.o.Pool.get()
	defer r.o.Pool.put(buf)
	n, err := io.CopyBuffer(countingWriter{w: dst, n: &r.moved}, readerOnly{src}, *buf)
	return n, false, err
}

// Spliceable reports whether io.Copy(dst, src) runs on the kernel's splice
// path: TCP to TCP, stream unix to TCP, TCP to stream unix.
func Spliceable(dst, src net.Conn) bool {
	switch d := dst.(type) {
	case *net.TCPConn:
		switch s := src.(type) {
		case *net.TCPConn:
			return true
		case *net.UnixConn:
			return isStream(s)
		}
	case *net.UnixConn:
		_, tcp := src.(*net.TCPConn)
		return tcp && isStream(d)
	}
	return false
}

// readerOnly hides a connection's WriterTo, so io.CopyBuffer uses the
// pooled buffer instead of a fallback that allocates its own.
type readerOnly struct{ r io.Reader }

func (r readerOnly) Read(p []byte) (int, error) { return r.r.Read(p) }

// countingWriter hides a connection's ReaderFrom (for the same reason) and
// counts what it writes, for the idle watch of the copying path.
type countingWriter struct {
	w io.Writer
	n *atomic.Int64
}

func (c countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n.Add(int64(n))
	return n, err
}

// count is the bytes moved either way so far, as the watches see them: the
// kernel's count of the TCP side plus what the copying path moved.
func (r *Relay) count() int64 {
	n := r.moved.Load()
	if r.kernelMove != nil {
		if k, ok := r.kernelMove(); ok {
			n += k
		}
	}
	return n
}

// watchStall calls stalled (once, on its own goroutine) when nothing moved
// for limit, as read on Options.Now, and returns what stops the watch. The
// idle limit and the drain bound are both this watch.
func (r *Relay) watchStall(limit time.Duration, stalled func()) (stop func()) {
	step := max(limit/4, 10*time.Millisecond)
	var (
		mu     sync.Mutex
		done   bool
		t      *time.Timer
		last   = r.count()
		lastAt = r.o.Now()
	)
	var check func()
	check = func() {
		mu.Lock()
		defer mu.Unlock()
		if done {
			return
		}
		now := r.o.Now()
		if n := r.count(); n != last {
			last, lastAt = n, now
		} else if now.Sub(lastAt) >= limit {
			done = true
			go stalled()
			return
		}
		t = time.AfterFunc(step, check)
	}
	mu.Lock()
	t = time.AfterFunc(step, check)
	mu.Unlock()
	return func() {
		mu.Lock()
		done = true
		t.Stop()
		mu.Unlock()
	}
}
