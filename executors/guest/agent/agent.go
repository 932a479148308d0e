// Package agent is the line protocol spoken on the guest's agent serial port, with
// both ends: Server runs inside the guest (cmd/sbx-agent), Client on the host.
// A Cloud Hypervisor guest has no such serial line: there the protocol runs on
// hybrid vsock port VsockPort, the port the readiness probe connects to (chsim's
// simulated guest serves it there; executors/chdriver sets the clock over it).
//
// Protocol: one request per line, one response line per request, ASCII, "\n"
// terminated. A request may start with a tag "#<token>"; the response then starts
// with "=<token>", so a client can ignore lines that belong to an earlier,
// abandoned request (a serial line keeps bytes across reconnects) and can never
// mistake the tty's echo of its own request for an answer (until the agent has put
// the port in raw mode, the guest kernel echoes what arrives). Untagged requests
// get untagged responses, so a human with socat can type them. The Client's tokens
// are "<random client id>.<sequence>": unique across connections, because answers
// to a previous client's requests may still be on the line.
//
//	ready              -> ready
//	write <n>          -> sha <hex>      n random bytes replace the data file; hex is their sha256
//	sha                -> sha <hex>      sha256 of the data file as it is now
//	uptime             -> uptime <ns> <counter> <bootid>
//	key <hex>          -> key            the data plane's key K (KeyHexLen hex digits) from now on
//	net <b64>          -> net            the egress network (NetConfig, net.go), applied by Server.Net
//	mount <b64>        -> mount          mount a volume's disk by its serial (VolumeMount, volume.go)
//	umount <b64>       -> umount         unmount it
//	clock [<ns>]       -> clock <ns>     read (or set) the guest's wall clock (clock.go)
//	anything else      -> error <verb> <message>
//
// The data plane (the silkd protocol, package executors/guest/silkd) runs
// on connections of its own; where its transport is reachable by more than
// the VM's host process (QEMU's loopback port forward), a connection starts
// with a mutual challenge-response on the key the host last gave over this
// serial line (K, its 32 bytes), so the key never crosses the wire and
// neither side talks to one that cannot prove it holds K:
//
//	host  -> HELLO <hn>          hn: 32 fresh random bytes, hex
//	guest -> PROOF <gn> <gmac>   gn: 32 fresh random bytes; gmac = HMAC-SHA256(K, "sbxlog data plane v1 guest" 0x00 hn gn)
//	host  -> PROOF <hmac>        hmac = HMAC-SHA256(K, "sbxlog data plane v1 host" 0x00 hn gn)
//	guest -> OK                  then silkd frames follow
//
// Each line is "\n"-terminated, its fields hex. The host checks gmac before
// it sends anything else: a listener that cannot prove K (another process
// on the port, or an agent holding a stale key) is refused
// (ErrGuestUnproven) having seen only hn. The agent checks hmac before OK
// and closes the connection on any mismatch; one that was never given a key
// refuses every data connection. The labels make each proof valid in one
// direction only, and each side's fresh nonce keeps a recorded exchange
// from being replayed to it. DialData and AcceptData are the two ends; both
// read the other's lines byte by byte (package executors/handshake), so no
// frame is consumed.
//
// uptime reports CLOCK_BOOTTIME in nanoseconds, a counter the guest increments every
// Tick (so it only advances while the guest runs), and a random id chosen when the
// agent started: after a hibernate and wake the boot id is unchanged and the counter
// continues from where it stopped, which is how a test tells a restored guest from a
// rebooted one.
//
// Errors: a response "error ..." becomes a *RemoteError; a line longer than
// MaxLine is ErrLineTooLong.
package agent

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// VsockPort is the guest's vsock port of this protocol on Cloud Hypervisor,
// beside the data plane's (silkd.Port).
const VsockPort = 1024

// Tick is how often the guest's counter increments.
const Tick = 100 * time.Millisecond

// MaxLine bounds a request or response line.
const MaxLine = 4096

// MaxWrite bounds the size of one write request, so a typo cannot fill the guest's
// tmpfs (and so its RAM).
const MaxWrite = 128 << 20

// Verbs of the protocol.
const (
	VerbReady  = "ready"
	VerbWrite  = "write"
	VerbSha    = "sha"
	VerbUptime = "uptime"
	VerbKey    = "key"
	VerbError  = "error"
)

// KeyHexLen is the length of a data-plane key in hex digits (32 random
// bytes).
const KeyHexLen = 64

// ErrLineTooLong is returned when a peer sends a line longer than MaxLine.
var ErrLineTooLong = errors.New("agent: line too long")

// RemoteError is an "error" response from the guest.
type RemoteError struct {
	Verb string // the request's verb
	Msg  string
}

func (e *RemoteError) Error() string {
	return fmt.Sprintf("agent: guest error on %q: %s", e.Verb, e.Msg)
}

// Server answers requests inside the guest.
type Server struct {
	// DataPath is the file write replaces and sha reads (on tmpfs in the
	// guest); "": both verbs are refused (a simulated guest keeps no file).
	DataPath string
	// BootID identifies this run of the agent.
	BootID string
	// Rand supplies the bytes of write.
	Rand io.Reader
	// Uptime returns the time since boot; nil: the verb is refused.
	Uptime func() (time.Duration, error)

	// Net applies a guest's egress network (VerbNet); nil: the verb is
	// refused, as by an agent that predates it.
	Net func(NetConfig) error
	// Mount and Unmount serve VerbMount and VerbUnmount (volume.go); nil:
	// the verbs are refused.
	Mount   func(VolumeMount) error
	Unmount func(VolumeMount) error
	// Now reads the guest's wall clock and SetClock sets it (VerbClock,
	// clock.go); Now nil: the verb is refused, SetClock nil: only reads
	// are served.
	Now      func() time.Time
	SetClock func(time.Time) error

	counter atomic.Uint64
	key     atomic.Pointer[string]
}

// DataKey returns the data plane's key, "" until the host gave one.
func (s *Server) DataKey() string {
	if k := s.key.Load(); k != nil {
		return *k
	}
	return ""
}

// Count advances the counter by one; the guest calls it every Tick.
func (s *Server) Count() { s.counter.Add(1) }

// Counter returns the current counter value.
func (s *Server) Counter() uint64 { return s.counter.Load() }

// Handle answers one request line (without its newline) with one response line.
func (s *Server) Handle(line string) string {
	token, verb, args := splitRequest(line)
	prefix := ""
	if token != "" {
		prefix = respTag + token + " "
	}
	resp, err := s.handle(verb, args)
	if err != nil {
		return prefix + VerbError + " " + orDash(verb) + " " + strings.ReplaceAll(err.Error(), "\n", " ")
	}
	return prefix + resp
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func (s *Server) handle(verb string, args []string) (string, error) {
	switch verb {
	case VerbReady:
		if len(args) != 0 {
			return "", errors.New("usage: ready")
		}
		return VerbReady, nil
	case VerbWrite:
		if s.DataPath == "" {
			break
		}
		if len(args) != 1 {
			return "", errors.New("usage: write <bytes>")
		}
		n, err := strconv.ParseInt(args[0], 10, 64)
		if err != nil || n < 0 || n > MaxWrite {
			return "", fmt.Errorf("bad size %q (0..%d)", args[0], MaxWrite)
		}
		sum, err := s.write(n)
		if err != nil {
			return "", err
		}
		return VerbSha + " " + sum, nil
	case VerbSha:
		if s.DataPath == "" {
			break
		}
		if len(args) != 0 {
			return "", errors.New("usage: sha")
		}
		sum, err := fileSHA(s.DataPath)
		if err != nil {
			return "", err
		}
		return VerbSha + " " + sum, nil
	case VerbUptime:
		if s.Uptime == nil {
			break
		}
		if len(args) != 0 {
			return "", errors.New("usage: uptime")
		}
		up, err := s.Uptime()
		if err != nil {
			return "", err
		}
		return fmt.Sprintf("%s %d %d %s", VerbUptime, up.Nanoseconds(), s.Counter(), s.BootID), nil
	case VerbKey:
		if len(args) != 1 || !validKey(args[0]) {
			return "", fmt.Errorf("usage: key <%d hex digits>", KeyHexLen)
		}
		k := args[0]
		s.key.Store(&k)
		return VerbKey, nil
	case VerbNet:
		if s.Net == nil {
			break
		}
		if len(args) != 1 {
			return "", errors.New("usage: net <base64url JSON>")
		}
		c, err := DecodeNet(args[0])
		if err != nil {
			return "", err
		}
		if err := s.Net(c); err != nil {
			return "", err
		}
		return VerbNet, nil
	case VerbMount:
		return handleVolume(verb, args, s.Mount)
	case VerbUnmount:
		return handleVolume(verb, args, s.Unmount)
	case VerbClock:
		return s.handleClock(args)
	case "":
		return "", errors.New("empty request")
	}
	return "", errUnknownVerb
}

// errUnknownVerb answers a verb this agent does not serve (a nil hook
// included, as by an agent that predates the verb).
var errUnknownVerb = errors.New("unknown command (want ready, write, sha, uptime, key, net, mount, umount, clock)")

// write replaces the data file with n random bytes, through a temp file and a
// rename so that sha never sees a half-written file.
func (s *Server) write(n int64) (string, error) {
	tmp := s.DataPath + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return "", err
	}
	h := sha256.New()
	_, err = io.CopyN(io.MultiWriter(f, h), s.Rand, n)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, s.DataPath)
	}
	if err != nil {
		_ = os.Remove(tmp)
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func fileSHA(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// Serve answers requests read from r on w until r ends. Overlong lines are answered
// with an error and skipped, so line noise on the serial port cannot stop the agent.
func (s *Server) Serve(r io.Reader, w io.Writer) error {
	br := bufio.NewReaderSize(r, MaxLine)
	for {
		line, err := readLine(br)
		if errors.Is(err, ErrLineTooLong) {
			if _, werr := io.WriteString(w, VerbError+" - line too long\n"); werr != nil {
				return werr
			}
			continue
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		if strings.TrimSpace(line) == "" {
			continue
		}
		if _, err := io.WriteString(w, s.Handle(line)+"\n"); err != nil {
			return err
		}
	}
}

// readLine returns the next line without its terminator ("\r" too, since a serial
// terminal may send CRLF). A line longer than MaxLine is consumed and reported as
// ErrLineTooLong.
func readLine(br *bufio.Reader) (string, error) {
	line, err := br.ReadSlice('\n')
	if errors.Is(err, bufio.ErrBufferFull) {
		for errors.Is(err, bufio.ErrBufferFull) {
			_, err = br.ReadSlice('\n')
		}
		if err != nil {
			return "", err
		}
		return "", ErrLineTooLong
	}
	if err != nil {
		return "", err
	}
	return strings.TrimRight(string(line), "\r\n"), nil
}

// Tag markers: a request's token follows reqTag, the response's respTag.
const (
	reqTag  = "#"
	respTag = "="
)

func splitRequest(line string) (token, verb string, args []string) {
	f := strings.Fields(line)
	if len(f) > 0 && strings.HasPrefix(f[0], reqTag) && len(f[0]) > len(reqTag) {
		token, f = f[0][len(reqTag):], f[1:]
	}
	if len(f) == 0 {
		return token, "", nil
	}
	return token, f[0], f[1:]
}

// Uptime is the answer to an uptime request.
type Uptime struct {
	Since   time.Duration // CLOCK_BOOTTIME in the guest
	Counter uint64
	BootID  string
}

// Conn is the transport a Client needs: a stream with deadlines (a net.Conn).
type Conn interface {
	io.ReadWriteCloser
	SetDeadline(time.Time) error
}

// Client talks to the agent from the host. It is not safe for concurrent use: the
// protocol has one request in flight.
type Client struct {
	conn Conn
	br   *bufio.Reader
	id   string // random, so tags differ from those of earlier clients on the same port
	seq  uint64
}

// NewClient wraps conn.
func NewClient(conn Conn) *Client {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return &Client{conn: conn, br: bufio.NewReaderSize(conn, MaxLine), id: hex.EncodeToString(b[:])}
}

// Dial connects to the agent's unix socket (the host end of the guest's serial port).
func Dial(ctx context.Context, path string) (*Client, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, fmt.Errorf("agent: dial: %w", err)
	}
	return NewClient(c.(*net.UnixConn)), nil
}

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// Do sends one request and returns its response without the tag. It skips lines
// that do not carry this request's response tag (console noise, echo, answers to
// abandoned requests). The context's deadline bounds the exchange; on error the connection
// may hold a late answer, which the next request's tag filters out.
func (c *Client) Do(ctx context.Context, verb string, args ...string) (string, error) {
	if err := ctx.Err(); err != nil {
		return "", err
	}
	c.seq++
	token := c.id + "." + strconv.FormatUint(c.seq, 10)
	// Cancellation interrupts a blocked read by moving the deadline into the past.
	// The mutex keeps a late cancellation from landing after the reset below, which
	// would make every later request on this connection time out at once.
	var mu sync.Mutex
	finished := false
	stop := context.AfterFunc(ctx, func() {
		mu.Lock()
		defer mu.Unlock()
		if !finished {
			_ = c.conn.SetDeadline(time.Unix(1, 0))
		}
	})
	defer func() {
		stop()
		mu.Lock()
		finished = true
		_ = c.conn.SetDeadline(time.Time{})
		mu.Unlock()
	}()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.conn.SetDeadline(dl)
	}
	req := strings.Join(append([]string{reqTag + token, verb}, args...), " ") + "\n"
	if _, err := io.WriteString(c.conn, req); err != nil {
		return "", c.ctxErr(ctx, fmt.Errorf("agent: send %s: %w", verb, err))
	}
	for {
		line, err := readLine(c.br)
		if errors.Is(err, ErrLineTooLong) {
			continue
		}
		if err != nil {
			return "", c.ctxErr(ctx, fmt.Errorf("agent: read %s: %w", verb, err))
		}
		rest, ok := strings.CutPrefix(line, respTag+token+" ")
		if !ok {
			continue
		}
		if e, ok := strings.CutPrefix(rest, VerbError+" "); ok {
			v, msg, _ := strings.Cut(e, " ")
			return "", &RemoteError{Verb: v, Msg: msg}
		}
		return rest, nil
	}
}

func (c *Client) ctxErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("%w (%w)", ctx.Err(), err)
	}
	// The connection's deadline is the context's, and may fire a moment before the
	// context reports it.
	if _, ok := ctx.Deadline(); ok && errors.Is(err, os.ErrDeadlineExceeded) {
		return fmt.Errorf("%w (%w)", context.DeadlineExceeded, err)
	}
	return err
}

func expect(resp, verb string) (string, error) {
	rest, ok := strings.CutPrefix(resp, verb)
	if !ok || (rest != "" && rest[0] != ' ') {
		return "", fmt.Errorf("agent: unexpected response %q to %s", resp, verb)
	}
	return strings.TrimPrefix(rest, " "), nil
}

// Ready asks once whether the agent answers.
func (c *Client) Ready(ctx context.Context) error {
	resp, err := c.Do(ctx, VerbReady)
	if err != nil {
		return err
	}
	_, err = expect(resp, VerbReady)
	return err
}

// Write has the guest replace its data file with n random bytes and returns their
// sha256 in hex.
func (c *Client) Write(ctx context.Context, n int64) (string, error) {
	return c.sha(ctx, VerbWrite, strconv.FormatInt(n, 10))
}

// Sha returns the sha256 (hex) of the guest's data file.
func (c *Client) Sha(ctx context.Context) (string, error) {
	return c.sha(ctx, VerbSha)
}

func (c *Client) sha(ctx context.Context, verb string, args ...string) (string, error) {
	resp, err := c.Do(ctx, verb, args...)
	if err != nil {
		return "", err
	}
	sum, err := expect(resp, VerbSha)
	if err != nil {
		return "", err
	}
	if b, err := hex.DecodeString(sum); err != nil || len(b) != sha256.Size {
		return "", fmt.Errorf("agent: bad sha256 %q", sum)
	}
	return sum, nil
}

// SetKey gives the guest the data plane's key (see AcceptData).
func (c *Client) SetKey(ctx context.Context, key string) error {
	if !validKey(key) {
		return fmt.Errorf("agent: key must be %d hex digits", KeyHexLen)
	}
	resp, err := c.Do(ctx, VerbKey, key)
	if err != nil {
		return err
	}
	_, err = expect(resp, VerbKey)
	return err
}

// Uptime returns the guest's uptime, counter and boot id.
func (c *Client) Uptime(ctx context.Context) (Uptime, error) {
	resp, err := c.Do(ctx, VerbUptime)
	if err != nil {
		return Uptime{}, err
	}
	rest, err := expect(resp, VerbUptime)
	if err != nil {
		return Uptime{}, err
	}
	f := strings.Fields(rest)
	if len(f) != 3 {
		return Uptime{}, fmt.Errorf("agent: bad uptime response %q", resp)
	}
	ns, err1 := strconv.ParseInt(f[0], 10, 64)
	cnt, err2 := strconv.ParseUint(f[1], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return Uptime{}, fmt.Errorf("agent: bad uptime response %q: %w", resp, err)
	}
	return Uptime{Since: time.Duration(ns), Counter: cnt, BootID: f[2]}, nil
}

// WaitReady dials path and asks "ready" until the agent answers or ctx ends; every
// attempt is bounded by interval, since bytes sent before the guest opened its
// serial port are lost. On success the connected client is returned.
func WaitReady(ctx context.Context, path string, interval time.Duration) (*Client, error) {
	var last error
	for {
		c, err := Dial(ctx, path)
		if err == nil {
			for {
				actx, cancel := context.WithTimeout(ctx, interval)
				err = c.Ready(actx)
				cancel()
				if err == nil {
					return c, nil
				}
				last = err
				var re *RemoteError
				if ctx.Err() != nil || errors.As(err, &re) || !errors.Is(err, context.DeadlineExceeded) {
					break
				}
			}
			_ = c.Close()
		} else {
			last = err
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("agent: not ready: %w (last: %w)", ctx.Err(), last)
		}
		t := time.NewTimer(interval)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("agent: not ready: %w (last: %w)", ctx.Err(), last)
		case <-t.C:
		}
	}
}
