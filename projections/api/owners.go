package api

import (
	"errors"
	"fmt"
	"net/http"
	"time"
)

// Owner answers for sandboxes this node does not hold. A Redirector names
// a live owner (OwnerOf: reads answer with its owner_addr, changes are a
// 404 naming it). When the cluster view knows the owner but not as live
// (it stopped, died, or has not been seen yet), or cannot tell because its
// own feed is interrupted, "unknown sandbox" would make a client abandon a
// sandbox that survives its owner's restart: the answer is a 503 that
// says so, naming the owner and when it was last seen.

// OwnerLocator is implemented by a Redirector that also knows owners that
// are not live, and whether its view can be trusted to say "no owner".
type OwnerLocator interface {
	// LocateOwner is asked when OwnerOf named no live owner for id.
	LocateOwner(id string) OwnerLocation
}

// OwnerLocation is what the cluster view knows of a sandbox it has no live
// owner for.
type OwnerLocation struct {
	// Node is the owner's node id; "" when no other node holds the sandbox
	// (as far as the view knows).
	Node string
	// Addr is the owner's last announced owner_addr ("" never seen).
	Addr string
	// LastSeen is the owner's last heartbeat (zero: never seen).
	LastSeen time.Time
	// Withdrawn: the owner withdrew as it stopped.
	Withdrawn bool
	// ViewBehind: the view's feed is not delivering (since ViewSince), so
	// a sandbox created elsewhere meanwhile may be missing from it.
	ViewBehind bool
	ViewSince  time.Time
}

// ownerAway is visible's answer for a sandbox whose owner is known but
// not live, or that a lagging view cannot place: a 503 naming the owner.
type ownerAway struct {
	id  string
	loc OwnerLocation
	// asked: loc is the id's origin, which did not answer whether it
	// holds the sandbox (askOrigins).
	asked bool
	// status is its answer's (set where it is made, so the docs test's
	// reading of the handlers finds it).
	status int
}

// awayFrom is the 503 ownerAway of sandbox id at loc.
func awayFrom(id string, loc OwnerLocation, asked bool) *ownerAway {
	return &ownerAway{id: id, loc: loc, asked: asked, status: http.StatusServiceUnavailable}
}

func (o *ownerAway) Error() string {
	if o.asked {
		return fmt.Sprintf("sandbox %s was created by node %s (%s), which this node's view has not caught up with and which could not be asked (last seen %s): retry",
			o.id, o.loc.Node, o.loc.Addr, stamp(o.loc.LastSeen))
	}
	if o.loc.Node == "" {
		return fmt.Sprintf("sandbox %s is not on this node, and the cluster view has not been current since %s: its owner cannot be named; retry",
			o.id, stamp(o.loc.ViewSince))
	}
	why := "is not announcing"
	switch {
	case o.loc.Withdrawn:
		why = "stopped (withdrew)"
	case o.loc.LastSeen.IsZero():
		why = "has not been seen yet"
	}
	return fmt.Sprintf("sandbox %s is owned by node %s (%s), which %s; last seen %s: retry once it is back",
		o.id, o.loc.Node, o.loc.Addr, why, stamp(o.loc.LastSeen))
}

func stamp(t time.Time) string {
	if t.IsZero() {
		return "never"
	}
	return t.UTC().Format(time.RFC3339Nano)
}

// ownerAwayError is the 503 of an ownerAway.
func ownerAwayError(err error) (error, bool) {
	var oa *ownerAway
	if !errors.As(err, &oa) {
		return nil, false
	}
	he := &httpError{status: oa.status, msg: oa.Error(), retryAfter: "1",
		fields: map[string]string{"owner": oa.loc.Node, "owner_addr": oa.loc.Addr}}
	if !oa.loc.LastSeen.IsZero() {
		he.fields["last_seen"] = stamp(oa.loc.LastSeen)
	}
	return he, true
}

// locateAway returns the answer for sandbox id this node does not hold and
// no live node owns in the view: an ownerAway (503) for an owner the view
// knows but not as live, what the id's origins say (askOrigins), an
// ownerAway while the view is behind, and nil (the plain 404) only when
// the view is current and no origin holds id.
func (s *Server) locateAway(id string, r *http.Request) error {
	var loc OwnerLocation
	if ol, ok := s.redir.(OwnerLocator); ok {
		loc = ol.LocateOwner(id)
	}
	if loc.Node != "" {
		return awayFrom(id, loc, false)
	}
	if err := s.askOrigins(r, id); err != nil {
		return err
	}
	if loc.ViewBehind {
		return awayFrom(id, loc, false)
	}
	return nil
}
