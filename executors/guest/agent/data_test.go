package agent

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

func TestKeyVerb(t *testing.T) {
	s := newServer(t)
	if s.DataKey() != "" {
		t.Fatal("a fresh agent has a key")
	}
	k, err := NewKey()
	if err != nil || len(k) != KeyHexLen {
		t.Fatalf("NewKey = %q, %v", k, err)
	}
	for _, bad := range []string{"key", "key abc", "key " + strings.Repeat("g", KeyHexLen), "key " + k + " x"} {
		if got := s.Handle(bad); !strings.HasPrefix(got, "error key usage: key <64 hex digits>") {
			t.Errorf("Handle(%q) = %q", bad, got)
		}
	}
	if s.DataKey() != "" {
		t.Fatal("a refused key was kept")
	}
	c := pipe(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.SetKey(ctx, k); err != nil {
		t.Fatal(err)
	}
	if s.DataKey() != k {
		t.Fatalf("DataKey = %q after SetKey(%q)", s.DataKey(), k)
	}
	if err := c.SetKey(ctx, "short"); err == nil {
		t.Fatal("SetKey sent a malformed key")
	}
}

// acceptor runs AcceptData with key on every connection to a TCP listener
// and then echoes one line, so a test sees the handshake consumed nothing.
func acceptor(t *testing.T, key string) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
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
			go func() {
				defer c.Close()
				if err := AcceptData(c, key, time.Second); err != nil {
					return
				}
				line, err := bufio.NewReader(c).ReadString('\n')
				if err == nil {
					_, _ = io.WriteString(c, line)
				}
			}()
		}
	}()
	return l.Addr().String()
}

func TestDataHandshake(t *testing.T) {
	k, _ := NewKey()
	addr := acceptor(t, k)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := DialData(ctx, addr, k)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, "{\"v\":1,\"op\":\"info\"}\n"); err != nil {
		t.Fatal(err)
	}
	if line, err := bufio.NewReader(c).ReadString('\n'); err != nil || line != "{\"v\":1,\"op\":\"info\"}\n" {
		t.Fatalf("after the handshake: %q, %v", line, err)
	}

	other, _ := NewKey()
	if _, err := DialData(ctx, addr, other); !errors.Is(err, ErrDataRefused) {
		t.Fatalf("a wrong key = %v, want ErrDataRefused", err)
	}
	// An agent that was never given a key refuses everyone.
	if _, err := DialData(ctx, acceptor(t, ""), ""); !errors.Is(err, ErrDataRefused) {
		t.Fatalf("no key set = %v, want ErrDataRefused", err)
	}
	// A client that never authenticates is dropped after the timeout.
	raw, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	_ = raw.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := raw.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Fatalf("a silent client: %v, want the connection closed", err)
	}
	// The dial is bounded by its context.
	sctx, scancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer scancel()
	silent, _ := net.Listen("tcp", "127.0.0.1:0")
	defer silent.Close()
	if _, err := DialData(sctx, silent.Addr().String(), k); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a silent agent = %v, want the deadline", err)
	}
}
