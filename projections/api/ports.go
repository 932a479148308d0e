package api

import (
	"context"
	"net"
	"net/http"
	"strconv"

	"github.com/sbxlog/sbxlog/executors/guest/silkd"
	"github.com/sbxlog/sbxlog/fsm"
	"github.com/sbxlog/sbxlog/projections/auth"
)

// handlePort is GET /v1/sandboxes/{id}/ports/{port} with "Upgrade: tcp":
// 101 and a raw relay to the guest's TCP port, reached through the guest
// agent's port_forward (the old daemon's way: no vsock port of its own).
// The sandbox's token wakes a hibernated sandbox; root's token is an
// operator's passive relay: it never wakes one (409 unless running) and
// holds its idle clock without counting as activity.
func (s *Server) handlePort(w http.ResponseWriter, r *http.Request, _ auth.Identity) error {
	if err := requireBearer(r); err != nil {
		return err
	}
	if err := upgradeRequired(w, r, "tcp"); err != nil {
		return err
	}
	port, err := strconv.ParseUint(r.PathValue("port"), 10, 16)
	if err != nil || port == 0 {
		return errorf(http.StatusBadRequest, "port must be 1-65535")
	}
	root, err := s.sandboxCaller(r, true)
	if err != nil {
		return err
	}
	return s.serveUpgrade(w, r, upgrade{
		kind: fsm.RelayPort, port: int(port), passive: root, proto: "tcp",
		dial: func(ctx context.Context, vm guestVM) (net.Conn, error) {
			return s.data.dialPort(ctx, vm, uint16(port))
		},
		unreachable: "guest port unreachable",
	})
}

// dialPort reaches guest port port through the agent: a connection whose
// reads are the port's bytes, whose writes go to it and whose CloseWrite
// half-closes it.
func (d *dataPlane) dialPort(ctx context.Context, vm guestVM, port uint16) (net.Conn, error) {
	nc, err := d.dialGuest(ctx, vm)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, d.opts.DialTimeout)
	defer cancel()
	pc, err := silkd.NewConn(nc).PortForward(ctx, port)
	if err != nil {
		nc.Close()
		return nil, err
	}
	return pc, nil
}
