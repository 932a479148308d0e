package guesttest

import (
	"io"
	"net"
	"testing"
	"time"

	"github.com/sbxlog/sbxlog/executors/handshake"
)

// Squatter listens on a loopback port where a guest's data plane would be,
// as a local process that bound the port of a dead VM: it accepts one
// connection, reads the client's first line, writes answer whatever it was,
// and sends on the channel everything the client sent it (until the client
// closed, or 10 s). A host that authenticates its guest must send it
// nothing past its first line.
func Squatter(t testing.TB, answer string) (addr string, sent <-chan []byte) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	got := make(chan []byte, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		first, err := handshake.ReadLine(c, 4096)
		if err == nil {
			first = append(first, '\n')
			_, _ = io.WriteString(c, answer)
		}
		rest, _ := io.ReadAll(c)
		got <- append(first, rest...)
	}()
	return l.Addr().String(), got
}
