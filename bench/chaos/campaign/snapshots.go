package campaign

// The workload's store recipes (issue 24): checkpoints (of a running or a
// hibernated sandbox), claims from them and their deletes, forks, promotes
// with claims from the promoted template and its delete. Archives need no
// operation of their own: the alt pool archives a hibernated claim
// archiveAfter after its hibernate, and the workload's wake brings it back
// (unarchive, then wake). What each must leave is checked in
// snapchecks.go.

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"

	"github.com/sbxlog/sbxlog/projections/api"
	"github.com/sbxlog/sbxlog/projections/apiclient"
)

// archiveAfter is the alt pool's archive_after_seconds: long enough for the
// workload to record a hibernate snapshot's sums first, short enough that
// a short campaign archives and wakes several.
const archiveAfter = 4

// Bounds on what the workload keeps around, so the store stays small.
const (
	maxCheckpoints = 6
	maxTemplates   = 3
	maxLive        = 8
)

// ckptModel is the campaign's model of one acknowledged checkpoint.
type ckptModel struct {
	id string
	// marker is the data its sandbox's disk held when it was taken: every
	// claim from it starts with it.
	marker string
	// deletes are the outcomes of its deletes that may have taken effect
	// (acked, unknown).
	deletes []string
	busy    bool
}

// tmplModel is the campaign's model of one promote (acked or unknown).
type tmplModel struct {
	key     api.TemplateKey
	outcome string
	marker  string
	deletes []string
	busy    bool
}

// gone reports whether a delete was acked; maybe whether one may have
// taken effect.
func gone(deletes []string) (acked, maybe bool) {
	return slices.Contains(deletes, outAcked), len(deletes) > 0
}

// stateMatches reports whether an observed sandbox state is the state a
// workload operation wants ("" any): an archived sandbox is hibernated,
// its snapshot in the archive store.
func stateMatches(got, want string) bool {
	return want == "" || got == want || (want == "hibernated" && got == "archived")
}

// addAcked adds an acknowledged claim to the model; marker is the data its
// disk starts with (a clone of a checkpoint or a promoted template).
func (c *campaign) addAcked(cr *api.ClaimResponse, marker string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if x, ok := c.claims[cr.ID]; ok {
		// A listing found it before its answer arrived, and maybe
		// released it already: those operations came after the claim.
		x.acked, x.vm, x.deadlines, x.marker, x.template = true, cr.VM, []string{cr.Deadline}, marker, cr.Template
		x.ops = append([]lifeOp{{"claim", outAcked}}, x.ops...)
		return
	}
	c.claims[cr.ID] = &claim{id: cr.ID, vm: cr.VM, acked: true, ops: []lifeOp{{"claim", outAcked}}, deadlines: []string{cr.Deadline}, observed: "running", marker: marker, template: cr.Template}
	c.order = append(c.order, cr.ID)
}

// checkCloneData checks that a new claim's disk starts with the data of
// what it was cloned from.
func (c *campaign) checkCloneData(what string, cr *api.ClaimResponse, marker string) {
	got, err := readMarker(filepath.Join(c.a.DataDir, "run", c.instance(), cr.VM, diskFile))
	if err != nil {
		// The VM may be gone already (a VMM kill, a crash): nothing
		// to read, not a loss.
		c.checked("clones not readable (VM gone first)", 1)
		return
	}
	if got != marker {
		c.violate("claim %s from %s: its disk holds %q, the source held %q", cr.ID, what, got, marker)
		return
	}
	c.checked("clones holding their source's data", 1)
}

// countOp counts a store recipe operation's outcome and logs why one was
// not acknowledged.
func (c *campaign) countOp(op string, err error) string {
	out := outcomeOf(err)
	c.count(op, out)
	if out == outRejected || out == outUnknown {
		c.logf("%s: %s: %v", op, out, err)
	}
	return out
}

// doCheckpoint checkpoints a running or hibernated claim.
func (c *campaign) doCheckpoint(ctx context.Context, cl *apiclient.Client, x *claim) {
	c.mu.Lock()
	n := 0
	for _, k := range c.ckpts {
		if acked, _ := gone(k.deletes); !acked {
			n++
		}
	}
	marker := x.marker
	c.mu.Unlock()
	if n >= maxCheckpoints {
		return
	}
	rec, err := cl.Checkpoint(ctx, x.id, api.CheckpointRequest{})
	if ctx.Err() != nil && err != nil {
		return
	}
	out := c.countOp("checkpoint", err)
	if out != outAcked {
		return
	}
	c.mu.Lock()
	c.ckpts = append(c.ckpts, &ckptModel{id: rec.ID, marker: marker})
	c.mu.Unlock()
}

// pickCkpt marks a random idle acked checkpoint no delete may have removed
// busy.
func (c *campaign) pickCkpt() (*ckptModel, func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return pickIdle(c, c.ckpts, func(k *ckptModel) *bool { return &k.busy }, func(k *ckptModel) bool {
		_, maybe := gone(k.deletes)
		return !maybe
	})
}

// doClaimCheckpoint claims a sandbox from an acked checkpoint: it must be
// claimable, and the new sandbox's disk holds the checkpoint's data.
func (c *campaign) doClaimCheckpoint(ctx context.Context, cl *apiclient.Client) {
	if c.liveCount() >= maxLive {
		return
	}
	k, done := c.pickCkpt()
	if k == nil {
		return
	}
	defer done()
	cr, err := cl.ClaimCheckpoint(ctx, k.id, api.CheckpointClaimRequest{TTLSeconds: 3600})
	if ctx.Err() != nil && err != nil {
		return
	}
	out := c.countOp("ckpt-claim", err)
	switch {
	case out == outAcked:
		c.addAcked(cr, k.marker)
		c.checkCloneData("checkpoint "+k.id, cr, k.marker)
	case apiclient.StatusOf(err) == 404:
		c.violate("acked checkpoint %s (never deleted) is not claimable: %v", k.id, err)
	default:
		if m := claimIDRE.FindString(fmt.Sprint(err)); m != "" {
			c.addPhantom(m, "")
		}
	}
}

// doDeleteCheckpoint deletes an acked checkpoint (maybe twice at once).
func (c *campaign) doDeleteCheckpoint(ctx context.Context, cl *apiclient.Client) {
	k, done := c.pickCkpt()
	if k == nil {
		return
	}
	defer done()
	for _, err := range concurrently(c.duplicates("ckpt-delete"), func() error { return cl.DeleteCheckpoint(ctx, k.id) }) {
		out := c.countOp("ckpt-delete", err)
		if out == outAcked || out == outUnknown {
			c.mu.Lock()
			k.deletes = append(k.deletes, out)
			c.mu.Unlock()
		}
	}
}

// doFork forks a running claim into 1..3 children: an acked fork's
// children all run with the parent's data (the all-or-none rule of an
// unacknowledged one is checked on the log at the end).
func (c *campaign) doFork(ctx context.Context, cl *apiclient.Client, x *claim) {
	count := 1 + c.intn(3)
	if c.liveCount()+count > maxLive+2 {
		return
	}
	c.mu.Lock()
	marker := x.marker
	c.mu.Unlock()
	children, err := cl.Fork(ctx, x.id, api.ForkRequest{Count: count, TTLSeconds: 3600})
	if ctx.Err() != nil && err != nil {
		return
	}
	out := c.countOp("fork", err)
	c.count("fork-children", fmt.Sprintf("%s (%d asked)", out, count))
	if out != outAcked {
		return
	}
	if len(children) != count {
		c.violate("fork of %s acked with %d children, %d asked", x.id, len(children), count)
	}
	for i := range children {
		c.addAcked(&children[i], marker)
		c.checkCloneData("fork of "+x.id, &children[i], marker)
	}
}

// promotable: a sandbox on the egress lane cannot be promoted.
func promotable(x *claim) bool { return x.template != poolEgress.Template }

// doPromote promotes a running or hibernated claim into a new template.
func (c *campaign) doPromote(ctx context.Context, cl *apiclient.Client, x *claim) {
	c.mu.Lock()
	n := 0
	for _, t := range c.tmpls {
		if acked, _ := gone(t.deletes); !acked {
			n++
		}
	}
	c.tmplSeq++
	name := fmt.Sprintf("promoted%d", c.tmplSeq)
	marker := x.marker
	c.mu.Unlock()
	if n >= maxTemplates {
		return
	}
	pr, err := cl.Promote(ctx, x.id, "", name)
	if ctx.Err() != nil && err != nil {
		return
	}
	out := c.countOp("promote", err)
	if out != outAcked && out != outUnknown {
		return
	}
	t := &tmplModel{key: api.TemplateKey{Template: name}, outcome: out, marker: marker}
	if out == outAcked {
		t.key = pr.Key
	}
	c.mu.Lock()
	c.tmpls = append(c.tmpls, t)
	c.mu.Unlock()
}

// pickTmpl marks a random idle acked template no delete may have removed
// busy.
func (c *campaign) pickTmpl() (*tmplModel, func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return pickIdle(c, c.tmpls, func(t *tmplModel) *bool { return &t.busy }, func(t *tmplModel) bool {
		_, maybe := gone(t.deletes)
		return !maybe && t.outcome == outAcked
	})
}

// doClaimTemplate claims from a promoted template: its clone holds the
// promoted sandbox's data.
func (c *campaign) doClaimTemplate(ctx context.Context, cl *apiclient.Client) {
	if c.liveCount() >= maxLive {
		return
	}
	t, done := c.pickTmpl()
	if t == nil {
		return
	}
	defer done()
	cr, err := cl.Claim(ctx, api.ClaimRequest{Template: t.key.Template, Net: t.key.Net, Size: t.key.Size, TTLSeconds: 3600})
	if ctx.Err() != nil && err != nil {
		return
	}
	out := c.countOp("tmpl-claim", err)
	if out == outAcked {
		c.addAcked(cr, t.marker)
		c.checkCloneData("template "+t.key.Template, cr, t.marker)
	} else if m := claimIDRE.FindString(fmt.Sprint(err)); m != "" {
		c.addPhantom(m, "")
	}
}

// doDeleteTemplate deletes a promoted template; its golden is collected
// once no clone maps it.
func (c *campaign) doDeleteTemplate(ctx context.Context, cl *apiclient.Client) {
	t, done := c.pickTmpl()
	if t == nil {
		return
	}
	defer done()
	err := cl.DeleteTemplate(ctx, t.key, "")
	if ctx.Err() != nil && err != nil {
		return
	}
	out := c.countOp("tmpl-delete", err)
	if out == outAcked || out == outUnknown {
		c.mu.Lock()
		t.deletes = append(t.deletes, out)
		c.mu.Unlock()
	}
}

// storeOp runs one of the store recipes' operations, r in [0, storeWeight).
func (c *campaign) storeOp(ctx context.Context, cl *apiclient.Client, r int) {
	switch {
	case r < 5:
		c.withClaim(ctx, cl, "running", c.doCheckpoint)
	case r < 8:
		c.withClaim(ctx, cl, "hibernated", c.doCheckpoint)
	case r < 13:
		c.doClaimCheckpoint(ctx, cl)
	case r < 16:
		c.doDeleteCheckpoint(ctx, cl)
	case r < 21:
		c.withClaim(ctx, cl, "running", c.doFork)
	case r < 23:
		c.withClaimWhere(ctx, cl, "running", promotable, c.doPromote)
	case r < 24:
		c.withClaimWhere(ctx, cl, "hibernated", promotable, c.doPromote)
	case r < 28:
		c.doClaimTemplate(ctx, cl)
	default:
		c.doDeleteTemplate(ctx, cl)
	}
}

// storeWeight is the share of the store recipes in the workload's draw
// (out of 100 + storeWeight).
const storeWeight = 30
