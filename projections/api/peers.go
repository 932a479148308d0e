package api

import (
	"net/http"

	"github.com/sbxlog/sbxlog/projections/auth"
)

// PeerLister is implemented by a Redirector that also knows the other live
// nodes: GET /v1/peers and GET /v1/info's "peers" list them.
type PeerLister interface {
	// Peers returns the other live nodes' client addresses (host:port),
	// this node left out.
	Peers() []string
}

// peers returns the other nodes' addresses from the cluster view; nil
// without one (no replication).
func (s *Server) peers() []string {
	if pl, ok := s.redir.(PeerLister); ok {
		return pl.Peers()
	}
	return nil
}

// handlePeers answers GET /v1/peers: {"peers": [...]}, [] on a single node
// (the old SDKs fan out over these for lookups and cluster-wide calls).
func (s *Server) handlePeers(w http.ResponseWriter, _ *http.Request, _ auth.Identity) error {
	out := s.peers()
	if out == nil {
		out = []string{}
	}
	writeJSON(w, http.StatusOK, map[string][]string{"peers": out})
	return nil
}
