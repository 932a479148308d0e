package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/sbxlog/sbxlog/executors/guest/guesttest"
	"github.com/sbxlog/sbxlog/executors/guest/silkd"
	"github.com/sbxlog/sbxlog/projections/api"
	"github.com/sbxlog/sbxlog/projections/apiclient"
)

// sdkAgent opens the agent relay the way the newest old SDKs do over plain
// HTTP: the upgrade request and the first frame in one write, the answer
// read after. It returns the connection with the first frame's answer
// still unread.
func sdkAgent(t *testing.T, ctx context.Context, addr, id, token string, first silkd.Request) *silkd.Conn {
	t.Helper()
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	frame, err := silkd.AppendRequest(nil, first)
	if err != nil {
		t.Fatal(err)
	}
	req := "GET /v1/sandboxes/" + id + "/agent HTTP/1.1\r\nHost: " + addr + "\r\nConnection: Upgrade\r\nUpgrade: silkd\r\nAuthorization: Bearer " + token + "\r\n\r\n"
	if _, err := c.Write(append([]byte(req), frame...)); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	want := "HTTP/1.1 101 Switching Protocols\r\nUpgrade: silkd\r\nConnection: Upgrade\r\n\r\n"
	head := make([]byte, len(want))
	if _, err := io.ReadFull(br, head); err != nil || string(head) != want {
		rest, _ := br.Peek(br.Buffered())
		t.Fatalf("upgrade answered %q%q: %v", head, rest, err)
	}
	return silkd.NewConn(&readerConn{Conn: c, r: br})
}

// readerConn reads through the reader that read the 101.
type readerConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *readerConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// TestDataPlaneQEMU is issue 17's acceptance 1: the built sandboxd on the
// QEMU driver (TCG) with the project's guest; through the agent relay,
// opened exactly as the old SDK does, an exec with stdout, stderr and an
// exit code, 64 MiB written and read back, a port_forward to a TCP server
// started in the guest, and after a hibernate the next exec wakes the
// sandbox within the call and sees the file.
func TestDataPlaneQEMU(t *testing.T) {
	g := guesttest.Require(t)
	n := startQEMUNode(t, shortTempDir(t, "dpq"), g, nil)
	addr, root := n.addr, n.root
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cl := n.claim(t, ctx, api.ClaimRequest{Template: "default"})

	// exec, its first frame pipelined behind the upgrade request.
	sh := silkd.Exec{Argv: []string{"sh", "-c", "echo $((6*7)); echo err >&2; exit 3"}}
	c := sdkAgent(t, ctx, addr, cl.ID, cl.Token, sh)
	var out, errb bytes.Buffer
	res, err := execAfterFirstFrame(ctx, c, &out, &errb)
	if err != nil || res.Code != 3 || out.String() != "42\n" || errb.String() != "err\n" {
		t.Fatalf("exec: %+v, %v, stdout %q, stderr %q", res, err, out.String(), errb.String())
	}

	// 64 MiB through fs_write and back through fs_read.
	big := make([]byte, 64<<20)
	rand.Read(big)
	want := sha256.Sum256(big)
	c = sdkAgent(t, ctx, addr, cl.ID, cl.Token, silkd.Info{})
	if _, err := c.R.ReadResponse(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := c.WriteFile(ctx, silkd.FsWrite{Path: "/tmp/big"}, bytes.NewReader(big)); err != nil {
		t.Fatal(err)
	}
	h := sha256.New()
	if n, err := c.ReadFile(ctx, "/tmp/big", h); err != nil || n != int64(len(big)) || !bytes.Equal(h.Sum(nil), want[:]) {
		t.Fatalf("fs_read: %d bytes, %v", n, err)
	}
	t.Logf("64 MiB written and read back through the relay in %v", time.Since(start))

	// A TCP server in the guest, reached through port_forward.
	if _, err := c.Exec(ctx, silkd.Exec{Argv: []string{"nc", "-ll", "-p", "8000", "-e", "cat"}, Detach: true}, silkd.ExecIO{}); err != nil {
		t.Fatal(err)
	}
	var p *silkd.PortConn
	for deadline := time.Now().Add(30 * time.Second); ; {
		ac, err := apiclient.New(addr, cl.Token, nil)
		if err != nil {
			t.Fatal(err)
		}
		nc, err := ac.DialAgent(ctx, cl.ID)
		if err != nil {
			t.Fatal(err)
		}
		p, err = silkd.NewConn(nc).PortForward(ctx, 8000)
		if err == nil || !errors.Is(err, silkd.ErrNotFound) || time.Now().After(deadline) {
			if err != nil {
				t.Fatalf("port_forward: %v", err)
			}
			break
		}
		nc.Close()
		time.Sleep(100 * time.Millisecond) // nc is not listening yet
	}
	msg := bytes.Repeat([]byte("through the guest port "), 20000)
	go func() { p.Write(msg); p.CloseWrite() }()
	if got, err := io.ReadAll(p); err != nil || !bytes.Equal(got, msg) {
		t.Fatalf("port_forward echo: %d bytes of %d, %v", len(got), len(msg), err)
	}
	p.Close()

	// Hibernate; the next exec wakes the sandbox within its call and sees
	// the file.
	if err := root.Hibernate(ctx, cl.ID); err != nil {
		t.Fatal(err)
	}
	waitState(t, ctx, root, cl.ID, "hibernated")
	sum := silkd.Exec{Argv: []string{"sha256sum", "/tmp/big"}}
	start = time.Now()
	c = sdkAgent(t, ctx, addr, cl.ID, cl.Token, sum)
	out.Reset()
	if res, err := execAfterFirstFrame(ctx, c, &out, io.Discard); err != nil || res.Code != 0 {
		t.Fatalf("sha256sum after the wake: %+v, %v", res, err)
	}
	if got := strings.Fields(out.String()); len(got) == 0 || got[0] != hex.EncodeToString(want[:]) {
		t.Fatalf("after the wake the file hashes to %q, want %x", out.String(), want)
	}
	t.Logf("exec through a wake: %v", time.Since(start))
	if sb, err := root.Sandbox(ctx, cl.ID); err != nil || sb.State != "running" {
		t.Fatalf("after the exec: %+v, %v", sb, err)
	}
}

// execAfterFirstFrame finishes an exec whose request frame already went
// out (pipelined with the upgrade): stdin closed, then the answer frames.
func execAfterFirstFrame(ctx context.Context, c *silkd.Conn, stdout, stderr io.Writer) (silkd.ExecResult, error) {
	var res silkd.ExecResult
	if err := c.W.WriteRequest(silkd.StdinClose{}); err != nil {
		return res, err
	}
	for {
		r, err := c.R.ReadResponse()
		if err != nil {
			return res, err
		}
		switch v := r.(type) {
		case *silkd.Started:
			res.Pid = v.Pid
		case *silkd.Stdout:
			stdout.Write(v.Data)
		case *silkd.Stderr:
			stderr.Write(v.Data)
		case *silkd.Exit:
			res.Code = v.Code
			return res, nil
		case *silkd.Error:
			return res, v
		}
		if ctx.Err() != nil {
			return res, ctx.Err()
		}
	}
}
