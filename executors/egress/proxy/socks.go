package proxy

import (
	"context"
	"encoding/binary"
	"io"
	"net"
	"net/netip"
	"strings"
	"time"

	"github.com/sbxlog/sbxlog/fsm/egress"
)

// SOCKS5 (RFC 1928) constants the door speaks.
const (
	socksVersion   = 0x05
	socksNoAuth    = 0x00
	socksNoMethods = 0xff
	socksConnect   = 0x01
	atypIPv4       = 0x01
	atypDomain     = 0x03
	atypIPv6       = 0x04

	socksOK          = 0x00
	socksFailure     = 0x01
	socksNotAllowed  = 0x02
	socksUnreachable = 0x04
	socksBadCommand  = 0x07
	socksBadAddress  = 0x08
)

// socksReply answers with code and an all-zero IPv4 bound address: the
// node's own address stays out of the guest.
func socksReply(c net.Conn, code byte) error {
	_, err := c.Write([]byte{socksVersion, code, 0, atypIPv4, 0, 0, 0, 0, 0, 0})
	return err
}

// serveSocks runs one SOCKS5 connection: no-auth only, CONNECT only, the
// target name resolved host-side, decided as a tunnel that is never
// intercepted.
func (d *door) serveSocks(c *trackedConn) {
	if !d.track(c) {
		c.Close()
		return
	}
	defer d.untrack(c)
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(d.s.cfg.Timeout))
	hdr := make([]byte, 2)
	if _, err := io.ReadFull(c, hdr); err != nil || hdr[0] != socksVersion {
		return
	}
	methods := make([]byte, hdr[1])
	if _, err := io.ReadFull(c, methods); err != nil {
		return
	}
	if !strings.ContainsRune(string(methods), socksNoAuth) {
		_, _ = c.Write([]byte{socksVersion, socksNoMethods})
		return
	}
	if _, err := c.Write([]byte{socksVersion, socksNoAuth}); err != nil {
		return
	}
	req := make([]byte, 4)
	if _, err := io.ReadFull(c, req); err != nil || req[0] != socksVersion {
		return
	}
	if req[1] != socksConnect {
		_ = socksReply(c, socksBadCommand)
		return
	}
	var host string
	switch req[3] {
	case atypIPv4, atypIPv6:
		n := 4
		if req[3] == atypIPv6 {
			n = 16
		}
		b := make([]byte, n)
		if _, err := io.ReadFull(c, b); err != nil {
			return
		}
		ip, _ := netip.AddrFromSlice(b)
		host = ip.String()
	case atypDomain:
		l := make([]byte, 1)
		if _, err := io.ReadFull(c, l); err != nil {
			return
		}
		b := make([]byte, l[0])
		if _, err := io.ReadFull(c, b); err != nil {
			return
		}
		if len(b) == 0 {
			_ = socksReply(c, socksFailure)
			return
		}
		host = strings.ToLower(string(b))
	default:
		_ = socksReply(c, socksBadAddress)
		return
	}
	pb := make([]byte, 2)
	if _, err := io.ReadFull(c, pb); err != nil {
		return
	}
	port := binary.BigEndian.Uint16(pb)

	sb, known := d.s.pol.SandboxOfVM(d.vm)
	if known {
		d.served(sb)
	}
	pol := d.s.policy(sb, known)
	var dec egress.Decision
	switch {
	case !pol.Valid():
		dec = egress.Decision{Reason: egress.ReasonNoPolicy}
	case !pol.ServesSocks():
		dec = egress.Decision{Reason: ReasonNoSocks}
	default:
		// A tunnel the policy wants intercepted is denied here: there is
		// no HTTP to filter on this door (DecideTunnel's Socks).
		dec = egress.DecideTunnel(pol, host, port, egress.Tunnel{CanIntercept: d.s.cfg.CA != nil && pol.Intercepts(), Socks: true})
	}
	if !dec.Allow {
		d.s.record(sb, doorSocks, dec)
		_ = socksReply(c, socksNotAllowed)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), d.s.cfg.Timeout)
	up, err := d.s.dial(ctx, host, port)
	cancel()
	if err != nil {
		dec.Allow, dec.Reason = false, egress.ReasonUpstream
		if isBlocked(err) {
			dec.Reason = egress.ReasonInternal
		}
		d.s.record(sb, doorSocks, dec)
		_ = socksReply(c, socksUnreachable)
		return
	}
	d.s.record(sb, doorSocks, dec)
	if !d.track(up) {
		up.Close()
		return
	}
	defer d.untrack(up)
	if err := socksReply(c, socksOK); err != nil {
		up.Close()
		return
	}
	_ = c.SetDeadline(time.Time{})
	f := d.newFlow(sb)
	defer d.endFlow(f)
	splice(c, up, f)
}
