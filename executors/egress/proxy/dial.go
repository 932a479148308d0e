package proxy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"syscall"

	"github.com/sbxlog/sbxlog/executors/netguard"
)

// blockedError is a dial the guard refused: every address the name had
// was refused (or the one it was).
type blockedError struct {
	host string
	ip   netip.Addr
	err  error
}

func (e *blockedError) Error() string {
	return fmt.Sprintf("blocked internal address %s (for %s): %v", e.addr(), e.host, e.err)
}

// addr is the address refused, or the host when there was none.
func (e *blockedError) addr() string {
	if e.ip.IsValid() {
		return e.ip.String()
	}
	return e.host
}

func (e *blockedError) Unwrap() error { return e.err }

// errZoned refuses a host with an IPv6 zone.
var errZoned = fmt.Errorf("%w: the host has a zone", netguard.ErrInternal)

func isBlocked(err error) bool {
	var b *blockedError
	return errors.As(err, &b)
}

// dial connects to host:port: the name resolved here (never by the guest),
// each address checked by the node's guard (executors/netguard: it judges
// the address a v4-mapped or NAT64 one reaches, and refuses any zoned
// one) before the connect and again, as the kernel is asked to connect
// it, in the dialer's Control hook. Addresses the guard refuses are
// skipped; when none is left the error is a blockedError (502, reason
// internal). A host with a zone ("%") is refused before anything: no
// destination on the internet has one.
func (s *Server) dial(ctx context.Context, host string, port uint16) (net.Conn, error) {
	if strings.ContainsRune(host, '%') {
		return nil, &blockedError{host: host, err: errZoned}
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	var addrs []netip.Addr
	if ip, err := netip.ParseAddr(strings.Trim(host, "[]")); err == nil {
		addrs = []netip.Addr{ip}
	} else {
		if addrs, err = s.cfg.Lookup(ctx, host); err != nil {
			return nil, fmt.Errorf("resolve %s: %w", host, err)
		}
		if len(addrs) == 0 {
			return nil, fmt.Errorf("resolve %s: no address", host)
		}
	}
	var blocked, last error
	for _, ip := range addrs {
		ip = netguard.Unwrap(ip)
		if err := s.guard.Check(ip, port); err != nil {
			if blocked == nil {
				blocked = &blockedError{host: host, ip: ip, err: err}
			}
			continue
		}
		d := net.Dialer{Control: func(_, address string, _ syscall.RawConn) error {
			if err := s.guard.CheckAddr(address); err != nil {
				b := &blockedError{host: host, err: err}
				var be *netguard.BlockedError
				if errors.As(err, &be) {
					b.ip = be.Addr
				}
				return b
			}
			return nil
		}}
		var c net.Conn
		err := s.cfg.DialIn(func() error {
			var err error
			c, err = d.DialContext(ctx, "tcp", netip.AddrPortFrom(ip, port).String())
			return err
		})
		if err == nil {
			return c, nil
		}
		if isBlocked(err) && blocked == nil {
			blocked = err
		}
		last = err
	}
	if last == nil {
		return nil, blocked
	}
	return nil, last
}

// splitHostPort splits an authority; def is the port when there is none
// (0: required). The port must be 1-65535; a host with a zone ("%", as
// in "[::%25x]" once unescaped) is a bad authority.
func splitHostPort(authority string, def uint16) (string, uint16, error) {
	host, ps, err := net.SplitHostPort(authority)
	if err != nil {
		if def == 0 || strings.Contains(err.Error(), "too many colons") && !strings.HasPrefix(authority, "[") {
			return "", 0, fmt.Errorf("bad authority %q", authority)
		}
		host, ps = strings.Trim(authority, "[]"), strconv.Itoa(int(def))
	}
	p, err := strconv.ParseUint(ps, 10, 16)
	if err != nil || p == 0 || host == "" || strings.ContainsRune(host, '%') {
		return "", 0, fmt.Errorf("bad authority %q", authority)
	}
	return strings.ToLower(host), uint16(p), nil
}
