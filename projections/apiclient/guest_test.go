package apiclient

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"testing"
	"time"
)

// fakeUpgrader accepts one connection, records the request head and
// answers with answer.
func fakeUpgrader(t *testing.T, answer string) (addr string, head <-chan string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	ch := make(chan string, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		br := bufio.NewReader(c)
		var req string
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				return
			}
			req += line
			if line == "\r\n" {
				break
			}
		}
		ch <- req
		io.WriteString(c, answer)
		io.Copy(io.Discard, c)
	}()
	return ln.Addr().String(), ch
}

// The upgrade request is the old SDK's, header for header; bytes behind
// the 101 are the connection's first reads.
func TestDialAgentRequestAndBytesBehindThe101(t *testing.T) {
	addr, head := fakeUpgrader(t, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: silkd\r\nConnection: Upgrade\r\n\r\n{\"type\":\"info\"}\n")
	c, err := New(addr, "sbt_tok", nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := c.DialAgent(ctx, "sb_0123456789abcdef")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	want := "GET /v1/sandboxes/sb_0123456789abcdef/agent HTTP/1.1\r\nHost: " + addr + "\r\nConnection: Upgrade\r\nUpgrade: silkd\r\nAuthorization: Bearer sbt_tok\r\n\r\n"
	if got := <-head; got != want {
		t.Fatalf("request\n%q\nwant\n%q", got, want)
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil || line != "{\"type\":\"info\"}\n" {
		t.Fatalf("first read %q, %v", line, err)
	}
	if _, ok := conn.(interface{ CloseWrite() error }); !ok {
		t.Fatal("the upgraded connection cannot half-close")
	}
}

// A refusal is an *Error with the server's status and message.
func TestDialPortRefused(t *testing.T) {
	addr, head := fakeUpgrader(t, "HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\nContent-Length: 29\r\n\r\n{\"error\":\"unknown sandbox\"}\r\n")
	c, _ := New(addr, "sbt_tok", nil)
	_, err := c.DialPort(context.Background(), "sb_0123456789abcdef", 8080)
	if StatusOf(err) != http.StatusNotFound {
		t.Fatalf("err %v", err)
	}
	if e := err.(*Error); e.Message != "unknown sandbox" || e.Path != "/v1/sandboxes/sb_0123456789abcdef/ports/8080" {
		t.Fatalf("%+v", e)
	}
	if got := <-head; got != "GET /v1/sandboxes/sb_0123456789abcdef/ports/8080 HTTP/1.1\r\nHost: "+addr+"\r\nConnection: Upgrade\r\nUpgrade: tcp\r\nAuthorization: Bearer sbt_tok\r\n\r\n" {
		t.Fatalf("request %q", got)
	}
}
