package api

import (
	"net/http"

	"github.com/sbxlog/sbxlog/fsm"
)

// A claim that ended is kept a while (list with state=); a caller who may
// see it (its token, its tenant, root) is told what happened to it rather
// than the 404 of an id that never existed: 410 Gone naming the end and
// when. A caller who may not see it still gets the hidden routes' 404.
// Release is the exception: an ended claim's release stays the idempotent
// 204 (the old SDKs take 404 and 204 alike as "already gone", and
// nothing else there depends on the status).

// endedError is the answer about c, which has ended.
func endedError(c *fsm.ClaimRec) error {
	at := rfc3339(c.Ended)
	switch c.Status {
	case fsm.ClaimExpired:
		return errorf(http.StatusGone, "sandbox %s expired at %s (its deadline passed; renew extends a live one)", c.ID, at)
	case fsm.ClaimFailed:
		return errorf(http.StatusGone, "sandbox %s failed at %s: %s", c.ID, at, c.Reason)
	}
	return errorf(http.StatusGone, "sandbox %s was %s at %s", c.ID, c.Status, at)
}

// goneOrUnknown is the answer about claim id once the state says it is not
// live: 410 while the state keeps it, else the 404 of an unknown id.
func (s *Server) goneOrUnknown(id string) error {
	if c, ok := s.claim(id); ok && !c.Status.Live() {
		return endedError(&c)
	}
	return errorf(http.StatusNotFound, "%s", errUnknownSandbox)
}
