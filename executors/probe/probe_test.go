package probe

import (
	"bufio"
	"context"
	"errors"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// fakeVsock plays Cloud Hypervisor's side of the hybrid-vsock socket: it reads the
// CONNECT line and lets answer decide what the n-th connection (from 1) gets.
type fakeVsock struct {
	path  string
	conns atomic.Int32
	mu    sync.Mutex
	lines []string
}

// answers
const (
	hangUp = "" // guest not listening: close without answering
	stall  = "\x00stall"
)

func listen(t *testing.T, path string, answer func(n int) string) *fakeVsock {
	t.Helper()
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeVsock{path: path}
	var wg sync.WaitGroup
	done := make(chan struct{})
	t.Cleanup(func() {
		close(done)
		l.Close()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			n := int(f.conns.Add(1))
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				line, err := bufio.NewReader(c).ReadString('\n')
				if err != nil {
					return
				}
				f.mu.Lock()
				f.lines = append(f.lines, line)
				f.mu.Unlock()
				switch a := answer(n); a {
				case hangUp:
				case stall:
					// Keep the connection open until the client gives up or the
					// test ends, as a VMM waiting on a silent guest does.
					buf := make([]byte, 1)
					go func() { <-done; c.Close() }()
					_, _ = c.Read(buf)
				default:
					_, _ = c.Write([]byte(a))
				}
			}()
		}
	}()
	return f
}

func (f *fakeVsock) connectLines() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.lines...)
}

func sockPath(t *testing.T) string { return filepath.Join(t.TempDir(), "vsock.sock") }

func TestVsockAnswered(t *testing.T) {
	cases := []struct {
		name     string
		answer   func(n int) string
		attempts int
	}{
		{"at once", func(int) string { return "OK 1073741824\n" }, 1},
		{"guest agent up on the 4th try", func(n int) string {
			if n < 4 {
				return hangUp
			}
			return "OK 5\n"
		}, 4},
		{"garbage before OK", func(n int) string {
			if n == 1 {
				return "ERR nope\n"
			}
			if n == 2 {
				return "OKAY\n"
			}
			return "OK 7\n"
		}, 3},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := listen(t, sockPath(t), tc.answer)
			var failures []int
			res, err := Vsock(context.Background(), f.path, 1024, Options{
				Timeout:   10 * time.Second,
				OnAttempt: func(n int, err error) { failures = append(failures, n) },
			})
			if err != nil {
				t.Fatal(err)
			}
			if res.Attempts != tc.attempts || len(failures) != tc.attempts-1 {
				t.Fatalf("attempts %d (failures reported %v), want %d", res.Attempts, failures, tc.attempts)
			}
			for _, l := range f.connectLines() {
				if l != "CONNECT 1024\n" {
					t.Fatalf("sent %q, want CONNECT 1024", l)
				}
			}
			if got := int(f.conns.Load()); got != tc.attempts {
				t.Fatalf("fake saw %d connections, want %d", got, tc.attempts)
			}
		})
	}
}

// The VMM creates the socket only once it runs: the probe keeps dialling until it
// appears.
func TestVsockSocketAppearsLate(t *testing.T) {
	path := sockPath(t)
	var f *fakeVsock
	res, err := Vsock(context.Background(), path, 52, Options{
		Timeout: 10 * time.Second,
		OnAttempt: func(n int, err error) {
			if n == 2 {
				f = listen(t, path, func(int) string { return "OK 1\n" })
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Attempts != 3 || f.conns.Load() != 1 {
		t.Fatalf("attempts %d, connections %d; want 3 attempts, 1 connection", res.Attempts, f.conns.Load())
	}
}

func TestVsockGivesUp(t *testing.T) {
	cases := []struct {
		name   string
		answer func(int) string
		last   string
	}{
		{"guest never listens", func(int) string { return hangUp }, "no answer"},
		{"wrong answer", func(int) string { return "ERR refused\n" }, "ERR refused"},
		{"silent guest", func(int) string { return stall }, "deadline exceeded"},
		{"endless answer", func(int) string { return strings.Repeat("O", 200) }, "too long"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := listen(t, sockPath(t), tc.answer)
			res, err := Vsock(context.Background(), f.path, 1024, Options{
				Timeout: 300 * time.Millisecond, AttemptTimeout: 50 * time.Millisecond,
			})
			if !errors.Is(err, ErrNotReady) || !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("err = %v, want ErrNotReady and DeadlineExceeded", err)
			}
			if !strings.Contains(err.Error(), tc.last) {
				t.Fatalf("err %q does not carry the last failure %q", err, tc.last)
			}
			if res.Attempts < 2 {
				t.Fatalf("gave up after %d attempt(s), want retries", res.Attempts)
			}
		})
	}
	// No socket at all.
	res, err := Vsock(context.Background(), sockPath(t), 1024, Options{Timeout: 100 * time.Millisecond})
	if !errors.Is(err, ErrNotReady) || res.Attempts < 2 {
		t.Fatalf("missing socket: %+v, %v", res, err)
	}
}

func TestVsockCancel(t *testing.T) {
	f := listen(t, sockPath(t), func(int) string { return stall })
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := Vsock(ctx, f.path, 1024, Options{})
		errc <- err
	}()
	// Cancel while an attempt is blocked on the silent guest.
	for f.conns.Load() == 0 {
		select {
		case err := <-errc:
			t.Fatalf("probe ended before connecting: %v", err)
		case <-time.After(time.Millisecond):
		}
	}
	cancel()
	select {
	case err := <-errc:
		if !errors.Is(err, context.Canceled) || !errors.Is(err, ErrNotReady) {
			t.Fatalf("err = %v, want Canceled", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("probe did not stop on cancel")
	}
}

func TestReady(t *testing.T) {
	f := listen(t, sockPath(t), func(int) string { return "OK 9\n" })
	var checks atomic.Int32
	running := func(ctx context.Context) (bool, error) {
		// Running from the third vm.info on; the guest must not be dialled before.
		if f.conns.Load() != 0 {
			t.Error("vsock dialled before the VM was running")
		}
		return checks.Add(1) >= 3, nil
	}
	res, err := Ready(context.Background(), running, f.path, 1024, Options{Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if res.RunningChecks != 3 || res.Attempts != 1 {
		t.Fatalf("result %+v, want 3 running checks and 1 attempt", res)
	}
}

func TestReadyStopsOnStateError(t *testing.T) {
	f := listen(t, sockPath(t), func(int) string { return "OK 9\n" })
	gone := errors.New("vmm socket refused")
	res, err := Ready(context.Background(), func(context.Context) (bool, error) { return false, gone },
		f.path, 1024, Options{Timeout: 10 * time.Second})
	if !errors.Is(err, gone) || errors.Is(err, ErrNotReady) {
		t.Fatalf("err = %v, want the state error, not a timeout", err)
	}
	if res.RunningChecks != 1 || res.Attempts != 0 || f.conns.Load() != 0 {
		t.Fatalf("result %+v, %d connections; want one check and no dial", res, f.conns.Load())
	}

	res, err = Ready(context.Background(), func(context.Context) (bool, error) { return false, nil },
		f.path, 1024, Options{Timeout: 100 * time.Millisecond})
	if !errors.Is(err, ErrNotReady) || res.RunningChecks < 2 || res.Attempts != 0 {
		t.Fatalf("never running: %+v, %v; want ErrNotReady after several checks", res, err)
	}
}

func TestInvalid(t *testing.T) {
	ctx := context.Background()
	ok := func(context.Context) (bool, error) { return true, nil }
	for name, err := range map[string]error{
		"Connect empty path": Connect(ctx, "", 1),
		"Vsock empty path":   second(Vsock(ctx, "", 1, Options{})),
		"Ready nil func":     second(Ready(ctx, nil, "/x", 1, Options{})),
		"Ready empty path":   second(Ready(ctx, ok, "", 1, Options{})),
	} {
		if !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, err)
		}
	}
}

func second(_ Result, err error) error { return err }

// TestReadyConnKeepsTheConnection: ReadyConn hands back the successful
// handshake's connection, open and past the attempt's deadline (the agent
// answers later than AttemptTimeout), and closes the failed attempts'.
func TestReadyConnKeepsTheConnection(t *testing.T) {
	path := sockPath(t)
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	closedFirst := make(chan struct{})
	go func() {
		// The first connection is refused (hang up), the second answered;
		// the agent's line comes after the attempt's deadline has passed.
		for n := 1; ; n++ {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				if _, err := bufio.NewReader(c).ReadString('\n'); err != nil {
					return
				}
				if n == 1 {
					close(closedFirst)
					return
				}
				_, _ = c.Write([]byte("OK 9\n"))
				time.Sleep(150 * time.Millisecond)
				_, _ = c.Write([]byte("agent says hi\n"))
				_, _ = c.Read(make([]byte, 1)) // until the client closes
			}()
		}
	}()
	running := func(context.Context) (bool, error) { return true, nil }
	c, res, err := ReadyConn(context.Background(), running, path, 1024, Options{Timeout: 10 * time.Second, AttemptTimeout: 50 * time.Millisecond, Interval: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	<-closedFirst
	if res.Attempts != 2 {
		t.Fatalf("result %+v, want 2 attempts", res)
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil || line != "agent says hi\n" {
		t.Fatalf("read %q, %v from the kept connection; want the agent's line", line, err)
	}
}

func TestReadyConnFails(t *testing.T) {
	f := listen(t, sockPath(t), func(int) string { return hangUp })
	running := func(context.Context) (bool, error) { return true, nil }
	c, _, err := ReadyConn(context.Background(), running, f.path, 1024, Options{Timeout: 100 * time.Millisecond})
	if !errors.Is(err, ErrNotReady) || c != nil {
		t.Fatalf("ReadyConn = %v, %v; want no connection and ErrNotReady", c, err)
	}
}
