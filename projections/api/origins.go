package api

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"time"

	"github.com/sbxlog/sbxlog/fsm"
)

// Sandbox ids name their origin (issue 26). A sandbox this node does not
// hold may be one whose creation has not reached the cluster view yet: its
// owner answered the claim from its own log, and the event is still on the
// way to the stream (a NATS server lost, publishing behind). No feed or
// heartbeat can close that window, so the id itself says who minted it:
// the first 4 of its 16 hex digits are the minting node's tag (NodeTag),
// the other 12 random. For an id the view does not place, the node asks
// the nodes with that tag (GET .../owner, answered from their own state and
// view, never passed on: originProbeHeader), and says 404 only when they
// said it holds nothing live and the view is current. A tag that no node in
// the view has is one of a node never seen here (the view decides, as
// before) or an id this fleet never minted.

// NodeTag is the 4 hex digits that node's claim ids start with.
func NodeTag(node string) string {
	h := sha256.Sum256([]byte(node))
	return hex.EncodeToString(h[:2])
}

// IDTag is the tag of claim id ("" when id is not a claim id).
func IDTag(id string) string {
	if !fsm.ValidClaimID(id) {
		return ""
	}
	return id[3:7]
}

// newClaimID mints "sb_" + 16 hex digits: with tag (NodeTag of this node)
// its first 4, the rest from the system's randomness.
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
	// Origins returns the nodes other than this one whose NodeTag is tag,
	// with what the view knows of each (Addr "" when never announced).
	Origins(tag string) []OwnerLocation
}

// originProbeHeader marks a node's question to the origin of an id: the
// answer comes from the asked node's own state and view, and is not passed
// on to further origins (no loops when two nodes share a tag).
const originProbeHeader = "X-Sbxlog-Origin-Probe"

// originProbeWait bounds one question to an origin: a node that does not
// answer within it is unreachable (the 503 naming it).
const originProbeWait = time.Second

// askOrigins asks the origins of id, an id neither this node nor its view
// holds: ownedElsewhere when one holds it live, an ownerAway (503) naming
// an origin that could not answer, nil when every origin said it holds
// nothing (or none is known), so the view decides.
func (s *Server) askOrigins(r *http.Request, id string) error {
	ol, ok := s.redir.(OriginLocator)
	if !ok || r.Header.Get(originProbeHeader) != "" {
		return nil
	}
	var away error
	for _, o := range ol.Origins(IDTag(id)) {
		addr, err := s.askOrigin(r, id, o.Addr)
		switch {
		case err != nil:
			away = &ownerAway{id: id, loc: o, asked: true}
		case addr != "":
			return &ownedElsewhere{addr: addr}
		}
	}
	return away
}

// askOrigin asks the node at addr for id's owner with the caller's
// credentials: the owner's address, "" when it says no node holds id live
// (404), an error when it could not tell.
func (s *Server) askOrigin(r *http.Request, id, addr string) (string, error) {
	if addr == "" {
		return "", errOriginUnknown
	}
	ctx, cancel := context.WithTimeout(r.Context(), originProbeWait)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/v1/sandboxes/"+url.PathEscape(id)+"/owner", nil)
	if err != nil {
		return "", err
	}
	req.Header.Set("Authorization", r.Header.Get("Authorization"))
	req.Header.Set(originProbeHeader, "1")
	resp, err := originClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusOK:
		var body struct {
			OwnerAddr string `json:"owner_addr"`
		}
		if err := json.NewDecoder(io.LimitReader(resp.Body, MaxBody)).Decode(&body); err != nil || body.OwnerAddr == "" {
			return "", errOriginUnknown
		}
		return body.OwnerAddr, nil
	case http.StatusNotFound:
		return "", nil
	}
	return "", errOriginUnknown
}

// errOriginUnknown: the origin's answer said neither "held" nor "not held".
var errOriginUnknown = errorf(http.StatusServiceUnavailable, "origin could not tell")

// originClient asks origins; its own timeout is per request (ctx).
var originClient = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4, IdleConnTimeout: 30 * time.Second}}
