package agent

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	"github.com/sbxlog/sbxlog/executors/handshake"
)

// The data plane's handshake lines.
const (
	authPrefix = "AUTH "
	authOK     = "OK"
	// maxAuthLine bounds a handshake line: "AUTH " and the key.
	maxAuthLine = len(authPrefix) + KeyHexLen + 1
)

// ErrDataRefused: the agent closed a data connection instead of answering
// OK (wrong key, or it was never given one), or answered something else.
var ErrDataRefused = errors.New("agent: data connection refused")

// NewKey returns a fresh data-plane key.
func NewKey() (string, error) {
	b := make([]byte, KeyHexLen/2)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return hex.EncodeToString(b), nil
}

func validKey(k string) bool {
	if len(k) != KeyHexLen {
		return false
	}
	_, err := hex.DecodeString(k)
	return err == nil
}

// readHandshakeLine reads one handshake line of at most max bytes without reading
// past it (package executors/handshake), a trailing "\r" dropped.
func readHandshakeLine(c net.Conn, max int) (string, error) {
	line, err := handshake.ReadLine(c, max)
	if err != nil {
		return "", err
	}
	return strings.TrimSuffix(string(line), "\r"), nil
}

// DialData connects to the agent's data plane at addr (TCP) and does the
// handshake with key. ctx bounds both; the connection returned has no
// deadline and carries silkd frames from its first byte.
func DialData(ctx context.Context, addr, key string) (*net.TCPConn, error) {
	var d net.Dialer
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	c := nc.(*net.TCPConn)
	if err := dataHandshake(ctx, c, key); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

func dataHandshake(ctx context.Context, c *net.TCPConn, key string) error {
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	if _, err := c.Write([]byte(authPrefix + key + "\n")); err != nil {
		return fmt.Errorf("agent: data handshake: %w", ctxFirst(ctx, err))
	}
	line, err := readHandshakeLine(c, len(authOK)+1)
	if err != nil {
		if cerr := ctx.Err(); cerr != nil {
			return fmt.Errorf("agent: data handshake: %w", cerr)
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			// The deadline is the context's, which may not report it yet.
			return fmt.Errorf("agent: data handshake: %w (%w)", context.DeadlineExceeded, err)
		}
		return fmt.Errorf("%w: %w", ErrDataRefused, err)
	}
	if line != authOK {
		return fmt.Errorf("%w: answered %q", ErrDataRefused, line)
	}
	return c.SetDeadline(time.Time{})
}

func ctxFirst(ctx context.Context, err error) error {
	if cerr := ctx.Err(); cerr != nil {
		return cerr
	}
	return err
}

// AcceptData runs the agent's side of the handshake on a new data
// connection: within timeout the host must send "AUTH <key>" with the key
// currently set (key "" refuses everyone). On success it answers OK and
// clears the deadline; on failure the caller closes c.
func AcceptData(c net.Conn, key string, timeout time.Duration) error {
	_ = c.SetDeadline(time.Now().Add(timeout))
	line, err := readHandshakeLine(c, maxAuthLine)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrDataRefused, err)
	}
	got, ok := strings.CutPrefix(line, authPrefix)
	if !ok || key == "" || subtle.ConstantTimeCompare([]byte(got), []byte(key)) != 1 {
		return fmt.Errorf("%w: bad key", ErrDataRefused)
	}
	if _, err := c.Write([]byte(authOK + "\n")); err != nil {
		return err
	}
	return c.SetDeadline(time.Time{})
}
