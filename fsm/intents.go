package fsm

import (
	"cmp"
	"slices"

	"github.com/sbxlog/sbxlog/eventlog/event"
)

// Intent is a side effect the state asks for. Executors perform it, keyed by
// IntentOp (every step idempotent under it), and answer with a result
// command whose Meta.Cause is IntentOp and whose Meta.Op is derived from it
// (event.DeriveOpID(IntentOp, "result")), so a re-run after a crash appends
// nothing new.
type Intent interface {
	IntentOp() event.OpID
	// order is (priority class, request order, id).
	order() (int, uint64, string)
}

// Priority classes: an on-demand clone for a waiting claim goes ahead of
// everything, refills go last.
const (
	classClaimClone = iota
	classWake
	classHibernate
	classDestroy
	classGolden
	classRefill
)

// BuildGolden: cold boot the template of Key and snapshot it as its golden.
type BuildGolden struct {
	OpID   event.OpID
	Key    PoolKey
	ReqSeq uint64
}

// CloneVM: create VM from Key's golden (GoldenDir), or by a cold boot of the
// template when Cold. ForClaim names the pending claim it serves (empty for a
// refill). RunDir is relative to the runs root and led by Instance.
type CloneVM struct {
	OpID      event.OpID
	VM        string
	Key       PoolKey
	Instance  string
	RunDir    string
	ForClaim  string
	Cold      bool
	GoldenDir string
	ReqSeq    uint64
}

// HibernateVM: snapshot the claimed VM and stop it.
type HibernateVM struct {
	OpID   event.OpID
	Claim  string
	VM     string
	Key    PoolKey
	RunDir string
	ReqSeq uint64
}

// WakeVM: restore VM from SnapshotDir into RunDir and resume it. The VM keeps
// its id across hibernate and wake.
type WakeVM struct {
	OpID        event.OpID
	Claim       string
	VM          string
	Key         PoolKey
	RunDir      string
	SnapshotDir string
	ReqSeq      uint64
}

// DestroyVM: stop the VM's VMM and remove its run dir, and its snapshot when
// SnapshotDir is set.
type DestroyVM struct {
	OpID        event.OpID
	VM          string
	Key         PoolKey
	Instance    string
	RunDir      string
	SnapshotDir string
	ReqSeq      uint64
}

// RestartVM: boot the claimed VM again, cold, from the disk in its run dir
// (its VMM died; its memory is lost). The VM keeps its id, run dir and
// claim.
type RestartVM struct {
	OpID     event.OpID
	Claim    string
	VM       string
	Key      PoolKey
	Instance string
	RunDir   string
	ReqSeq   uint64
}

func (i BuildGolden) IntentOp() event.OpID { return i.OpID }
func (i CloneVM) IntentOp() event.OpID     { return i.OpID }
func (i HibernateVM) IntentOp() event.OpID { return i.OpID }
func (i WakeVM) IntentOp() event.OpID      { return i.OpID }
func (i DestroyVM) IntentOp() event.OpID   { return i.OpID }
func (i RestartVM) IntentOp() event.OpID   { return i.OpID }

func (i BuildGolden) order() (int, uint64, string) { return classGolden, i.ReqSeq, i.Key.String() }
func (i CloneVM) order() (int, uint64, string) {
	if i.ForClaim != "" {
		return classClaimClone, i.ReqSeq, i.VM
	}
	return classRefill, i.ReqSeq, i.VM
}
func (i HibernateVM) order() (int, uint64, string) { return classHibernate, i.ReqSeq, i.VM }
func (i WakeVM) order() (int, uint64, string)      { return classWake, i.ReqSeq, i.VM }
func (i DestroyVM) order() (int, uint64, string)   { return classDestroy, i.ReqSeq, i.VM }

// A restart brings a user's running sandbox back: it ranks with wakes.
func (i RestartVM) order() (int, uint64, string) { return classWake, i.ReqSeq, i.VM }

// Intents returns every pending side effect, in the order executors should
// start them: on-demand clones for waiting claims, wakes and restarts, hibernates,
// destroys, golden builds, refill clones; within a class, oldest request
// first. It costs O(p log p) for p pending side effects (an index kept by
// Apply), whatever the number of VMs and claims.
func Intents(s *State) []Intent {
	out := make([]Intent, 0, len(s.pendingVMs)+len(s.pendingGoldens))
	for id := range s.pendingVMs { //fsm:unordered sorted below
		if in := s.vmIntent(s.vms[id]); in != nil {
			out = append(out, in)
		}
	}
	for k := range s.pendingGoldens { //fsm:unordered sorted below
		out = append(out, s.goldenIntent(s.goldens[k]))
	}
	sortIntents(out)
	return out
}

func sortIntents(in []Intent) { slices.SortFunc(in, CompareIntents) }

// CompareIntents orders intents as Intents lists them: by priority class
// (on-demand clones for waiting claims, wakes, hibernates, destroys, golden
// builds, refill clones), then request order, then id. An executor queue
// that merges batches keeps this order with it.
func CompareIntents(a, b Intent) int {
	ac, as, ai := a.order()
	bc, bs, bi := b.order()
	if c := cmp.Compare(ac, bc); c != 0 {
		return c
	}
	if c := cmp.Compare(as, bs); c != 0 {
		return c
	}
	return cmp.Compare(ai, bi)
}

// NewIntents returns the intents created by evs, a batch just applied to s
// (those still pending), in Intents order. It costs O(len(evs)): the
// incremental feed for a running daemon, which calls Intents once at start.
func NewIntents(s *State, evs []event.Event) []Intent {
	var out []Intent
	for i := range evs {
		ev := &evs[i]
		op := IntentOp(ev.OpID, ev.Type, ev.AggID)
		switch ev.Type {
		case event.TypeGoldenBuildRequested:
			k, err := event.ParsePoolKey(ev.AggID)
			if g := s.goldens[k]; err == nil && g != nil && g.Status == GoldenBuilding && g.Op == op {
				out = append(out, s.goldenIntent(g))
			}
		case event.TypeVMCloneRequested, event.TypeVMDestroyRequested, event.TypeVMRestartRequested:
			if v := s.vms[ev.AggID]; v != nil && v.Op == op && hasIntent(v.Status) {
				out = append(out, s.vmIntent(v))
			}
		case event.TypeHibernateRequested, event.TypeWakeRequested:
			if c := s.claims[ev.AggID]; c != nil {
				if v := s.vms[c.VM]; v != nil && v.Op == op && hasIntent(v.Status) {
					out = append(out, s.vmIntent(v))
				}
			}
		}
	}
	sortIntents(out)
	return out
}

// RefillsNeeded returns the pools short of their warm target whose refills
// may run now (golden ready, not parked, not draining), sorted. The proposer
// answers with a Refill command; the intents it creates are CloneVMs.
func RefillsNeeded(s *State) []PoolKey { return sortedPoolKeys(s.needRefill) }

// NeedsRefill reports whether RefillsNeeded is non-empty, without building
// the list (the proposer asks after every commit).
func NeedsRefill(s *State) bool { return len(s.needRefill) > 0 }

func (s *State) goldenIntent(g *GoldenRec) Intent {
	return BuildGolden{OpID: g.Op, Key: g.Key, ReqSeq: g.ReqSeq}
}

func (s *State) vmIntent(v *VMRec) Intent {
	switch v.Status {
	case VMCloning:
		in := CloneVM{OpID: v.Op, VM: v.ID, Key: v.Key, Instance: v.Instance, RunDir: v.RunDir, ForClaim: v.Claim, Cold: v.Cold, ReqSeq: v.ReqSeq}
		if g := s.goldens[v.Key]; g != nil && !v.Cold {
			in.GoldenDir = g.SnapshotDir
		}
		return in
	case VMHibernating:
		return HibernateVM{OpID: v.Op, Claim: v.Claim, VM: v.ID, Key: v.Key, RunDir: v.RunDir, ReqSeq: v.ReqSeq}
	case VMWaking:
		return WakeVM{OpID: v.Op, Claim: v.Claim, VM: v.ID, Key: v.Key, RunDir: v.RunDir, SnapshotDir: v.SnapshotDir, ReqSeq: v.ReqSeq}
	case VMDestroying:
		return DestroyVM{OpID: v.Op, VM: v.ID, Key: v.Key, Instance: v.Instance, RunDir: v.RunDir, SnapshotDir: v.SnapshotDir, ReqSeq: v.ReqSeq}
	case VMRestarting:
		return RestartVM{OpID: v.Op, Claim: v.Claim, VM: v.ID, Key: v.Key, Instance: v.Instance, RunDir: v.RunDir, ReqSeq: v.ReqSeq}
	}
	return nil
}
