package relay

import (
	"bytes"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// tcpPair returns the two ends of a loopback TCP connection.
func tcpPair(t *testing.T) (a, b net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return pair(t, ln, "tcp")
}

// unixPair returns the two ends of a unix stream connection.
func unixPair(t *testing.T) (a, b net.Conn) {
	t.Helper()
	ln, err := net.Listen("unix", filepath.Join(t.TempDir(), "s"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return pair(t, ln, "unix")
}

func pair(t *testing.T, ln net.Listener, network string) (net.Conn, net.Conn) {
	t.Helper()
	acc := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		acc <- c
	}()
	d, err := net.Dial(network, ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	srv := <-acc
	if srv == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { d.Close(); srv.Close() })
	return d, srv
}

// relayed is a running relay: the client's far end, the guest's far end and
// the relay's result once it ends.
type relayed struct {
	r      *Relay
	client net.Conn // what the client program holds
	guest  net.Conn // what the guest program holds
	done   chan Result
}

func start(t *testing.T, guestKind string, o Options, pending []byte) *relayed {
	t.Helper()
	userSide, relayClient := tcpPair(t)
	var relayGuest, guestSide net.Conn
	switch guestKind {
	case "unix":
		relayGuest, guestSide = unixPair(t)
	case "tcp":
		relayGuest, guestSide = tcpPair(t)
	case "pipe":
		relayGuest, guestSide = net.Pipe()
	}
	rl := &relayed{r: Splice(relayClient, relayGuest, o), client: userSide, guest: guestSide, done: make(chan Result, 1)}
	go func() { rl.done <- rl.r.Run(pending) }()
	return rl
}

func (rl *relayed) result(t *testing.T, within time.Duration) Result {
	t.Helper()
	select {
	case res := <-rl.done:
		return res
	case <-time.After(within):
		t.Fatalf("relay still running after %s", within)
		return Result{}
	}
}

func randomBytes(t *testing.T, n int) []byte {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

// Each guest kind moves 1 MiB both ways, with the client's pipelined bytes
// first; TCP and unix guests take the splice path and move both ways at
// once. A pipe has no half-close, so the client's EOF closes it (and ends
// the relay): there the client sends only after the guest's bytes arrived,
// or the guest's write would race the close.
func TestRelayBothWays(t *testing.T) {
	for _, kind := range []string{"unix", "tcp", "pipe"} {
		t.Run(kind, func(t *testing.T) {
			up, down := randomBytes(t, 1<<20), randomBytes(t, 1<<20)
			rl := start(t, kind, Options{}, []byte("head:"))
			gotUp, gotDown := make(chan []byte, 1), make(chan []byte, 1)
			downArrived := make(chan struct{})
			go func() { b, _ := io.ReadAll(rl.guest); gotUp <- b }()
			go func() {
				b := make([]byte, len(down))
				n, _ := io.ReadFull(rl.client, b)
				close(downArrived)
				rest, _ := io.ReadAll(rl.client)
				gotDown <- append(b[:n], rest...)
			}()
			go func() {
				if kind == "pipe" {
					<-downArrived
				}
				rl.client.Write(up)
				rl.client.(*net.TCPConn).CloseWrite()
			}()
			if _, err := rl.guest.Write(down); err != nil {
				t.Fatal(err)
			}
			if b := <-gotUp; !bytes.Equal(b, append([]byte("head:"), up...)) {
				t.Fatalf("guest got %d bytes, want %d", len(b), len(up)+5)
			}
			rl.guest.Close()
			if b := <-gotDown; !bytes.Equal(b, down) {
				t.Fatalf("client got %d bytes, want %d", len(b), len(down))
			}
			res := rl.result(t, 5*time.Second)
			want := kind != "pipe"
			if res.In != int64(len(up)+5) || res.Out != int64(len(down)) || res.Spliced != [2]bool{want, want} || res.Reason != ReasonClient {
				t.Fatalf("result %+v", res)
			}
		})
	}
}

// A client's half-close reaches the guest, which can still answer; the
// guest's half-close reaches the client, which can still send.
func TestRelayHalfClose(t *testing.T) {
	t.Run("client first", func(t *testing.T) {
		rl := start(t, "unix", Options{}, nil)
		rl.client.Write([]byte("question"))
		rl.client.(*net.TCPConn).CloseWrite()
		if b, _ := io.ReadAll(rl.guest); string(b) != "question" {
			t.Fatalf("guest read %q", b)
		}
		rl.guest.Write([]byte("answer"))
		rl.guest.Close()
		if b, _ := io.ReadAll(rl.client); string(b) != "answer" {
			t.Fatalf("client read %q", b)
		}
		if res := rl.result(t, 5*time.Second); res.Reason != ReasonClient {
			t.Fatalf("%+v", res)
		}
	})
	t.Run("guest first", func(t *testing.T) {
		rl := start(t, "unix", Options{}, nil)
		rl.guest.Write([]byte("banner"))
		rl.guest.(*net.UnixConn).CloseWrite()
		if b, _ := io.ReadAll(rl.client); string(b) != "banner" {
			t.Fatalf("client read %q", b)
		}
		rl.client.Write([]byte("late"))
		rl.client.Close()
		if b, _ := io.ReadAll(rl.guest); string(b) != "late" {
			t.Fatalf("guest read %q", b)
		}
		if res := rl.result(t, 5*time.Second); res.Reason != ReasonGuest {
			t.Fatalf("%+v", res)
		}
	})
}

// fakeClock is Options.Now under the test's control.
type fakeClock struct{ ns atomic.Int64 }

func (c *fakeClock) now() time.Time          { return time.Unix(1e9, c.ns.Load()) }
func (c *fakeClock) advance(d time.Duration) { c.ns.Add(int64(d)) }

// After one side half-closed, the other direction runs for as long as it
// makes progress: a slow answer (or upload) that takes far longer than
// Drain, on the watch's clock and on the real one, arrives whole and ends
// cleanly. Drain once bounded the time since the half-close, and cut such a
// stream short with a FIN the client took for its end.
func TestRelayDrainWaitsForProgress(t *testing.T) {
	const (
		drain  = 400 * time.Millisecond // real time the old bound cut at
		chunks = 20
		pace   = 30 * time.Millisecond // real time between chunks: 600 ms in all
		step   = drain / 10            // watch's time between chunks: 2 s in all
	)
	for _, first := range []string{"client", "guest"} {
		t.Run(first+" first", func(t *testing.T) {
			clock := &fakeClock{}
			rl := start(t, "unix", Options{Drain: drain, Now: clock.now}, nil)
			// The side that ends first is the slow one's reader.
			from, to, want := rl.guest, rl.client, ReasonClient
			if first == "guest" {
				from, to, want = rl.client, rl.guest, ReasonGuest
			}
			to.(closeWriter).CloseWrite()
			if b, err := io.ReadAll(from); err != nil || len(b) != 0 {
				t.Fatalf("half-close not passed on: %q %v", b, err)
			}
			var sent []byte
			got := make([]byte, 0, chunks*8)
			for i := range chunks {
				chunk := fmt.Appendf(nil, "chunk%02d;", i)
				if _, err := from.Write(chunk); err != nil {
					t.Fatalf("chunk %d: %v", i, err)
				}
				sent = append(sent, chunk...)
				buf := make([]byte, len(chunk))
				if _, err := io.ReadFull(to, buf); err != nil {
					t.Fatalf("chunk %d arrived as %q: %v (the relay was cut)", i, append(got, buf...), err)
				}
				got = append(got, buf...)
				clock.advance(step)
				time.Sleep(pace) // the sender's pace: what it is slow at
			}
			from.(closeWriter).CloseWrite()
			if rest, err := io.ReadAll(to); err != nil || len(rest) != 0 {
				t.Fatalf("after the last chunk: %q %v", rest, err)
			}
			if !bytes.Equal(got, sent) {
				t.Fatalf("got %q, want %q", got, sent)
			}
			if res := rl.result(t, 5*time.Second); res.Reason != want {
				t.Fatalf("%+v, want reason %s", res, want)
			}
		})
	}
}

// A side that half-closes while the other stops moving is cut once
// nothing moved for Drain, and visibly: the client reads what did arrive,
// then a reset (not a clean end that would pass for the whole answer); the
// guest is closed, and the relay ends with ReasonDrain.
func TestRelayDrainCutsAStall(t *testing.T) {
	for _, partial := range []string{"", "the first half of an answer"} {
		t.Run(fmt.Sprintf("%d bytes before the stall", len(partial)), func(t *testing.T) {
			const drain = 400 * time.Millisecond
			clock := &fakeClock{}
			rl := start(t, "unix", Options{Drain: drain, Now: clock.now}, nil)
			rl.client.Write([]byte("question"))
			rl.client.(*net.TCPConn).CloseWrite()
			if b, _ := io.ReadAll(rl.guest); string(b) != "question" {
				t.Fatalf("guest read %q", b)
			}
			rl.guest.Write([]byte(partial)) // and then nothing
			buf := make([]byte, len(partial))
			if _, err := io.ReadFull(rl.client, buf); err != nil || string(buf) != partial {
				t.Fatalf("client read %q %v", buf, err)
			}
			// The watch's clock moves on until the watch notices the stall.
			deadline := time.Now().Add(10 * time.Second)
			var res Result
		wait:
			for {
				clock.advance(drain / 4)
				select {
				case res = <-rl.done:
					break wait
				case <-time.After(20 * time.Millisecond):
				}
				if time.Now().After(deadline) {
					t.Fatal("a stalled relay outlived its drain bound")
				}
			}
			if res.Reason != ReasonDrain {
				t.Fatalf("%+v, want reason %s", res, ReasonDrain)
			}
			if n, err := rl.client.Read(make([]byte, 1)); !errors.Is(err, syscall.ECONNRESET) {
				t.Fatalf("client read after the cut: %d, %v; want a reset", n, err)
			}
			if _, err := rl.guest.Read(make([]byte, 1)); err == nil {
				t.Fatal("guest still open")
			}
		})
	}
}

// A guest that goes away is an end of stream for the client, and the
// client's close then ends the relay.
func TestRelayGuestGoesAway(t *testing.T) {
	rl := start(t, "pipe", Options{}, nil)
	rl.guest.Close()
	if _, err := io.ReadAll(rl.client); err != nil {
		t.Fatalf("client read: %v", err)
	}
	rl.client.Close()
	if res := rl.result(t, 5*time.Second); res.Reason != ReasonGuest {
		t.Fatalf("%+v", res)
	}
}

// Nothing moving for Idle ends the relay, on the spliced path (the
// kernel's count) and the copying path; traffic keeps it open.
func TestRelayIdle(t *testing.T) {
	for _, kind := range []string{"unix", "pipe"} {
		t.Run(kind, func(t *testing.T) {
			idle := 150 * time.Millisecond
			rl := start(t, kind, Options{Idle: idle}, nil)
			go io.Copy(io.Discard, rl.guest)
			began := time.Now()
			for range 8 {
				if _, err := rl.client.Write([]byte("tick")); err != nil {
					t.Fatal(err)
				}
				time.Sleep(idle / 3)
			}
			select {
			case res := <-rl.done:
				t.Fatalf("ended while busy after %s: %+v", time.Since(began), res)
			default:
			}
			res := rl.result(t, 5*time.Second)
			if res.Reason != ReasonIdle || res.In != 32 {
				t.Fatalf("%+v", res)
			}
			if _, err := rl.client.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
				t.Fatalf("client read after idle end: %v", err)
			}
		})
	}
}

// Stop gives the client a clean end and records its reason.
func TestRelayStop(t *testing.T) {
	rl := start(t, "unix", Options{}, nil)
	rl.guest.Write([]byte("x"))
	buf := make([]byte, 1)
	if _, err := io.ReadFull(rl.client, buf); err != nil {
		t.Fatal(err)
	}
	rl.r.Stop("released")
	rl.r.Stop("shutdown")
	if n, err := rl.client.Read(buf); n != 0 || !errors.Is(err, io.EOF) {
		t.Fatalf("client read after stop: %d, %v", n, err)
	}
	rl.client.Close()
	if res := rl.result(t, 5*time.Second); res.Reason != "released" || res.Out != 1 {
		t.Fatalf("%+v", res)
	}
}

// The copying path allocates nothing per chunk: 64 MiB through it costs
// far less than one buffer per chunk would.
func TestRelayCopyingPathDoesNotAllocatePerChunk(t *testing.T) {
	const total = 64 << 20
	rl := start(t, "pipe", Options{}, nil)
	chunk := randomBytes(t, 64<<10)
	go io.Copy(io.Discard, rl.client)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	go func() {
		for sent := 0; sent < total; sent += len(chunk) {
			rl.client.Write(chunk)
		}
		rl.client.(*net.TCPConn).CloseWrite()
	}()
	n, _ := io.Copy(io.Discard, rl.guest)
	runtime.ReadMemStats(&after)
	rl.guest.Close()
	rl.result(t, 5*time.Second)
	if n != total {
		t.Fatalf("guest got %d bytes", n)
	}
	// 1024 chunks of 64 KiB: a buffer per chunk would be 64 MiB.
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 4<<20 {
		t.Fatalf("relaying %d bytes allocated %d bytes", total, grew)
	}
}

func TestSpliceable(t *testing.T) {
	tc, _ := tcpPair(t)
	uc, _ := unixPair(t)
	p, _ := net.Pipe()
	for _, tc := range []struct {
		dst, src net.Conn
		want     bool
	}{
		{tc, uc, true}, {uc, tc, true}, {tc, tc, true}, {uc, uc, false}, {p, tc, false}, {tc, p, false},
	} {
		if got := Spliceable(tc.dst, tc.src); got != tc.want {
			t.Errorf("Spliceable(%T, %T) = %v", tc.dst, tc.src, got)
		}
	}
}

// A client that dies (a reset, not a clean EOF) closes the guest at once.
func TestRelayClientReset(t *testing.T) {
	rl := start(t, "unix", Options{}, nil)
	rl.client.Write([]byte("x"))
	buf := make([]byte, 1)
	if _, err := io.ReadFull(rl.guest, buf); err != nil {
		t.Fatal(err)
	}
	rl.client.(*net.TCPConn).SetLinger(0)
	rl.client.Close()
	if _, err := io.ReadAll(rl.guest); err != nil {
		t.Fatalf("guest read: %v", err)
	}
	if res := rl.result(t, 5*time.Second); res.Reason != ReasonClient {
		t.Fatalf("%+v", res)
	}
}

// A unix socketpair (no address to tell its type) splices too.
func TestSpliceableSocketpair(t *testing.T) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fds[0]), "a")
	c, err := net.FileConn(f)
	f.Close()
	syscall.Close(fds[1])
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	tc, _ := tcpPair(t)
	if !Spliceable(tc, c) || !Spliceable(c, tc) {
		t.Fatal("socketpair end not spliceable")
	}
}
