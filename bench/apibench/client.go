package apibench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/sbxlog/sbxlog/projections/api"
)

// claimClient makes claims on one server, one at a time.
type claimClient interface {
	// claim times one POST /v1/claim up to the last byte of the reply; the
	// reply is decoded after the clock stops. A reply other than 200 is an
	// error.
	claim(ctx context.Context) (time.Duration, api.ClaimResponse, error)
	close()
}

// connClient is the bench's HTTP/1.1 client: one keep-alive TCP connection,
// the request (built once) written with one write(2) and the reply read
// and parsed (net/http.ReadResponse) on the caller's goroutine. Go's
// net/http.Transport instead hands every request to a writer goroutine and
// every reply to a reader goroutine of the connection, four goroutine
// hand-offs per round trip, which the HTTP no-op floor measured through
// both clients prices on this host; this client bills the server's latency
// with as little of the client's as a real HTTP client allows. It redials
// when the server closes the connection or a round trip fails, and, as
// net/http's Transport does, retries once on a fresh connection when a
// reused one fails before any reply arrived: the server closed it while it
// sat idle (its IdleTimeout), which on a loaded host happens between the
// interleaved blocks of a long run.
type connClient struct {
	addr string
	req  []byte
	conn net.Conn
	br   *bufio.Reader
}

var _ claimClient = (*connClient)(nil)

// newConnClient prepares claims on the server at url (http://host:port);
// it dials on the first claim.
func newConnClient(url string) *connClient {
	addr := strings.TrimPrefix(url, "http://")
	var req bytes.Buffer
	fmt.Fprintf(&req, "POST /v1/claim HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\n"+
		"Content-Type: application/json\r\nContent-Length: %s\r\n\r\n", addr, rootToken, strconv.Itoa(len(claimBody)))
	req.Write(claimBody)
	return &connClient{addr: addr, req: req.Bytes()}
}

// roundTripBound bounds one round trip, so a stuck server fails the run
// instead of hanging it.
const roundTripBound = time.Minute

func (c *connClient) claim(ctx context.Context) (time.Duration, api.ClaimResponse, error) {
	reused := c.conn != nil
	d, cr, err := c.roundTrip(ctx)
	var stale *staleConnError
	if reused && errors.As(err, &stale) && ctx.Err() == nil {
		d, cr, err = c.roundTrip(ctx)
	}
	if errors.As(err, &stale) {
		err = stale.err
	}
	return d, cr, err
}

// staleConnError is a round trip that failed before any byte of the reply
// arrived: the request may not have reached the server.
type staleConnError struct{ err error }

func (e *staleConnError) Error() string { return e.err.Error() }

func (c *connClient) roundTrip(ctx context.Context) (time.Duration, api.ClaimResponse, error) {
	var cr api.ClaimResponse
	if err := ctx.Err(); err != nil {
		return 0, cr, err
	}
	if c.conn == nil {
		conn, err := net.Dial("tcp", c.addr)
		if err != nil {
			return 0, cr, err
		}
		c.conn, c.br = conn, bufio.NewReaderSize(conn, 4096)
	}
	if err := c.conn.SetDeadline(time.Now().Add(roundTripBound)); err != nil {
		c.close()
		return 0, cr, err
	}
	// A cancelled run ends the round trip at once.
	conn := c.conn
	defer context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })()
	start := time.Now()
	if _, err := c.conn.Write(c.req); err != nil {
		c.close()
		return 0, cr, &staleConnError{err}
	}
	if _, err := c.br.Peek(1); err != nil {
		c.close()
		return 0, cr, &staleConnError{err}
	}
	resp, err := http.ReadResponse(c.br, nil)
	if err != nil {
		c.close()
		return 0, cr, err
	}
	body, err := io.ReadAll(resp.Body)
	d := time.Since(start)
	if err != nil || resp.Close {
		c.close()
	}
	if err != nil {
		return 0, cr, err
	}
	return d, cr, decodeClaimReply(resp.StatusCode, body, &cr)
}

func (c *connClient) close() {
	if c.conn != nil {
		_ = c.conn.Close()
		c.conn, c.br = nil, nil
	}
}

// netHTTPClient makes claims through Go's net/http.Client, as a Go SDK
// would.
type netHTTPClient struct {
	c   *http.Client
	url string
}

var _ claimClient = (*netHTTPClient)(nil)

func (n *netHTTPClient) claim(ctx context.Context) (time.Duration, api.ClaimResponse, error) {
	var cr api.ClaimResponse
	req, err := http.NewRequestWithContext(ctx, "POST", n.url+"/v1/claim", bytes.NewReader(claimBody))
	if err != nil {
		return 0, cr, err
	}
	req.Header.Set("Authorization", "Bearer "+rootToken)
	req.Header.Set("Content-Type", "application/json")
	start := time.Now()
	resp, err := n.c.Do(req)
	if err != nil {
		return 0, cr, err
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	d := time.Since(start)
	if err != nil {
		return 0, cr, err
	}
	return d, cr, decodeClaimReply(resp.StatusCode, body, &cr)
}

func (n *netHTTPClient) close() {}

func decodeClaimReply(status int, body []byte, cr *api.ClaimResponse) error {
	if status != http.StatusOK {
		return fmt.Errorf("claim: %d %s", status, body)
	}
	if err := json.Unmarshal(body, cr); err != nil || cr.ID == "" {
		return fmt.Errorf("claim reply %q: %v", body, err)
	}
	return nil
}
