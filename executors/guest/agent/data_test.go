package agent

import (
	"bufio"
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sbxlog/sbxlog/executors/guest/guesttest"
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
	if _, err := DialData(ctx, acceptor(t, ""), k); !errors.Is(err, ErrDataRefused) {
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

// recorder forwards every connection to target and keeps the bytes that
// crossed in both directions.
type recorder struct {
	mu   sync.Mutex
	wire bytes.Buffer
}

func (r *recorder) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.wire.Write(p)
}

func (r *recorder) bytes() []byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	return bytes.Clone(r.wire.Bytes())
}

func record(t *testing.T, target string) (string, *recorder) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	rec := &recorder{}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			go func() {
				_, _ = io.Copy(io.MultiWriter(up, rec), c)
				up.(*net.TCPConn).CloseWrite()
			}()
			go func() {
				_, _ = io.Copy(io.MultiWriter(c, rec), up)
				c.Close()
				up.Close()
			}()
		}
	}()
	return l.Addr().String(), rec
}

// The key never crosses the wire, in either form, in a handshake that
// succeeds or in one that fails.
func TestDataHandshakeKeepsKeyOffTheWire(t *testing.T) {
	k, _ := NewKey()
	other, _ := NewKey()
	addr, rec := record(t, acceptor(t, k))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := DialData(ctx, addr, k)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(c, "ping\n"); err != nil {
		t.Fatal(err)
	}
	if line, err := bufio.NewReader(c).ReadString('\n'); err != nil || line != "ping\n" {
		t.Fatalf("after the handshake: %q, %v", line, err)
	}
	c.Close()
	if _, err := DialData(ctx, addr, other); !errors.Is(err, ErrGuestUnproven) {
		t.Fatalf("a wrong host key = %v, want ErrGuestUnproven", err)
	}
	wire := rec.bytes()
	if !bytes.Contains(wire, []byte("ping")) {
		t.Fatalf("the recorder saw nothing: %q", wire)
	}
	for _, key := range []string{k, other} {
		raw, _ := hex.DecodeString(key)
		for _, form := range [][]byte{[]byte(key), []byte(strings.ToUpper(key)), raw} {
			if bytes.Contains(wire, form) {
				t.Fatalf("key %s on the wire: %q", key, wire)
			}
		}
	}
}

// A listener that cannot prove the key is refused, whatever it answers,
// and is sent nothing but the host's nonce.
func TestDataHandshakeRefusesUnprovenGuest(t *testing.T) {
	k, _ := NewKey()
	zero := strings.Repeat("0", 2*nonceLen)
	for _, answer := range []string{
		"OK\n",
		"OK\n{\"v\":1}\n",
		verbProof + " " + zero + " " + strings.Repeat("0", 2*macLen) + "\n",
		verbProof + " " + zero + "\n",
		"AUTH " + k + "\n",
	} {
		addr, got := guesttest.Squatter(t, answer)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		c, err := DialData(ctx, addr, k)
		cancel()
		if err == nil {
			c.Close()
			t.Fatalf("answer %q: the host accepted a guest that did not prove the key", answer)
		}
		if !errors.Is(err, ErrGuestUnproven) || !errors.Is(err, ErrDataRefused) {
			t.Fatalf("answer %q: %v, want ErrGuestUnproven", answer, err)
		}
		sent := <-got
		hello, ok := strings.CutPrefix(string(sent), verbHello+" ")
		if !ok || len(hello) != 2*nonceLen+1 || !strings.HasSuffix(hello, "\n") {
			t.Fatalf("answer %q: the host sent %q, want only its HELLO", answer, sent)
		}
	}
}

// A host that does not hold the agent's key is refused by the agent: it
// cannot answer the guest's proof with its own, and gets no OK.
func TestAcceptDataRefusesWrongHost(t *testing.T) {
	k, _ := NewKey()
	other, _ := NewKey()
	wrong, _ := decodeKey(other)
	for _, name := range []string{"wrong key", "reflected guest proof", "garbage"} {
		t.Run(name, func(t *testing.T) {
			host, guest := net.Pipe()
			t.Cleanup(func() { host.Close() })
			done := make(chan error, 1)
			go func() {
				err := AcceptData(guest, k, 5*time.Second)
				guest.Close()
				done <- err
			}()
			hn := make([]byte, nonceLen)
			if _, err := io.WriteString(host, verbHello+" "+hex.EncodeToString(hn)+"\n"); err != nil {
				t.Fatal(err)
			}
			br := bufio.NewReader(host)
			line, err := br.ReadString('\n')
			f := strings.Fields(line)
			if err != nil || len(f) != 3 || f[0] != verbProof {
				t.Fatalf("guest answered %q, %v", line, err)
			}
			gn, _ := hex.DecodeString(f[1])
			var reply string
			switch name {
			case "wrong key":
				reply = hex.EncodeToString(proof(wrong, labelHost, hn, gn))
			case "reflected guest proof":
				reply = f[2]
			default:
				reply = "x"
			}
			if _, err := io.WriteString(host, verbProof+" "+reply+"\n"); err != nil {
				t.Fatal(err)
			}
			if err := <-done; !errors.Is(err, ErrDataRefused) {
				t.Fatalf("AcceptData = %v, want ErrDataRefused", err)
			}
			if rest, _ := io.ReadAll(br); len(rest) != 0 {
				t.Fatalf("the guest answered %q to a host without the key", rest)
			}
		})
	}
}

// A malformed key is refused before anything is dialled or answered.
func TestDataHandshakeBadKey(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, bad := range []string{"", "short", strings.Repeat("g", KeyHexLen)} {
		if _, err := DialData(ctx, "127.0.0.1:1", bad); !errors.Is(err, ErrBadKey) {
			t.Errorf("DialData(key %q) = %v, want ErrBadKey", bad, err)
		}
		host, guest := net.Pipe()
		if err := AcceptData(guest, bad, time.Second); !errors.Is(err, ErrDataRefused) && !errors.Is(err, ErrBadKey) {
			t.Errorf("AcceptData(key %q) = %v", bad, err)
		}
		host.Close()
		guest.Close()
	}
}
