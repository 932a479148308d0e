package apiclient

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"

	"github.com/sbxlog/sbxlog/projections/api"
)

// The data plane: connections into a sandbox's guest, opened as the old
// SDKs open them (their exact upgrade request, then bytes). The client's
// token must be the sandbox's own (root's also opens a port, passively).

// DialAgent opens GET /v1/sandboxes/{id}/agent: once it returns, the
// connection carries the guest agent's wire protocol (package
// executors/guest/silkd's frames; wrap it with silkd.NewConn). A refusal is
// an *Error. ctx bounds the dial and the answer, which waits for a
// hibernated sandbox to be woken.
func (c *Client) DialAgent(ctx context.Context, id string) (net.Conn, error) {
	sc, err := c.forSandbox(ctx, id)
	if err != nil {
		return nil, err
	}
	return sc.upgrade(ctx, sandboxPath(id, "agent"), "silkd")
}

// DialPort opens GET /v1/sandboxes/{id}/ports/{port}: the connection then
// carries the guest TCP port's bytes; CloseWrite half-closes the guest
// socket.
func (c *Client) DialPort(ctx context.Context, id string, port int) (net.Conn, error) {
	sc, err := c.forSandbox(ctx, id)
	if err != nil {
		return nil, err
	}
	return sc.upgrade(ctx, sandboxPath(id, "ports/"+strconv.Itoa(port)), "tcp")
}

// Exec is POST /v1/sandboxes/{id}/exec: the command's exit code and
// output, buffered (a non-zero exit is not an error).
func (c *Client) Exec(ctx context.Context, id string, req api.ExecRequest) (*api.ExecResponse, error) {
	sc, err := c.forSandbox(ctx, id)
	if err != nil {
		return nil, err
	}
	var out api.ExecResponse
	if err := sc.do(ctx, http.MethodPost, sandboxPath(id, "exec"), nil, req, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Preview is POST /v1/sandboxes/{id}/preview: a URL that reaches guest
// port req.Port without any other credential until it expires or the
// claim ends.
func (c *Client) Preview(ctx context.Context, id string, req api.PreviewRequest) (*api.PreviewResponse, error) {
	var out api.PreviewResponse
	if err := c.do(ctx, http.MethodPost, sandboxPath(id, "preview"), nil, req, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// upgrade writes the old SDK's upgrade request for path, header for
// header, and returns the connection after its 101. Bytes the server sent
// behind the 101 are the connection's first reads.
func (c *Client) upgrade(ctx context.Context, path, proto string) (net.Conn, error) {
	if strings.ContainsAny(path+c.token, "\r\n\x00") {
		return nil, fmt.Errorf("apiclient: GET %s: id or token holds a line break or NUL", path)
	}
	addr := c.base.Host
	if c.base.Port() == "" {
		port := "80"
		if c.base.Scheme == "https" {
			port = "443"
		}
		addr = net.JoinHostPort(c.base.Hostname(), port)
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	raw := conn
	if c.base.Scheme == "https" {
		tc := tls.Client(conn, &tls.Config{ServerName: c.base.Hostname(), NextProtos: []string{"http/1.1"}})
		if err := tc.HandshakeContext(ctx); err != nil {
			conn.Close()
			return nil, err
		}
		conn = tc
	}
	stop := context.AfterFunc(ctx, func() { raw.Close() })
	req := "GET " + c.base.Path + path + " HTTP/1.1\r\nHost: " + c.base.Host + "\r\nConnection: Upgrade\r\nUpgrade: " + proto + "\r\n"
	if c.token != "" {
		req += "Authorization: Bearer " + c.token + "\r\n"
	}
	br := bufio.NewReader(conn)
	_, err = io.WriteString(conn, req+"\r\n")
	var resp *http.Response
	if err == nil {
		resp, err = http.ReadResponse(br, nil)
	}
	if !stop() || ctx.Err() != nil {
		conn.Close()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, err
	}
	if err != nil {
		conn.Close()
		return nil, err
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		defer conn.Close()
		defer resp.Body.Close()
		return nil, errorOf(resp, http.MethodGet, path)
	}
	if br.Buffered() == 0 {
		return conn, nil // the raw connection: nothing to hand over first
	}
	ahead, _ := br.Peek(br.Buffered())
	return &prefixedConn{Conn: conn, ahead: append([]byte(nil), ahead...)}, nil
}

// prefixedConn is a connection whose first reads are bytes already read
// with the answer.
type prefixedConn struct {
	net.Conn
	ahead []byte
}

func (p *prefixedConn) Read(b []byte) (int, error) {
	if len(p.ahead) > 0 {
		n := copy(b, p.ahead)
		p.ahead = p.ahead[n:]
		return n, nil
	}
	return p.Conn.Read(b)
}

// CloseWrite half-closes the connection, where it can be.
func (p *prefixedConn) CloseWrite() error {
	if cw, ok := p.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return fmt.Errorf("apiclient: %T cannot half-close", p.Conn)
}
