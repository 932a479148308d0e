package api

import (
	"crypto/rand"
	"encoding/hex"
	"net/http"

	"github.com/sbxlog/sbxlog/projections/origin"
)

// Sandbox ids name their origin (package origin, issue 26). A sandbox this
// node does not hold may be one whose creation has not reached the cluster
// view yet: its owner answered the claim from its own log, and the event is
// still on the way to the stream (a NATS server lost, publishing behind).
// No feed or heartbeat can close that window, so the id itself says who
// minted it. For an id the view does not place, the node asks the nodes
// with that tag, and says 404 only when they said it holds nothing live and
// the view is current. A tag that no node in the view has is one of a node
// never seen here (the view decides, as before) or an id this fleet never
// minted.

// newClaimID mints "sb_" + 16 hex digits: with tag (origin.NodeTag of this
// node) its first 4, the rest from the system's randomness.
func newClaimID(tag string) string {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("crypto/rand failed: " + err.Error())
	}
	id := hex.EncodeToString(b[:])
	if len(tag) == 4 {
		id = tag + id[4:]
	}
	return "sb_" + id
}

// OriginLocator is implemented by a Redirector that can name the nodes a
// claim id's tag may stand for.
type OriginLocator interface {
	// Origins returns the nodes other than this one whose origin.NodeTag
	// is tag, with what the view knows of each (Addr "" when never
	// announced).
	Origins(tag string) []OwnerLocation
}

// askOrigins asks the origins of id, an id neither this node nor its view
// holds: ownedElsewhere when one holds it live, an ownerAway (503) naming
// an origin that could not answer, nil when every origin said it holds
// nothing (or none is known), so the view decides. A question from another
// node (origin.ProbeHeader) is not passed on.
func (s *Server) askOrigins(r *http.Request, id string) error {
	ol, ok := s.redir.(OriginLocator)
	if !ok || r.Header.Get(origin.ProbeHeader) != "" {
		return nil
	}
	var away error
	for _, o := range ol.Origins(origin.IDTag(id)) {
		addr, err := origin.Ask(r.Context(), o.Addr, id, r.Header.Get("Authorization"))
		switch {
		case err != nil:
			away = awayFrom(id, o, true)
		case addr != "":
			return &ownedElsewhere{addr: addr}
		}
	}
	return away
}
