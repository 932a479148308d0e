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
// nothing new. An intent carries everything an executor needs to schedule
// it and to report its outcome, so the executors dispatch on these methods
// and need no case per intent type.
type Intent interface {
	// Kind names the side effect (the driver method performing it).
	Kind() IntentKind
	IntentOp() event.OpID
	// Subject is what the intent acts on, for logs: the VM id, or the
	// golden's pool key.
	Subject() string
	// Succeeded is the result command of the side effect done, with out.
	Succeeded(m Meta, out Outcome) Command
	// Failed is the result command of the side effect failed for good with
	// error text msg; lost says the VM or its snapshot is gone (it becomes
	// the Lost of HibernateFailed and WakeFailed, and is ignored by kinds
	// without one). Nil for a kind without a failure command (a destroy):
	// the state has no way to give up on it, so it is retried until it
	// succeeds.
	Failed(m Meta, msg string, lost bool) Command
	// order is (priority class, request order, id).
	order() (int, uint64, string)
}

// IntentKind names a kind of side effect. These are the one set of names
// for them: the executors' dispatch, the drivers' recipe names, logs and
// metric labels all use them.
type IntentKind string

// Intent kinds.
const (
	KindGolden    IntentKind = "golden"
	KindClone     IntentKind = "clone"
	KindHibernate IntentKind = "hibernate"
	KindWake      IntentKind = "wake"
	KindDestroy   IntentKind = "destroy"
	KindRestart   IntentKind = "restart"
	// Checkpoints (checkpoint.go): capture a VM, remove a checkpoint.
	KindCheckpoint       IntentKind = "checkpoint"
	KindCheckpointDelete IntentKind = "checkpoint_delete"
	KindPromote          IntentKind = "promote"
	KindCollect          IntentKind = "collect"
)

// Outcome is what a side effect that succeeded reports into its result
// command.
type Outcome struct {
	// SnapshotDir is the snapshot made (golden build, hibernate, promote,
	// unarchive), relative to the store, or the archive made (archive);
	// empty for the other kinds.
	SnapshotDir string
	// Digest is a promoted template's content digest ("sha256:...").
	Digest string
	// Report carries the per-step timings and the copy mode.
	Report event.ExecReport
	// Checkpoint is what an import learned of its checkpoint (ckimport.go).
	Checkpoint *CheckpointMeta
}

// IsRefill reports whether in is a refill clone: the class capacity parking
// holds back (see CapacityFull). It is the class Intents lists last, so a
// scheduler holding refills back never blocks anything else.
func IsRefill(in Intent) bool {
	class, _, _ := in.order()
	return class == classRefill
}

// Priority classes: an on-demand clone for a waiting claim goes ahead of
// everything, refills go last.
const (
	classClaimClone = iota
	classWake
	classHibernate
	classDestroy
	classCollect
	classGolden
	classRefill
)

// BuildGolden: cold boot the template of Key and snapshot it as its golden.
type BuildGolden struct {
	OpID   event.OpID
	Key    PoolKey
	ReqSeq uint64
}

func (i BuildGolden) Kind() IntentKind             { return KindGolden }
func (i BuildGolden) IntentOp() event.OpID         { return i.OpID }
func (i BuildGolden) Subject() string              { return i.Key.String() }
func (i BuildGolden) order() (int, uint64, string) { return classGolden, i.ReqSeq, i.Key.String() }

func (i BuildGolden) Succeeded(m Meta, out Outcome) Command {
	return GoldenBuilt{Meta: m, Key: i.Key, SnapshotDir: out.SnapshotDir, Report: &out.Report}
}

func (i BuildGolden) Failed(m Meta, msg string, _ bool) Command {
	return GoldenFailed{Meta: m, Key: i.Key, Error: msg}
}

// CloneVM: create VM from Key's golden or a checkpoint of a VM of Key
// (GoldenDir, the snapshot to restore either way), or by a cold boot of the
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
	// Pooled: the key is a configured pool's, not only that of claims of
	// a template no pool names (a driver that makes templates up, chsim's,
	// makes them only for pools).
	Pooled bool
	ReqSeq uint64
}

func (i CloneVM) Kind() IntentKind     { return KindClone }
func (i CloneVM) IntentOp() event.OpID { return i.OpID }
func (i CloneVM) Subject() string      { return i.VM }

func (i CloneVM) order() (int, uint64, string) {
	if i.ForClaim != "" {
		return classClaimClone, i.ReqSeq, i.VM
	}
	return classRefill, i.ReqSeq, i.VM
}

func (i CloneVM) Succeeded(m Meta, out Outcome) Command {
	return VMCloned{Meta: m, VM: i.VM, Report: &out.Report}
}

func (i CloneVM) Failed(m Meta, msg string, _ bool) Command {
	return VMCloneFailed{Meta: m, VM: i.VM, Error: msg}
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

func (i HibernateVM) Kind() IntentKind             { return KindHibernate }
func (i HibernateVM) IntentOp() event.OpID         { return i.OpID }
func (i HibernateVM) Subject() string              { return i.VM }
func (i HibernateVM) order() (int, uint64, string) { return classHibernate, i.ReqSeq, i.VM }

func (i HibernateVM) Succeeded(m Meta, out Outcome) Command {
	return HibernateDone{Meta: m, VM: i.VM, SnapshotDir: out.SnapshotDir, Report: &out.Report}
}

func (i HibernateVM) Failed(m Meta, msg string, lost bool) Command {
	return HibernateFailed{Meta: m, VM: i.VM, Error: msg, Lost: lost}
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
	// Volumes are the claim's attached volumes: the restored machine has
	// the same disks.
	Volumes []VolumeDisk
}

func (i WakeVM) Kind() IntentKind             { return KindWake }
func (i WakeVM) IntentOp() event.OpID         { return i.OpID }
func (i WakeVM) Subject() string              { return i.VM }
func (i WakeVM) order() (int, uint64, string) { return classWake, i.ReqSeq, i.VM }

func (i WakeVM) Succeeded(m Meta, out Outcome) Command {
	return WakeDone{Meta: m, VM: i.VM, Report: &out.Report}
}

func (i WakeVM) Failed(m Meta, msg string, lost bool) Command {
	return WakeFailed{Meta: m, VM: i.VM, Error: msg, Lost: lost}
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

func (i DestroyVM) Kind() IntentKind             { return KindDestroy }
func (i DestroyVM) IntentOp() event.OpID         { return i.OpID }
func (i DestroyVM) Subject() string              { return i.VM }
func (i DestroyVM) order() (int, uint64, string) { return classDestroy, i.ReqSeq, i.VM }

func (i DestroyVM) Succeeded(m Meta, out Outcome) Command {
	return VMDestroyed{Meta: m, VM: i.VM, Report: &out.Report}
}

// Failed is nil: a VM the state asked to destroy has nowhere else to go, so
// its destroy is retried until it succeeds.
func (i DestroyVM) Failed(Meta, string, bool) Command { return nil }

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
	// Volumes are the claim's attached volumes, attached and mounted again.
	Volumes []VolumeDisk
}

func (i RestartVM) Kind() IntentKind     { return KindRestart }
func (i RestartVM) IntentOp() event.OpID { return i.OpID }
func (i RestartVM) Subject() string      { return i.VM }

// A restart brings a user's running sandbox back: it ranks with wakes.
func (i RestartVM) order() (int, uint64, string) { return classWake, i.ReqSeq, i.VM }

func (i RestartVM) Succeeded(m Meta, out Outcome) Command {
	return VMRestarted{Meta: m, VM: i.VM, Report: &out.Report}
}

func (i RestartVM) Failed(m Meta, msg string, _ bool) Command {
	return VMRestartFailed{Meta: m, VM: i.VM, Error: msg}
}

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
	for id := range s.pendingCks { //fsm:unordered sorted below
		out = append(out, s.checkpointIntent(s.checkpoints[id]))
	}
	out = s.collectIntents(out)
	out = append(out, s.pendingVolumeIntents()...)
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
		if in := s.requested(ev.AggID, op); in != nil {
			out = append(out, in)
		}
		out = append(out, s.volumeIntents(ev.AggID, op)...)
	}
	out = s.newCollectIntents(evs, out)
	sortIntents(out)
	return out
}

// requested returns the intent pending on aggregate agg if its op id is op,
// the intent op of an event about agg. Apply sets an intent's op id from its
// request event (IntentOp of that event's op, type and aggregate), so only
// the request event that created a still-pending intent matches, whatever
// its type: no event type needs listing here. The aggregate says which
// record to check: a VM, a claim (its VM: hibernate and wake requests are
// claim events) or a golden's pool key.
func (s *State) requested(agg string, op event.OpID) Intent {
	v := s.vms[agg]
	if v == nil {
		if c := s.claims[agg]; c != nil {
			v = s.vms[c.VM]
			if v == nil {
				return nil
			}
		}
	}
	if v != nil {
		if v.Op != op {
			return nil
		}
		return s.vmIntent(v)
	}
	if ck := s.checkpoints[agg]; ck != nil {
		if ck.Op != op { // zero unless being taken or deleted
			return nil
		}
		return s.checkpointIntent(ck)
	}
	k, err := event.ParsePoolKey(agg)
	if err != nil {
		return nil
	}
	if g := s.goldens[k]; g != nil && g.Status == GoldenBuilding && g.Op == op {
		return s.goldenIntent(g)
	}
	return nil
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

// vmIntents builds, for each VM status that has one, the intent of a VM in
// that status; a status without an entry has no side effect in flight.
var vmIntents = [numVMStatus]func(s *State, v *VMRec) Intent{
	VMCloning: func(s *State, v *VMRec) Intent {
		in := CloneVM{OpID: v.Op, VM: v.ID, Key: v.Key, Instance: v.Instance, RunDir: v.RunDir, ForClaim: v.Claim, Cold: v.Cold, ReqSeq: v.ReqSeq}
		// The golden the clone request pinned (Maps), so a rebuild
		// meanwhile does not change what the clone restores.
		in.GoldenDir = v.Maps
		if g := s.goldens[v.Key]; g != nil && !v.Cold && in.GoldenDir == "" {
			in.GoldenDir = g.SnapshotDir
		}
		if ck := s.checkpoints[v.SourceCk]; ck != nil {
			// A clone from a checkpoint: the same recipe from its snapshot.
			in.GoldenDir = ck.SnapshotDir
		}
		if p := s.pools[v.Key]; p != nil && !p.Draining {
			in.Pooled = true
		}
		return in
	},
	VMHibernating: func(_ *State, v *VMRec) Intent {
		return HibernateVM{OpID: v.Op, Claim: v.Claim, VM: v.ID, Key: v.Key, RunDir: v.RunDir, ReqSeq: v.ReqSeq}
	},
	VMWaking: func(s *State, v *VMRec) Intent {
		return WakeVM{OpID: v.Op, Claim: v.Claim, VM: v.ID, Key: v.Key, RunDir: v.RunDir, SnapshotDir: v.SnapshotDir, ReqSeq: v.ReqSeq,
			Volumes: s.attachedDisks(v.Claim)}
	},
	VMDestroying: func(s *State, v *VMRec) Intent {
		if v.Archive != "" {
			return archiveIntent(s, v)
		}
		return DestroyVM{OpID: v.Op, VM: v.ID, Key: v.Key, Instance: v.Instance, RunDir: v.RunDir, SnapshotDir: v.SnapshotDir, ReqSeq: v.ReqSeq}
	},
	VMRestarting: func(s *State, v *VMRec) Intent {
		return RestartVM{OpID: v.Op, Claim: v.Claim, VM: v.ID, Key: v.Key, Instance: v.Instance, RunDir: v.RunDir, ReqSeq: v.ReqSeq,
			Volumes: s.attachedDisks(v.Claim)}
	},
	VMPromoting:   promoteIntent,
	VMArchiving:   archiveIntent,
	VMUnarchiving: archiveIntent,
}

// hasIntent reports whether a VM in status st has a side effect in flight.
func hasIntent(st VMStatus) bool { return st < numVMStatus && vmIntents[st] != nil }

// vmIntent returns v's pending intent, nil when its status has none.
func (s *State) vmIntent(v *VMRec) Intent {
	if !hasIntent(v.Status) {
		return nil
	}
	return vmIntents[v.Status](s, v)
}
