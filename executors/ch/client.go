package ch

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
	"os"
	"syscall"
	"time"
)

// Timeouts bound each call in addition to the caller's context.
type Timeouts struct {
	// Call bounds every call except vm.snapshot and vm.restore.
	Call time.Duration
	// Snapshot bounds vm.snapshot, which writes all of guest memory.
	Snapshot time.Duration
	// Restore bounds vm.restore, which may read all of guest memory.
	Restore time.Duration
}

// DefaultTimeouts are used for zero fields of the Timeouts given to New.
var DefaultTimeouts = Timeouts{
	Call:     10 * time.Second,
	Snapshot: 5 * time.Minute,
	Restore:  5 * time.Minute,
}

// maxBody bounds what is read of a response; vm.info of a VM with many
// devices is the largest legitimate answer and stays far below it.
const maxBody = 8 << 20

// dialError marks failures to connect, which prove no request was sent.
type dialError struct{ err error }

func (e *dialError) Error() string { return e.err.Error() }
func (e *dialError) Unwrap() error { return e.err }

// Client talks to one VMM's API socket. It is safe for concurrent use. Each
// call opens its own connection and closes it after the answer: a dial error
// then always means nothing was sent (see ErrVMMGone), and a VMM that died
// since the last call cannot leave a stale pooled connection behind.
type Client struct {
	socket   string
	timeouts Timeouts
}

// Option configures a Client.
type Option func(*Client)

// WithTimeouts overrides per-call timeouts; zero fields keep the defaults.
func WithTimeouts(t Timeouts) Option {
	return func(c *Client) {
		if t.Call > 0 {
			c.timeouts.Call = t.Call
		}
		if t.Snapshot > 0 {
			c.timeouts.Snapshot = t.Snapshot
		}
		if t.Restore > 0 {
			c.timeouts.Restore = t.Restore
		}
	}
}

// New returns a client for the API socket at socketPath.
func New(socketPath string, opts ...Option) *Client {
	c := &Client{socket: socketPath, timeouts: DefaultTimeouts}
	for _, o := range opts {
		o(c)
	}
	return c
}

// SocketPath is the API socket this client talks to.
func (c *Client) SocketPath() string { return c.socket }

// Ping calls vmm.ping.
func (c *Client) Ping(ctx context.Context) (*PingResponse, error) {
	var out PingResponse
	if err := c.do(ctx, "vmm.ping", http.MethodGet, nil, &out, c.timeouts.Call); err != nil {
		return nil, err
	}
	return &out, nil
}

// ShutdownVMM calls vmm.shutdown: the VMM shuts its VM down and exits.
func (c *Client) ShutdownVMM(ctx context.Context) error {
	return c.do(ctx, "vmm.shutdown", http.MethodPut, nil, nil, c.timeouts.Call)
}

// Info calls vm.info. Before vm.create or vm.restore it fails with a 404
// (IsNotFound).
func (c *Client) Info(ctx context.Context) (*VmInfo, error) {
	var out VmInfo
	if err := c.do(ctx, "vm.info", http.MethodGet, nil, &out, c.timeouts.Call); err != nil {
		return nil, err
	}
	return &out, nil
}

// Create calls vm.create with cfg; the VM is Created, not booted.
func (c *Client) Create(ctx context.Context, cfg *VmConfig) error {
	if cfg == nil {
		return errors.New("ch vm.create: nil config")
	}
	return c.do(ctx, "vm.create", http.MethodPut, cfg, nil, c.timeouts.Call)
}

// Boot calls vm.boot.
func (c *Client) Boot(ctx context.Context) error {
	return c.do(ctx, "vm.boot", http.MethodPut, nil, nil, c.timeouts.Call)
}

// Pause calls vm.pause. Pausing a paused VM succeeds.
func (c *Client) Pause(ctx context.Context) error {
	err := c.do(ctx, "vm.pause", http.MethodPut, nil, nil, c.timeouts.Call)
	if ae, ok := asAPIError(err); ok && ae.IsTransition(StatePaused, StatePaused) {
		return nil
	}
	return err
}

// Resume calls vm.resume. Resuming a running VM succeeds.
func (c *Client) Resume(ctx context.Context) error {
	err := c.do(ctx, "vm.resume", http.MethodPut, nil, nil, c.timeouts.Call)
	if ae, ok := asAPIError(err); ok && ae.IsTransition(StateRunning, StateRunning) {
		return nil
	}
	return err
}

// Snapshot calls vm.snapshot into destinationURL ("file://<dir>", see
// FileURL). The VM must be paused and the directory must exist; CH creates
// config.json, state.json and memory-ranges in it exclusively and does not
// fsync them.
func (c *Client) Snapshot(ctx context.Context, destinationURL string) error {
	body := struct {
		DestinationURL string `json:"destination_url"`
	}{destinationURL}
	return c.do(ctx, "vm.snapshot", http.MethodPut, body, nil, c.timeouts.Snapshot)
}

// Restore calls vm.restore. The VMM must not hold a VM yet.
func (c *Client) Restore(ctx context.Context, rc RestoreConfig) error {
	if rc.SourceURL == "" {
		return errors.New("ch vm.restore: empty source URL")
	}
	return c.do(ctx, "vm.restore", http.MethodPut, rc, nil, c.timeouts.Restore)
}

// Shutdown calls vm.shutdown.
func (c *Client) Shutdown(ctx context.Context) error {
	return c.do(ctx, "vm.shutdown", http.MethodPut, nil, nil, c.timeouts.Call)
}

// Delete calls vm.delete: the VM is shut down if needed and forgotten.
func (c *Client) Delete(ctx context.Context) error {
	return c.do(ctx, "vm.delete", http.MethodPut, nil, nil, c.timeouts.Call)
}

// Counters calls vm.counters.
func (c *Client) Counters(ctx context.Context) (Counters, error) {
	var out Counters
	if err := c.do(ctx, "vm.counters", http.MethodGet, nil, &out, c.timeouts.Call); err != nil {
		return nil, err
	}
	return out, nil
}

// AddNet calls vm.add-net. A hot-plug into a booted VM answers with the new
// device's PCI info; a cold add (VM created, not booted) answers with none and
// AddNet returns nil info.
func (c *Client) AddNet(ctx context.Context, nc NetConfig) (*PciDeviceInfo, error) {
	var out PciDeviceInfo
	if err := c.do(ctx, "vm.add-net", http.MethodPut, nc, &out, c.timeouts.Call); err != nil {
		return nil, err
	}
	if out.ID == "" {
		return nil, nil
	}
	return &out, nil
}

// AddDisk calls vm.add-disk: a hot-plug into a booted VM answers the
// device (a cold add to a created one answers nothing: nil). A duplicate
// id or path fails with a 409.
func (c *Client) AddDisk(ctx context.Context, dc DiskConfig) (*PciDeviceInfo, error) {
	var out PciDeviceInfo
	if err := c.do(ctx, "vm.add-disk", http.MethodPut, dc, &out, c.timeouts.Call); err != nil {
		return nil, err
	}
	if out.ID == "" {
		return nil, nil
	}
	return &out, nil
}

// RemoveDevice calls vm.remove-device. An unknown id fails with a 404.
func (c *Client) RemoveDevice(ctx context.Context, id string) error {
	body := struct {
		ID string `json:"id"`
	}{id}
	return c.do(ctx, "vm.remove-device", http.MethodPut, body, nil, c.timeouts.Call)
}

// Resize calls vm.resize (vCPUs, RAM or the balloon's target size).
func (c *Client) Resize(ctx context.Context, r Resize) error {
	if r.DesiredVcpus == nil && r.DesiredRAM == nil && r.DesiredBalloon == nil {
		return errors.New("ch vm.resize: nothing to resize")
	}
	return c.do(ctx, "vm.resize", http.MethodPut, r, nil, c.timeouts.Call)
}

// do performs one call: one connection, one HTTP/1.1 exchange. out is
// decoded from a 200 body when non-nil.
func (c *Client) do(ctx context.Context, op, method string, in, out any, timeout time.Duration) error {
	var body []byte
	if in != nil {
		var err error
		if body, err = json.Marshal(in); err != nil {
			return fmt.Errorf("ch %s: encode request: %w", op, err)
		}
	}
	cctx, cancel := context.WithTimeoutCause(ctx, timeout, ErrTimeout)
	defer cancel()
	var d net.Dialer
	conn, err := d.DialContext(cctx, "unix", c.socket)
	if err != nil {
		return c.transportError(ctx, cctx, op, &dialError{err})
	}
	defer conn.Close()
	// Deadlines and cancellation both end the exchange by expiring the
	// connection's deadline.
	if dl, ok := cctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	stop := context.AfterFunc(cctx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()

	// Connection: close makes the end of the answer unambiguous even for a
	// bodiless 200 (vmm.shutdown). A bodiless request carries no
	// Content-Length at all, as curl sends it.
	var req bytes.Buffer
	fmt.Fprintf(&req, "%s /api/v1/%s HTTP/1.1\r\nHost: localhost\r\nAccept: application/json\r\nConnection: close\r\n", method, op)
	if in != nil {
		fmt.Fprintf(&req, "Content-Type: application/json\r\nContent-Length: %d\r\n", len(body))
	}
	req.WriteString("\r\n")
	req.Write(body)
	if _, err := conn.Write(req.Bytes()); err != nil {
		return c.transportError(ctx, cctx, op, err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return c.transportError(ctx, cctx, op, err)
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	resp.Body.Close()
	if err != nil {
		return c.transportError(ctx, cctx, op, err)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return parseAPIError(op, resp.StatusCode, data)
	}
	if out != nil && resp.StatusCode != http.StatusNoContent && len(bytes.TrimSpace(data)) > 0 {
		if err := json.Unmarshal(data, out); err != nil {
			return fmt.Errorf("ch %s: decode response: %w", op, err)
		}
	}
	return nil
}

func (c *Client) transportError(parent, cctx context.Context, op string, err error) error {
	if errors.Is(err, os.ErrDeadlineExceeded) {
		// The connection's deadline is the context's (or was expired by its
		// cancellation): let the context catch up before asking it why.
		<-cctx.Done()
	}
	if perr := parent.Err(); perr != nil {
		// The caller gave up; that is theirs to interpret.
		return fmt.Errorf("ch %s: %w", op, perr)
	}
	if errors.Is(context.Cause(cctx), ErrTimeout) {
		return &TransportError{Op: op, Kind: ErrTimeout, Err: context.DeadlineExceeded}
	}
	var de *dialError
	if errors.As(err, &de) {
		if errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ENOTSOCK) {
			return &TransportError{Op: op, Kind: ErrVMMGone, Err: de.err}
		}
		// Anything else that stops a dial (EACCES, EAGAIN on a full backlog)
		// also means nothing was sent, but the VMM may well be alive.
		return &TransportError{Op: op, Kind: ErrConnectionLost, Err: de.err}
	}
	return &TransportError{Op: op, Kind: ErrConnectionLost, Err: err}
}
