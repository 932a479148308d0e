package fsm

import "github.com/sbxlog/sbxlog/eventlog/event"

// Node drain is state, so a restarted node is still drained: while it
// drains, the node refuses new claims (a TooMany rejection with the old
// daemon's text, DrainingMsg), requests no refill clones, destroys every
// warm VM when the drain starts and each refill clone that finishes after.
// Live claims run on: hibernate, wake, renew and release work as before.

// DrainingMsg is the message of a claim refused by a draining node: the old
// daemon's text (its quota error, "node claim quota reached", wrapped),
// then the way out, since a drain used as teardown outlives the restart
// and the claims after it would otherwise not say why they fail.
const DrainingMsg = "node claim quota reached: node draining (a drain is kept across restarts; sbxctl uncordon or DELETE /v1/drain ends it)"

// Drain starts draining the node (POST /v1/drain); draining a draining node
// is a no-op.
type Drain struct{ Meta }

// Uncordon ends a drain (DELETE /v1/drain): claims are taken and pools
// refill again; uncordoning a node that does not drain is a no-op.
type Uncordon struct{ Meta }

// Draining reports whether the node drains.
func (s *State) Draining() bool { return s.draining }

func (c Drain) decide(d *decider) error {
	if d.s.draining {
		return nil
	}
	d.emit(event.NodeDrained{}, event.NodeAggID)
	for _, k := range sortedPoolKeys(d.s.pools) {
		for _, vm := range d.s.pools[k].warm {
			d.destroy(vm, "drain")
		}
	}
	return nil
}

func (c Uncordon) decide(d *decider) error {
	if d.s.draining {
		d.emit(event.NodeUncordoned{}, event.NodeAggID)
	}
	return nil
}

func (a *applier) setDraining(on bool) error {
	if a.s.draining == on {
		return inconsistent("node draining is already %v", on)
	}
	a.s.draining = on
	a.s.syncAllRefills()
	return nil
}
