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
//
// dispatch has authenticated the caller, after portPre.
func (s *Server) handlePort(w http.ResponseWriter, r *http.Request, id auth.Identity) error {
	port, err := pathPort(r)
	if err != nil {
		return err
	}
	root := id.Kind == auth.Root
	return s.serveUpgrade(w, r, upgrade{
		kind: fsm.RelayPort, port: int(port), passive: root, proto: "tcp",
		dial: func(ctx context.Context, vm guestVM) (net.Conn, error) {
			return s.data.dialPort(ctx, vm, uint16(port))
		},
		unreachable: "guest port unreachable",
	})
}

// portPre is the ports route's checks before the token (hiddenRoute.pre),
// in the old daemon's order: the upgrade, then the port.
func portPre(w http.ResponseWriter, r *http.Request) error {
	if err := upgradeRequired(w, r, "tcp"); err != nil {
		return err
	}
	_, err := pathPort(r)
	return err
}

// pathPort is the route's {port}: 1-65535, decimal digits only.
func pathPort(r *http.Request) (uint64, error) {
	port, err := strconv.ParseUint(r.PathValue("port"), 10, 16)
	if err != nil || port == 0 {
		return 0, errorf(http.StatusBadRequest, "port must be 1-65535")
	}
	return port, nil
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
