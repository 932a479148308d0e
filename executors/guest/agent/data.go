package agent

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"time"

	"github.com/sbxlog/sbxlog/executors/handshake"
)

// The data plane's handshake (see the package doc): a mutual
// challenge-response over the two sides' fresh nonces, so the key never
// crosses the wire and each side proves it holds it.
const (
	verbHello = "HELLO" // host: HELLO <host nonce>
	verbProof = "PROOF" // guest: PROOF <guest nonce> <guest MAC>; host: PROOF <host MAC>
	answerOK  = "OK"    // guest: the host proved the key; silkd frames follow

	// nonceLen is the size of each side's nonce, macLen of a proof.
	nonceLen = 32
	macLen   = sha256.Size

	// The direction labels make a proof valid one way only, so neither
	// side's proof can be reflected back to it as the other's.
	labelGuest = "sbxlog data plane v1 guest"
	labelHost  = "sbxlog data plane v1 host"

	// Bounds of the handshake lines (without their newline).
	maxHelloLine      = len(verbHello) + 1 + 2*nonceLen
	maxGuestProofLine = len(verbProof) + 1 + 2*nonceLen + 1 + 2*macLen
	maxHostProofLine  = len(verbProof) + 1 + 2*macLen
)

// ErrDataRefused: the other side of a data connection did not complete the
// handshake: the agent closed it (it holds another key, or was never given
// one) or answered something else, or (ErrGuestUnproven) the guest could not
// prove the key.
var ErrDataRefused = errors.New("agent: data connection refused")

// ErrGuestUnproven (which wraps ErrDataRefused) is the host refusing a
// listener that could not prove it holds the key: an agent with a stale key,
// or a process that is not the guest at all. Nothing but the host's nonce
// was sent to it.
var ErrGuestUnproven = fmt.Errorf("%w: the guest did not prove the key", ErrDataRefused)

// ErrBadKey: a data key that is not KeyHexLen hex digits.
var ErrBadKey = fmt.Errorf("agent: data key must be %d hex digits", KeyHexLen)

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
	k, err := decodeKey(key)
	if err != nil {
		return nil, err
	}
	var d net.Dialer
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	c := nc.(*net.TCPConn)
	if err := dataHandshake(ctx, c, k); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

func decodeKey(key string) ([]byte, error) {
	if !validKey(key) {
		return nil, ErrBadKey
	}
	return hex.DecodeString(key)
}

// proof is a side's MAC over both nonces under its direction label.
func proof(key []byte, label string, hostNonce, guestNonce []byte) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(label))
	m.Write([]byte{0})
	m.Write(hostNonce)
	m.Write(guestNonce)
	return m.Sum(nil)
}

func nonce() ([]byte, error) {
	b := make([]byte, nonceLen)
	_, err := rand.Read(b)
	return b, err
}

// hexField decodes a handshake field of exactly n bytes.
func hexField(f string, n int) ([]byte, bool) {
	if len(f) != 2*n {
		return nil, false
	}
	b, err := hex.DecodeString(f)
	return b, err == nil
}

// dataHandshake is the host's side: HELLO, check the guest's PROOF, send
// its own, read OK. It sends nothing past its nonce to a listener that
// cannot prove the key.
func dataHandshake(ctx context.Context, c net.Conn, key []byte) error {
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	hn, err := nonce()
	if err != nil {
		return err
	}
	// An I/O failure is the agent closing the connection (a refusal), or the
	// context's end.
	ioErr := func(err error) error {
		if cerr := ctx.Err(); cerr != nil {
			return fmt.Errorf("agent: data handshake: %w", cerr)
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			// The deadline is the context's, which may not report it yet.
			return fmt.Errorf("agent: data handshake: %w (%w)", context.DeadlineExceeded, err)
		}
		return fmt.Errorf("%w: %w", ErrDataRefused, err)
	}
	if _, err := io.WriteString(c, verbHello+" "+hex.EncodeToString(hn)+"\n"); err != nil {
		return ioErr(err)
	}
	line, err := readHandshakeLine(c, maxGuestProofLine)
	if err != nil {
		return ioErr(err)
	}
	f := strings.Split(line, " ")
	if len(f) != 3 || f[0] != verbProof {
		return fmt.Errorf("%w: answered %q", ErrGuestUnproven, line)
	}
	gn, ok1 := hexField(f[1], nonceLen)
	gmac, ok2 := hexField(f[2], macLen)
	if !ok1 || !ok2 || !hmac.Equal(gmac, proof(key, labelGuest, hn, gn)) {
		return ErrGuestUnproven
	}
	if _, err := io.WriteString(c, verbProof+" "+hex.EncodeToString(proof(key, labelHost, hn, gn))+"\n"); err != nil {
		return ioErr(err)
	}
	line, err = readHandshakeLine(c, len(answerOK))
	if err != nil {
		return ioErr(err)
	}
	if line != answerOK {
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
// connection, with the key currently set (key "" refuses everyone): within
// timeout the host must send HELLO with its nonce, is answered with the
// guest's nonce and proof, and must send its own proof; then the agent
// answers OK and clears the deadline. On failure (wrapping ErrDataRefused)
// the caller closes c.
func AcceptData(c net.Conn, key string, timeout time.Duration) error {
	if key == "" {
		return fmt.Errorf("%w: no key yet", ErrDataRefused)
	}
	k, err := decodeKey(key)
	if err != nil {
		return err
	}
	_ = c.SetDeadline(time.Now().Add(timeout))
	line, err := readHandshakeLine(c, maxHelloLine)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrDataRefused, err)
	}
	arg, ok := strings.CutPrefix(line, verbHello+" ")
	hn, ok2 := hexField(arg, nonceLen)
	if !ok || !ok2 {
		return fmt.Errorf("%w: bad hello", ErrDataRefused)
	}
	gn, err := nonce()
	if err != nil {
		return err
	}
	if _, err := io.WriteString(c, verbProof+" "+hex.EncodeToString(gn)+" "+hex.EncodeToString(proof(k, labelGuest, hn, gn))+"\n"); err != nil {
		return fmt.Errorf("%w: %w", ErrDataRefused, err)
	}
	line, err = readHandshakeLine(c, maxHostProofLine)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrDataRefused, err)
	}
	arg, ok = strings.CutPrefix(line, verbProof+" ")
	hmac2, ok2 := hexField(arg, macLen)
	if !ok || !ok2 || !hmac.Equal(hmac2, proof(k, labelHost, hn, gn)) {
		return fmt.Errorf("%w: the host did not prove the key", ErrDataRefused)
	}
	if _, err := io.WriteString(c, answerOK+"\n"); err != nil {
		return err
	}
	return c.SetDeadline(time.Time{})
}
