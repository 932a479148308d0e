package api

import (
	"github.com/sbxlog/sbxlog/eventlog/event"
	"github.com/sbxlog/sbxlog/fsm"
)

// The old daemon's counters of the store recipes, in oldStoreDescs' order.
const (
	oldForkIdx = iota
	oldCheckpointIdx
	oldPromoteIdx
	oldArchiveIdx
	oldUnarchiveIdx
	oldArchiveDeleteIdx
)

// oldStore counts the store recipes from the commits' events, as the old
// daemon counted its operations' successes:
//   - a fork once all its children are served (each child's claim_created
//     names its fork; the fork counts at its last child's claim_served, and
//     never once one of them ended unserved);
//   - a checkpoint at checkpoint_taken, not a fork's source;
//   - a promote at promoted, an archive at archived, an unarchive at
//     unarchived;
//   - an archive delete at the destroy request of a VM whose snapshot is in
//     the archive (its release, or the end of its retention).
//
// It follows the events, not the state: a projection reads the state after
// later commits may have applied. The maps hold only what is in flight.
// Guarded by oldMetrics.mu.
type oldStore struct {
	n [6]float64
	// childFork: fork child -> its fork, until served or ended;
	// forkLeft: fork -> children not yet served (gone once failed).
	childFork map[string]string
	forkLeft  map[string]int
	// forkCks are fork sources being taken; archivedVMs the VMs whose
	// snapshot is in the archive.
	forkCks     map[string]bool
	archivedVMs map[string]bool
}

func newOldStore() oldStore {
	return oldStore{childFork: map[string]string{}, forkLeft: map[string]int{}, forkCks: map[string]bool{}, archivedVMs: map[string]bool{}}
}

// count follows one committed event; archivedInState holds the VMs the
// state has with their snapshot archived (an archive from before this
// daemon's start), as archivedInState reads them.
func (o *oldStore) count(e *event.Event, archivedInState map[string]bool) {
	switch e.Type {
	case event.TypeClaimCreated:
		if p, err := e.Decode(); err == nil {
			if c, ok := p.(event.ClaimCreated); ok && c.Fork != "" {
				o.childFork[c.Claim] = c.Fork
				o.forkLeft[c.Fork]++
			}
		}
	case event.TypeClaimServed:
		f, ok := o.childFork[e.AggID]
		if !ok {
			return
		}
		delete(o.childFork, e.AggID)
		if left, ok := o.forkLeft[f]; ok {
			if left <= 1 {
				delete(o.forkLeft, f)
				o.n[oldForkIdx]++
			} else {
				o.forkLeft[f] = left - 1
			}
		}
	case event.TypeClaimFailed, event.TypeClaimReleased, event.TypeClaimExpired:
		if f, ok := o.childFork[e.AggID]; ok {
			// Ended unserved: its fork is not one that succeeded.
			delete(o.childFork, e.AggID)
			delete(o.forkLeft, f)
		}
	case event.TypeCheckpointRequested:
		if p, err := e.Decode(); err == nil {
			if r, ok := p.(event.CheckpointRequested); ok && r.Fork {
				o.forkCks[r.Checkpoint] = true
			}
		}
	case event.TypeCheckpointTaken:
		if !o.forkCks[e.AggID] {
			o.n[oldCheckpointIdx]++
		}
		delete(o.forkCks, e.AggID)
	case event.TypeCheckpointFailed:
		delete(o.forkCks, e.AggID)
	case event.TypePromoted:
		o.n[oldPromoteIdx]++
	case event.TypeArchived:
		o.n[oldArchiveIdx]++
		if p, err := e.Decode(); err == nil {
			if a, ok := p.(event.Archived); ok {
				o.archivedVMs[a.VM] = true
			}
		}
	case event.TypeUnarchived:
		o.n[oldUnarchiveIdx]++
		if p, err := e.Decode(); err == nil {
			if u, ok := p.(event.Unarchived); ok {
				delete(o.archivedVMs, u.VM)
			}
		}
	case event.TypeVMDestroyRequested:
		if o.archivedVMs[e.AggID] || archivedInState[e.AggID] {
			o.n[oldArchiveDeleteIdx]++
		}
		delete(o.archivedVMs, e.AggID)
	}
}

// archivedInState reads, once for a commit and before oldMetrics.mu is
// taken, which VMs the commit's destroy requests find archived in the
// state: an archive from before this daemon's start, which the events it
// counted never showed. It is nil, and reads nothing, for a commit without
// a destroy request: most commits.
func archivedInState(eng Engine, evs []event.Event) map[string]bool {
	var vms []string
	for i := range evs {
		if evs[i].Type == event.TypeVMDestroyRequested {
			vms = append(vms, evs[i].AggID)
		}
	}
	if len(vms) == 0 {
		return nil
	}
	archived := make(map[string]bool, len(vms))
	eng.View(func(st *fsm.State) {
		for _, vm := range vms {
			v, ok := st.VM(vm)
			archived[vm] = ok && v.Archive != ""
		}
	})
	return archived
}
