package api

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/sbxlog/sbxlog/fsm"
	"github.com/sbxlog/sbxlog/projections/auth"
	"github.com/sbxlog/sbxlog/projections/relay"
)

// switching is the upgrade's answer, byte for byte the old daemon's
// ("HTTP/1.1 101 Switching Protocols", Upgrade, Connection), written only
// once the guest is reached, so a slow wake delays it and the client waits.
func switching(proto string) string {
	return fmt.Sprintf("HTTP/1.1 %d Switching Protocols\r\nUpgrade: %s\r\nConnection: Upgrade\r\n\r\n", http.StatusSwitchingProtocols, proto)
}

// Client TCP keepalive on a relay: a client that dies without a FIN ends
// its relay within about two minutes (the old daemon's settings).
var relayKeepAlive = net.KeepAliveConfig{Enable: true, Idle: 60 * time.Second, Interval: 15 * time.Second, Count: 4}

// handleAgent is GET /v1/sandboxes/{id}/agent with "Upgrade: silkd": once
// the guest agent is reached (the sandbox woken first if hibernated), 101
// and a byte relay to it. Only the sandbox's own token opens it.
//
// dispatch has authenticated the caller, after agentPre.
func (s *Server) handleAgent(w http.ResponseWriter, r *http.Request, _ auth.Identity) error {
	return s.serveUpgrade(w, r, upgrade{kind: fsm.RelayAgent, proto: "silkd", dial: s.data.dialGuest})
}

// agentPre is the agent route's check before the token (hiddenRoute.pre),
// in the old daemon's order. It also comes before the lookup and any
// wake: waking spends the hibernate snapshot, which a plain GET must not.
func agentPre(w http.ResponseWriter, r *http.Request) error { return upgradeRequired(w, r, "silkd") }

// upgradeRequired answers 426 unless the request asks to upgrade to proto;
// like the old daemon it reads Upgrade alone, case-insensitively.
func upgradeRequired(w http.ResponseWriter, r *http.Request, proto string) error {
	if strings.EqualFold(strings.TrimSpace(r.Header.Get("Upgrade")), proto) {
		return nil
	}
	w.Header().Set("Upgrade", proto)
	return errorf(http.StatusUpgradeRequired, "upgrade to %s required", proto)
}

// upgrade is what differs between the agent and ports relays.
type upgrade struct {
	kind    string
	port    int
	passive bool
	proto   string // what the 101 upgrades to
	// dial reaches the guest end: the agent, or a port through it.
	dial func(context.Context, guestVM) (net.Conn, error)
	// unreachable is the 502's message (default errGuestUnreachable).
	unreachable string
}

// serveUpgrade readies the guest, reaches it, records the relay open,
// answers 101 and relays until either side ends, then records it closed.
// Bytes the client sent behind its request head are relayed first.
func (s *Server) serveUpgrade(w http.ResponseWriter, r *http.Request, u upgrade) error {
	o, err := s.data.open(r, r.PathValue("id"), u.kind, u.port, u.passive, u.dial)
	if err != nil {
		var ge *guestError
		if errors.As(err, &ge) {
			msg := u.unreachable
			if msg == "" {
				msg = errGuestUnreachable
			}
			s.zl.Debug().Err(err).Str("sandbox", r.PathValue("id")).Msg("api: guest not reached")
			return errorf(http.StatusBadGateway, "%s", msg)
		}
		return err
	}
	conn, buf, err := http.NewResponseController(w).Hijack()
	if err != nil {
		o.guest.Close()
		s.data.close(o, relay.Result{Reason: "error"})
		return errorf(http.StatusInternalServerError, "connection cannot be hijacked")
	}
	pending, _ := buf.Reader.Peek(buf.Reader.Buffered())
	pending = append([]byte(nil), pending...)
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetKeepAliveConfig(relayKeepAlive)
	}
	_ = conn.SetDeadline(time.Time{})
	// Written raw: net/http has handed the connection over.
	if _, err := conn.Write([]byte(switching(u.proto))); err != nil {
		conn.Close()
		o.guest.Close()
		s.data.close(o, relay.Result{Reason: relay.ReasonClient})
		return nil
	}
	if relay.Spliceable(o.guest, conn) && relay.Spliceable(conn, o.guest) {
		// Both directions run in the kernel: no copy buffer to hold.
		o.mem.shrink(relayMemory(u.kind) - relayCopyMemory)
	}
	rl := relay.Splice(conn, o.guest, s.data.relayOptions())
	if reason := o.live.attach(rl.Stop); reason != "" {
		rl.Stop(reason)
	}
	res := rl.Run(pending)
	s.data.close(o, res)
	return nil
}
