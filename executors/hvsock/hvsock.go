// Package hvsock is the host side of Cloud Hypervisor's hybrid vsock: a VM's
// vsock device is a unix socket on the host; a client connects to it, writes
// "CONNECT <port>\n", and once a guest listener on that port has accepted,
// the VMM answers "OK <host port>\n" and the connection carries the guest
// stream from then on. If nothing listens on the port the VMM closes the
// connection instead.
//
// Contract of Dial:
//   - The answer is read one byte at a time up to its newline (at most
//     MaxAnswer bytes, with package executors/handshake), so nothing the guest sends after it is consumed: the
//     returned connection is the raw *net.UnixConn, positioned at the guest's
//     first byte, and keeps the kernel fast paths (splice) a relay uses.
//   - ctx bounds the dial and the handshake (its deadline becomes the
//     connection's for that time, and its end closes the connection); the
//     returned connection has no deadline.
//   - Failures wrap ErrRefused when the VMM answered and refused (closed the
//     connection, or answered anything but "OK "), or are the dial's error;
//     a context that ended is reported as the context's error.
package hvsock

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"time"

	"github.com/sbxlog/sbxlog/executors/handshake"
)

// MaxAnswer bounds the VMM's answer line; a real one is "OK " and a port.
const MaxAnswer = 64

// ErrRefused: the VMM answered the CONNECT with something other than OK
// (nothing listens on the port in the guest, or the guest is not up).
var ErrRefused = errors.New("hvsock: connect refused")

// Dial connects to guest port through the hybrid vsock socket.
func Dial(ctx context.Context, socket string, port uint32) (*net.UnixConn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", socket)
	if err != nil {
		return nil, err
	}
	conn := c.(*net.UnixConn)
	if err := connect(ctx, conn, port); err != nil {
		conn.Close()
		return nil, err
	}
	return conn, nil
}

func connect(ctx context.Context, conn *net.UnixConn, port uint32) error {
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	// Closing on cancel unblocks a read the deadline does not cover.
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	req := strconv.AppendUint([]byte("CONNECT "), uint64(port), 10)
	if _, err := conn.Write(append(req, '\n')); err != nil {
		return fmt.Errorf("send CONNECT %d: %w", port, ctxErr(ctx, err))
	}
	// The answer and its newline fit in MaxAnswer bytes.
	line, err := handshake.ReadLine(conn, MaxAnswer-1)
	if errors.Is(err, handshake.ErrLineTooLong) {
		return fmt.Errorf("%w: answer to CONNECT %d too long: %q", ErrRefused, port, line)
	}
	if err != nil {
		if cerr := ctx.Err(); cerr != nil {
			return fmt.Errorf("no answer to CONNECT %d: %w", port, cerr)
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			// The deadline is the context's, and may fire a moment
			// before the context reports it.
			return fmt.Errorf("no answer to CONNECT %d: %w (%w)", port, context.DeadlineExceeded, err)
		}
		return fmt.Errorf("%w: no answer to CONNECT %d: %w", ErrRefused, port, err)
	}
	if !bytes.HasPrefix(line, []byte("OK ")) {
		return fmt.Errorf("%w: answer to CONNECT %d: %q", ErrRefused, port, bytes.TrimSpace(line))
	}
	if err := conn.SetDeadline(time.Time{}); err != nil {
		return err
	}
	return nil
}

// ctxErr prefers the context's reason over the I/O error it caused.
func ctxErr(ctx context.Context, err error) error {
	if cerr := ctx.Err(); cerr != nil {
		return cerr
	}
	return err
}
