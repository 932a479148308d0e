package api

import (
	"errors"
	"net/http"

	"github.com/sbxlog/sbxlog/executors"
	"github.com/sbxlog/sbxlog/fsm"
)

// PoolSupport says whether this node can serve a pool key at all, asked by
// POST /v1/claim and PUT /v1/pools before anything is proposed: what the
// node cannot do is a 4xx naming it at once, and leaves no event and no
// pool behind, instead of a boot that fails later (500 provisioning
// failed) or a pool that never fills. The hypervisor driver implements it
// (the node wires it, Options.Pools); without one every key is taken.
type PoolSupport interface {
	// CheckPool returns nil when the node can serve key, an error wrapping
	// executors.ErrUnknownTemplate when its template does not exist here,
	// or executors.ErrNetUnsupported when its net cannot be given here.
	// pooled says a pool of key is configured (a driver that makes
	// templates up for pools, chsim's, makes them only then).
	CheckPool(key fsm.PoolKey, pooled bool) error
	// Templates lists, sorted, the templates the driver boots from its own
	// files, for any net and size (GET /v1/templates' images).
	Templates() []string
}

// checkPool asks the node's PoolSupport about key and maps its answer:
// an unknown template is the old daemon's 404 "unknown template" (naming
// it), a net the node cannot give is 409 with the reason, as the old
// daemon answered its egress refusals.
func (s *Server) checkPool(key fsm.PoolKey, pooled bool) error {
	if s.pools == nil {
		return nil
	}
	err := s.pools.CheckPool(key, pooled)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, executors.ErrUnknownTemplate):
		return errorf(http.StatusNotFound, "%s %s", errUnknownTemplate, key.Template)
	case errors.Is(err, executors.ErrNetUnsupported):
		return errorf(http.StatusConflict, "pool %s: %v", key, err)
	default:
		return err
	}
}

// errUnknownTemplate is the old daemon's text for a template it does not
// have.
const errUnknownTemplate = "unknown template"
