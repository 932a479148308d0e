// Package handshake reads the text lines that open a stream before another
// protocol takes it over: hybrid vsock's "OK <port>" answer (package
// executors/hvsock) and the data plane's challenge-response on QEMU's agent
// network (package executors/guest/agent).
//
// Contract of ReadLine: it reads one byte per Read call up to and including
// the line's "\n", never past it, so the caller can hand the raw connection
// (and its kernel fast paths, such as splice) to the protocol that follows,
// positioned at its first byte. A line is bounded: more than max bytes
// before the "\n" is ErrLineTooLong. The line is returned without its "\n"
// (a "\r" before it is kept: the callers' protocols say whether it counts).
package handshake

import (
	"errors"
	"fmt"
	"io"
)

// ErrLineTooLong: the peer sent more than the bound before a newline.
var ErrLineTooLong = errors.New("handshake: line too long")

// ReadLine reads one "\n"-terminated line of at most max bytes (the
// newline not counted) from r without reading past it. On an error it
// returns what it read so far: the first max bytes with ErrLineTooLong
// (wrapped), or the partial line with r's error (as is, so callers can
// test it for io.EOF or a deadline).
func ReadLine(r io.Reader, max int) ([]byte, error) {
	buf := make([]byte, 0, max)
	var b [1]byte
	for {
		n, err := r.Read(b[:])
		if n == 1 {
			if b[0] == '\n' {
				return buf, nil
			}
			if len(buf) == max {
				return buf, fmt.Errorf("%w (more than %d bytes)", ErrLineTooLong, max)
			}
			buf = append(buf, b[0])
		}
		if err != nil {
			return buf, err
		}
	}
}
