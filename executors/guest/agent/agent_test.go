package agent

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// seeded is a deterministic byte source, so expected sums can be computed.
type seeded struct{ r *rand.ChaCha8 }

func (s seeded) Read(p []byte) (int, error) { return s.r.Read(p) }

func newServer(t *testing.T) *Server {
	t.Helper()
	return &Server{
		DataPath: filepath.Join(t.TempDir(), "data"),
		BootID:   "b00t",
		Rand:     seeded{rand.NewChaCha8([32]byte{1})},
		Uptime:   func() (time.Duration, error) { return 1500 * time.Millisecond, nil },
	}
}

func sumOf(n int) string {
	b := make([]byte, n)
	_, _ = rand.NewChaCha8([32]byte{1}).Read(b)
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func TestHandle(t *testing.T) {
	empty := sha256.Sum256(nil)
	tests := []struct {
		name, req, want string
		prefix          bool // want is a prefix only
	}{
		{"ready", "ready", "ready", false},
		{"ready tagged", "#7 ready", "=7 ready", false},
		{"ready crlf-trimmed spaces", "  ready  ", "ready", false},
		{"ready with args", "ready now", "error ready usage: ready", false},
		{"sha without data", "sha", "error sha open ", true},
		{"write", "write 1000", "sha " + sumOf(1000), false},
		{"write zero", "#x write 0", "=x sha " + hex.EncodeToString(empty[:]), false},
		{"write negative", "write -1", "error write bad size \"-1\"", true},
		{"write too big", "write 999999999999", "error write bad size", true},
		{"write not a number", "write lots", "error write bad size \"lots\"", true},
		{"write missing size", "write", "error write usage: write <bytes>", false},
		{"uptime", "#u uptime", "=u uptime 1500000000 0 b00t", false},
		{"unknown", "reboot", "error reboot unknown command", true},
		{"tag only", "#9", "=9 error - empty request", false},
		{"bare hash is no tag", "# ready", "error # unknown command", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := newServer(t).Handle(tc.req)
			if tc.prefix && !strings.HasPrefix(got, tc.want) || !tc.prefix && got != tc.want {
				t.Fatalf("Handle(%q) = %q, want %q (prefix %v)", tc.req, got, tc.want, tc.prefix)
			}
		})
	}
}

// A server without a data file or an uptime (chsim's simulated guest, which
// runs on the host) refuses the verbs that would need them, and never
// creates a file in its working directory.
func TestHandleWithoutDataOrUptime(t *testing.T) {
	t.Chdir(t.TempDir())
	s := &Server{BootID: "sim"}
	for req, want := range map[string]string{
		"write 10": "error write unknown command",
		"sha":      "error sha unknown command",
		"uptime":   "error uptime unknown command",
		"#r ready": "=r ready",
	} {
		if got := s.Handle(req); !strings.HasPrefix(got, want) {
			t.Errorf("Handle(%q) = %q, want %q...", req, got, want)
		}
	}
	if ents, err := os.ReadDir("."); err != nil || len(ents) != 0 {
		t.Fatalf("working dir holds %v (%v), want nothing", ents, err)
	}
}

func TestWriteThenShaAndCounter(t *testing.T) {
	s := newServer(t)
	w := s.Handle("write 4096")
	if got := s.Handle("sha"); got != w {
		t.Fatalf("sha = %q after write answered %q", got, w)
	}
	if _, err := os.Stat(s.DataPath + ".tmp"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("temp file left: %v", err)
	}
	for range 3 {
		s.Count()
	}
	if got := s.Handle("uptime"); got != "uptime 1500000000 3 b00t" {
		t.Fatalf("uptime = %q", got)
	}
}

// pipe runs a Server on one end of an in-memory connection and returns a Client on
// the other.
func pipe(t *testing.T, s *Server) *Client {
	t.Helper()
	host, guest := net.Pipe()
	t.Cleanup(func() { host.Close(); guest.Close() })
	go func() { _ = s.Serve(guest, guest) }()
	return NewClient(host)
}

func TestClientAgainstServer(t *testing.T) {
	s := newServer(t)
	c := pipe(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Ready(ctx); err != nil {
		t.Fatal(err)
	}
	sum, err := c.Write(ctx, 1<<16)
	if err != nil || sum != sumOf(1<<16) {
		t.Fatalf("Write = %q, %v; want %q", sum, err, sumOf(1<<16))
	}
	if got, err := c.Sha(ctx); err != nil || got != sum {
		t.Fatalf("Sha = %q, %v", got, err)
	}
	s.Count()
	up, err := c.Uptime(ctx)
	if err != nil || up != (Uptime{Since: 1500 * time.Millisecond, Counter: 1, BootID: "b00t"}) {
		t.Fatalf("Uptime = %+v, %v", up, err)
	}
	_, err = c.Write(ctx, MaxWrite+1)
	var re *RemoteError
	if !errors.As(err, &re) || re.Verb != VerbWrite {
		t.Fatalf("oversized Write = %v, want RemoteError on write", err)
	}
}

// fakeGuest answers a request with the given lines (with {tag} replaced).
func fakeGuest(t *testing.T, lines ...string) *Client {
	t.Helper()
	host, guest := net.Pipe()
	t.Cleanup(func() { host.Close(); guest.Close() })
	go func() {
		br := bufio.NewReader(guest)
		for {
			req, err := br.ReadString('\n')
			if err != nil {
				return
			}
			token := strings.TrimPrefix(strings.Fields(req)[0], "#")
			for _, l := range lines {
				l = strings.ReplaceAll(l, "{echo}", strings.TrimSpace(req))
				if _, err := io.WriteString(guest, strings.ReplaceAll(l, "{tag}", "="+token)+"\n"); err != nil {
					return
				}
			}
		}
	}()
	return NewClient(host)
}

func TestClientSkipsNoiseAndStaleAnswers(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c := fakeGuest(t,
		"[    3.1] random: crng init done",
		"#1 ready",                      // an untagged-era or foreign answer
		"#deadbeef.1 sha "+sumOf(1),     // a previous client's answer
		strings.Repeat("x", MaxLine+10), // line noise longer than a line
		"{tag} sha "+strings.Repeat("ab", 32),
	)
	got, err := c.Sha(ctx)
	if err != nil || got != strings.Repeat("ab", 32) {
		t.Fatalf("Sha = %q, %v", got, err)
	}
}

func TestClientRejectsMalformedAnswers(t *testing.T) {
	tests := []struct {
		name, line string
		call       func(context.Context, *Client) error
	}{
		{"sha not hex", "{tag} sha zz", func(ctx context.Context, c *Client) error { _, err := c.Sha(ctx); return err }},
		{"sha short", "{tag} sha abcd", func(ctx context.Context, c *Client) error { _, err := c.Sha(ctx); return err }},
		{"wrong verb", "{tag} ready", func(ctx context.Context, c *Client) error { _, err := c.Sha(ctx); return err }},
		{"verb prefix", "{tag} readyx", func(ctx context.Context, c *Client) error { return c.Ready(ctx) }},
		{"uptime fields", "{tag} uptime 1 2", func(ctx context.Context, c *Client) error { _, err := c.Uptime(ctx); return err }},
		{"uptime number", "{tag} uptime x 2 b", func(ctx context.Context, c *Client) error { _, err := c.Uptime(ctx); return err }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			err := tc.call(ctx, fakeGuest(t, tc.line))
			var re *RemoteError
			if err == nil || errors.As(err, &re) {
				t.Fatalf("err = %v, want a local parse error", err)
			}
		})
	}
}

func TestClientHonoursContext(t *testing.T) {
	c := fakeGuest(t) // never answers
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := c.Ready(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Ready = %v, want deadline exceeded", err)
	}
	ctx2, cancel2 := context.WithCancel(context.Background())
	cancel2()
	if err := c.Ready(ctx2); !errors.Is(err, context.Canceled) {
		t.Fatalf("Ready with canceled ctx = %v", err)
	}
}

func TestServeSurvivesOverlongLines(t *testing.T) {
	s := newServer(t)
	in := strings.Repeat("y", 3*MaxLine) + "\nready\r\n\n#2 ready\n"
	var out bytes.Buffer
	if err := s.Serve(strings.NewReader(in), &out); err != nil {
		t.Fatal(err)
	}
	if got := out.String(); got != "error - line too long\nready\n=2 ready\n" {
		t.Fatalf("Serve wrote %q", got)
	}
}

// WaitReady keeps asking until the agent answers: the guest's serial port drops
// what arrives before the agent opened it.
func TestWaitReady(t *testing.T) {
	path := filepath.Join(t.TempDir(), "agent.sock")
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	var asked atomic.Int32
	s := newServer(t)
	go func() {
		conn, err := l.Accept()
		if err != nil {
			return
		}
		defer conn.Close()
		br := bufio.NewReader(conn)
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				return
			}
			// The first two requests are lost, as if the guest were still booting.
			if asked.Add(1) <= 2 {
				continue
			}
			if _, err := io.WriteString(conn, s.Handle(strings.TrimSpace(line))+"\n"); err != nil {
				return
			}
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := WaitReady(ctx, path, 20*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if n := asked.Load(); n < 3 {
		t.Fatalf("ready after %d requests, want >= 3", n)
	}
	if err := c.Ready(ctx); err != nil {
		t.Fatalf("client from WaitReady: %v", err)
	}
}

func TestWaitReadyGivesUp(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err := WaitReady(ctx, filepath.Join(t.TempDir(), "absent.sock"), 20*time.Millisecond)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WaitReady on a missing socket = %v", err)
	}
}

// Until the agent has put its port in raw mode the guest kernel echoes requests; an
// echo must never pass for an answer.
func TestEchoIsNoAnswer(t *testing.T) {
	c := fakeGuest(t, "{echo}")
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := c.Ready(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Ready against an echoing port = %v, want deadline exceeded", err)
	}
}
