package hvsock

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// vmm plays the VMM's side of the socket: it reads the CONNECT line, checks
// it, and writes answer (then keeps the connection open until the test ends,
// unless close is set).
func vmm(t *testing.T, answer string, close bool) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "hvsock")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	path := filepath.Join(dir, "v.sock")
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { c.Close() })
			go func() {
				line, err := bufio.NewReader(c).ReadString('\n')
				if err != nil || line != "CONNECT 2048\n" {
					t.Errorf("VMM read %q, %v", line, err)
					c.Close()
					return
				}
				_, _ = io.WriteString(c, answer)
				if close {
					c.Close()
				}
			}()
		}
	}()
	return path
}

// The answer is consumed to its newline and no further: what the guest
// sent in the same packet is the connection's first data.
func TestDialKeepsGuestBytes(t *testing.T) {
	path := vmm(t, "OK 1073741825\n{\"type\":\"info\"}\n", false)
	deadline := time.Now().Add(time.Second)
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	c, err := Dial(ctx, path, 2048)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cancel()
	time.Sleep(time.Until(deadline) + 50*time.Millisecond) // past the dial's deadline: the connection has none
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil || line != "{\"type\":\"info\"}\n" {
		t.Fatalf("first guest line %q, %v", line, err)
	}
}

func TestDialFailures(t *testing.T) {
	tests := []struct {
		name    string
		answer  string
		close   bool
		refused bool
		msg     string
	}{
		{"nothing listens", "", true, true, "no answer"},
		{"wrong answer", "ERR nope\n", false, true, `"ERR nope"`},
		{"endless answer", strings.Repeat("O", 100), false, true, "too long"},
		{"answer cut short", "OK 12", true, true, "no answer"},
		{"silent guest", "", false, false, "deadline exceeded"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			// Only the silent guest waits for the deadline; the others answer
			// at once, and a loaded machine must not turn them into timeouts.
			timeout := 5 * time.Second
			if !tc.refused {
				timeout = 200 * time.Millisecond
			}
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			c, err := Dial(ctx, vmm(t, tc.answer, tc.close), 2048)
			if err == nil {
				c.Close()
				t.Fatal("Dial succeeded")
			}
			if errors.Is(err, ErrRefused) != tc.refused || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("err = %v (refused %v), want refused %v and %q", err, errors.Is(err, ErrRefused), tc.refused, tc.msg)
			}
			if !tc.refused && !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("err = %v, want the context's deadline", err)
			}
		})
	}
	ctx, cancel := context.WithCancel(context.Background())
	path := vmm(t, "", false)
	go func() { time.Sleep(30 * time.Millisecond); cancel() }()
	if _, err := Dial(ctx, path, 2048); !errors.Is(err, context.Canceled) || errors.Is(err, ErrRefused) {
		t.Fatalf("canceled Dial = %v", err)
	}
	if _, err := Dial(context.Background(), filepath.Join(t.TempDir(), "absent"), 2048); err == nil || errors.Is(err, ErrRefused) {
		t.Fatalf("Dial of a missing socket = %v", err)
	}
}
