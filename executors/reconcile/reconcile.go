// Package reconcile brings a restarting daemon's VMs in line with its state
// before any executor runs, and reports VMMs that die later.
//
// It is generic over hypervisors: a driver implements Driver, and both
// executors/chdriver and executors/qemu do (chdriver also SnapshotSweeper).
// One part is Cloud Hypervisor's only: the orphan scan of step 1 recognises a
// VMM by CH's command line (executors/vmm.APISocket: an --api-socket under the
// instance root) and its pid file (executors/vmm.PidFile). A QEMU command
// line has no --api-socket, so under the QEMU driver step 1 finds nothing;
// that driver finds a QEMU launched without a pid file by its own cmdline
// check, whenever AdoptVM, RemoveRunDir or a re-run intent looks at the run
// dir.
//
// Run, once, after the log is replayed and the executors' Prepare swept the
// store's temp dirs, and before the scheduler starts:
//
//  1. Every live Cloud Hypervisor process of this instance (its command line
//     names the VMM binary and an API socket under <runs>/<instance>/) that
//     no run dir's pid file records is killed: it was being launched when the
//     daemon died, and nothing else would ever stop it.
//  2. The taps of egress VMs (a driver that is an EgressLocker): the lock of
//     every VM the state says may have a tap (any status but hibernated) is
//     checked and repaired, and the locks of taps no VM owns removed (the
//     tap deleted first, when it still exists), before any VM is adopted,
//     so the node serves (/healthz) only once every running guest's egress
//     is locked again. A VM whose tap cannot be
//     locked has its VMM stopped by the driver, and the adoption below
//     reports it dead.
//  3. Every VM the state says runs (warm, claimed) is adopted through the
//     driver (pid file and cmdline checked, then watched for exit). One whose
//     VMM is gone, or whose VM no longer runs, gets an fsm.VMExited with the
//     configured restart policy: a warm VM is replaced, a claimed one
//     restarted cold from its disk (or its claim fails when the policy is
//     spent).
//  4. A VM with a side effect in flight (cloning, hibernating, waking,
//     destroying, restarting) is left to its intent, which the executors
//     re-run under the same op id: a half clone is torn down and cloned
//     again (or adopted and finished when its vm.restore had completed), a
//     hibernate finishes (snapshot complete in the store) or rolls back,
//     and so on (see the drivers' docs).
//  5. Every other entry under <runs>/<instance>/ (no VM and no golden build
//     of the state owns it) is removed, its VMM stopped first; a hibernated
//     VM's leftover run dir likewise.
//  6. Hibernate snapshots in this data dir's store that the state no longer
//     needs are removed: the one a woken VM restored from, or a destroyed
//     VM's, when a crash cut its removal short (whole, or half way), and
//     that of a VM lost after its snapshot stood. A hibernated or waking
//     VM's snapshot and an in-flight hibernate's are kept, and so are the
//     snapshots of VMs the state gives another instance id.
//  7. Other entries of the store's snapshot directories (goldens, promoted
//     templates) that no state record references and no intent in flight is
//     making are removed, if their meta.json names this instance; those of
//     other instances, or of none, are kept and reported.
//
// Ownership is explicit: only <runs>/<instance>/ is read or changed, and
// only processes whose socket lies under it are signalled. Run dirs of other
// instance ids, and other data dirs, are never touched (they are counted in
// Report.Foreign so an operator sees them).
//
// ReportExit is the runtime half: the driver's exit watcher calls it when an
// adopted or launched VMM dies on its own, and it proposes the same
// VMExited. The state machine refuses an exit of a VM with a side effect in
// flight (its executor reports the outcome), and a duplicate report.
package reconcile

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/sbxlog/sbxlog/eventlog/event"
	"github.com/sbxlog/sbxlog/executors/layout"
	"github.com/sbxlog/sbxlog/fsm"
)

// Liveness is what a driver found of a VM it was asked to adopt.
type Liveness struct {
	// Alive: the VMM runs and is now watched.
	Alive bool
	Pid   int
	// Detail says why a VM is not alive (or what was odd about a live one).
	Detail string
}

// Driver is what Run needs of a hypervisor driver (executors/chdriver and
// executors/qemu implement it).
type Driver interface {
	// Instance is the instance id whose run dirs the driver owns.
	Instance() string
	// VMMBinary is the VMM executable's absolute path. Only the orphan scan
	// (step 1) reads it, matching it against Cloud Hypervisor command lines.
	VMMBinary() string
	// InstanceRoot is <runs>/<instance>.
	InstanceRoot() string
	// RunDirs lists the entry names under InstanceRoot.
	RunDirs() ([]string, error)
	// GoldenRunDir names the run dir of the golden build with intent op.
	GoldenRunDir(op event.OpID) string
	// AdoptVM adopts and watches the VMM of vm (run dir rel, relative to
	// the runs root), or says why it is not alive (stopping a VMM whose VM
	// no longer runs).
	AdoptVM(ctx context.Context, vm, rel string) (Liveness, error)
	// RemoveRunDir stops any VMM of this instance serving the entry and
	// removes it.
	RemoveRunDir(ctx context.Context, name string) error
}

// SnapshotSweeper is implemented by drivers that can remove the hibernate
// snapshots the state no longer needs (step 6 of Run; skipped otherwise).
type SnapshotSweeper interface {
	// HibernateSnapshotDir names the snapshot (relative to the store) the
	// hibernate of vm with intent op makes.
	HibernateSnapshotDir(vm string, op event.OpID) string
	// SweepSnapshots removes the hibernate snapshots the state no longer
	// needs: those of the VMs in own that are not among the dirs listed
	// for them, and those of VMs the state no longer holds; the snapshots
	// of the VMs in foreign (another instance's) are never touched. It
	// returns what it removed (relative to the store).
	SweepSnapshots(ctx context.Context, own map[string][]string, foreign map[string]bool) ([]string, error)
}

// VMRef is a VM of the state, as EgressLocker sees it.
type VMRef struct {
	ID     string
	Key    fsm.PoolKey
	RunDir string
	Status fsm.VMStatus
}

// EgressLocker is implemented by drivers that lock the taps of egress VMs
// (step 2 of Run; skipped otherwise).
type EgressLocker interface {
	// ReconcileEgress checks and repairs the locks of the egress VMs among
	// vms (every VM of this instance but the hibernated) and removes the
	// locks no VM owns; a VM whose tap cannot be locked has its VMM stopped
	// and is listed in Failed.
	ReconcileEgress(ctx context.Context, vms []VMRef) (EgressReport, error)
}

// EgressReport says what step 2 found.
type EgressReport struct {
	// Kept counts locks that were right; Repaired lists VMs whose lock was
	// missing or wrong, now right; Removed lists taps whose lock no VM
	// owned; Failed lists VMs whose tap could not be locked (stopped).
	Kept     int
	Repaired []string
	Removed  []string
	Failed   []string
}

// Proposer hands commands to the single writer (the daemon's engine).
type Proposer interface {
	Propose(ctx context.Context, cmd fsm.Command) error
}

// Options configure Run and ReportExit.
type Options struct {
	Driver  Driver
	Propose Proposer
	// View runs fn on the current state (engine.View).
	View func(fn func(*fsm.State))
	// Meta stamps a new command (engine.Meta).
	Meta func() fsm.Meta
	// Policy is the restart policy stamped into every VMExited.
	Policy fsm.RestartPolicy
	// Concurrency bounds adoptions at once (default 8).
	Concurrency int
	// ProcRoot is where processes are listed (default /proc).
	ProcRoot string
	// KillGrace is the wait after SIGTERM before an orphan gets SIGKILL
	// (default 2 s).
	KillGrace time.Duration
	Log       zerolog.Logger
}

// Report says what Run found and did.
type Report struct {
	// Adopted counts VMs whose VMM runs and is now watched.
	Adopted int
	// Exited lists VMs reported dead (VMExited proposed), with why.
	Exited map[string]string
	// InFlight counts VMs left to the re-run of their intent.
	InFlight int
	// Removed lists run dir entries no state owned, removed.
	Removed []string
	// Orphans lists the pids of VMMs of this instance that no pid file
	// recorded, killed.
	Orphans []int
	// Snapshots lists the stale hibernate snapshots removed (relative to
	// the store).
	Snapshots []string
	// Foreign lists the entries of the runs root that belong to other
	// instance ids (left alone).
	Foreign []string
	// Store is what step 7 found in the store: the entries removed, and
	// those another instance (or none known) made, kept.
	Store layout.StoreSweep
	// Egress is what step 2 found of the egress taps' locks.
	Egress  EgressReport
	Elapsed time.Duration
}

type vmInfo struct {
	id, runDir, instance, snapshotDir string
	key                               fsm.PoolKey
	status                            fsm.VMStatus
	op                                event.OpID
}

// Run reconciles once; see the package doc. Errors of single VMs are
// logged and the pass goes on; an error is returned only when the pass
// could not look at the run dirs or processes at all.
func Run(ctx context.Context, opt Options) (Report, error) {
	start := time.Now()
	rep := Report{Exited: map[string]string{}}
	d := opt.Driver
	if d == nil || opt.View == nil || opt.Propose == nil || opt.Meta == nil {
		return rep, errors.New("reconcile: driver, view, proposer and meta are required")
	}
	log := opt.Log.With().Str("component", "reconcile").Logger()
	inst := d.Instance()

	var vms []vmInfo
	goldens := map[string]bool{}
	// What the store must keep: every snapshot dir the state references,
	// and what an intent in flight may have made already (by its op).
	refs, ops := map[string]bool{}, map[string]bool{}
	opt.View(func(st *fsm.State) {
		for _, r := range st.SnapshotRefs() {
			refs[r.Dir] = true
		}
		for _, id := range st.VMIDs() {
			v, _ := st.VM(id)
			vms = append(vms, vmInfo{id: v.ID, runDir: v.RunDir, instance: v.Instance, snapshotDir: v.SnapshotDir, key: v.Key, status: v.Status, op: v.Op})
		}
		for _, in := range fsm.Intents(st) {
			ops[in.IntentOp().String()] = true
			if g, ok := in.(fsm.BuildGolden); ok {
				goldens[d.GoldenRunDir(g.OpID)] = true
			}
		}
	})

	// Other instances' run dirs are only counted.
	runsRoot := filepath.Dir(d.InstanceRoot())
	if ents, err := os.ReadDir(runsRoot); err == nil {
		for _, e := range ents {
			if e.Name() != inst {
				rep.Foreign = append(rep.Foreign, e.Name())
			}
		}
	}

	// 1. Orphan VMMs.
	procs, err := scanVMMs(opt.procRoot(), d.VMMBinary(), d.InstanceRoot())
	if err != nil {
		return rep, fmt.Errorf("reconcile: list processes: %w", err)
	}
	for _, p := range procs {
		if p.recorded() {
			continue
		}
		log.Warn().Int("pid", p.pid).Str("run_dir", p.runDir).Msg("killing a VMM of this instance that no pid file records")
		if err := killOrphan(ctx, opt.procRoot(), p, d.VMMBinary(), opt.killGrace()); err != nil {
			log.Error().Err(err).Int("pid", p.pid).Msg("could not kill an orphan VMM")
			continue
		}
		rep.Orphans = append(rep.Orphans, p.pid)
	}

	// 2. Egress taps' locks, before any VM is adopted.
	if el, ok := d.(EgressLocker); ok {
		var refs []VMRef
		for _, v := range vms {
			if (v.instance == "" || v.instance == inst) && v.status != fsm.VMHibernated {
				refs = append(refs, VMRef{ID: v.id, Key: v.key, RunDir: v.runDir, Status: v.status})
			}
		}
		if rep.Egress, err = el.ReconcileEgress(ctx, refs); err != nil {
			return rep, fmt.Errorf("reconcile: egress locks: %w", err)
		}
	}

	// 3. and 4. VMs the state knows.
	dirs, err := d.RunDirs()
	if err != nil {
		return rep, fmt.Errorf("reconcile: %w", err)
	}
	owned := map[string]bool{}
	var adopt []vmInfo
	for _, v := range vms {
		if v.instance != "" && v.instance != inst {
			log.Warn().Str("vm", v.id).Str("instance", v.instance).Msg("the state holds a VM of another instance; not touching it")
			continue
		}
		name := filepath.Base(v.runDir)
		switch v.status {
		case fsm.VMWarm, fsm.VMClaimed:
			owned[name] = true
			adopt = append(adopt, v)
		case fsm.VMHibernated:
			// Its run dir went with its VMM; anything left is stale.
		default:
			owned[name] = true
			rep.InFlight++
		}
	}
	// A fixed set of workers takes the VMs in turn: a goroutine per VM
	// would cost more than the adoption itself at 100k VMs.
	results := make([]Liveness, len(adopt))
	errs := make([]error, len(adopt))
	var wg sync.WaitGroup
	var next atomic.Int64
	for range min(opt.concurrency(), len(adopt)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int(next.Add(1) - 1); i < len(adopt); i = int(next.Add(1) - 1) {
				results[i], errs[i] = d.AdoptVM(ctx, adopt[i].id, adopt[i].runDir)
			}
		}()
	}
	wg.Wait()
	for i, v := range adopt {
		switch l := results[i]; {
		case errs[i] != nil:
			log.Error().Err(errs[i]).Str("vm", v.id).Msg("could not adopt a VM; its state is left as is")
		case l.Alive:
			rep.Adopted++
		default:
			rep.Exited[v.id] = l.Detail
			if err := propose(ctx, opt, v.id, "found dead at start-up: "+l.Detail); err != nil {
				log.Error().Err(err).Str("vm", v.id).Msg("could not record a dead VM")
			}
		}
	}

	// 5. Entries nothing owns.
	for _, n := range dirs {
		if owned[n] || goldens[n] {
			continue
		}
		log.Info().Str("entry", n).Msg("removing a run dir no VM or build of the state owns")
		if err := d.RemoveRunDir(ctx, n); err != nil {
			log.Error().Err(err).Str("entry", n).Msg("could not remove a stray run dir")
			continue
		}
		rep.Removed = append(rep.Removed, n)
	}
	sort.Strings(rep.Removed)

	// 6. Hibernate snapshots no state needs: the one a woken VM restored
	// from, or a destroyed VM's, when a crash cut its removal short or a
	// hibernate failed after its snapshot stood (the VM was lost).
	if sw, ok := d.(SnapshotSweeper); ok {
		rep.Snapshots = sweepSnapshots(ctx, sw, vms, inst, log)
	}
	// 7. Other store entries of this instance nothing references.
	if sw, ok := d.(StoreSweeper); ok {
		rep.Store = sweepStore(ctx, sw, refs, ops, log)
	}
	rep.Elapsed = time.Since(start)
	log.Info().Int("adopted", rep.Adopted).Int("exited", len(rep.Exited)).Int("in_flight", rep.InFlight).
		Int("removed", len(rep.Removed)).Int("orphans_killed", len(rep.Orphans)).
		Int("egress_locks_kept", rep.Egress.Kept).Int("egress_locks_repaired", len(rep.Egress.Repaired)).Int("egress_locks_removed", len(rep.Egress.Removed)).Strs("egress_lock_failed", rep.Egress.Failed).Int("stale_snapshots", len(rep.Snapshots)).Strs("foreign_instances", rep.Foreign).
		Dur("elapsed", rep.Elapsed).Msg("start-up reconcile done")
	return rep, nil
}

// StoreSweeper is implemented by drivers that can remove the store
// entries nothing references (step 7 of Run; skipped otherwise).
type StoreSweeper interface {
	// SweepStore discards the entries of this instance keep does not keep
	// (keep: referenced by the state, or made by an intent in flight, by
	// its meta.json's op) and reports them with the entries it left to
	// other instances (layout.UnreferencedSnapshots).
	SweepStore(ctx context.Context, keep func(rel, op string) bool) (layout.StoreSweep, error)
}

func sweepStore(ctx context.Context, sw StoreSweeper, refs, ops map[string]bool, log zerolog.Logger) layout.StoreSweep {
	// Store names end in "-<op>" (layout.GoldenRel), so an in-flight
	// intent's snapshot is known by its name too, whatever its meta says.
	rep, err := sw.SweepStore(ctx, func(rel, op string) bool {
		base := filepath.Base(rel)
		return refs[rel] || op != "" && ops[op] || ops[base[strings.LastIndexByte(base, '-')+1:]]
	})
	if err != nil {
		log.Error().Err(err).Msg("could not sweep the store")
	}
	for _, rel := range rep.Stale {
		log.Info().Str("snapshot", rel).Msg("removed a store entry no state references")
	}
	if len(rep.Foreign)+len(rep.Unknown) > 0 {
		log.Info().Strs("foreign", rep.Foreign).Strs("unknown_owner", rep.Unknown).Msg("store entries of other instances kept")
	}
	return rep
}

func sweepSnapshots(ctx context.Context, sw SnapshotSweeper, vms []vmInfo, inst string, log zerolog.Logger) []string {
	keep, foreign := map[string][]string{}, map[string]bool{}
	for _, v := range vms {
		if v.instance != "" && v.instance != inst {
			foreign[v.id] = true
			continue
		}
		switch v.status {
		case fsm.VMHibernated, fsm.VMWaking, fsm.VMDestroying, fsm.VMArchiving, fsm.VMCheckpointing, fsm.VMPromoting:
			// An archiving VM's snapshot is the only copy until its
			// archive is verified. A hibernated VM being checkpointed or
			// promoted keeps its image (the copy's source, and what it
			// wakes from after); a running one has none ("").
			keep[v.id] = []string{v.snapshotDir}
		case fsm.VMHibernating, fsm.VMUnarchiving:
			// The snapshot the op in flight makes (a hibernate's, or an
			// unarchive's copy back) may stand already.
			keep[v.id] = []string{v.snapshotDir, sw.HibernateSnapshotDir(v.id, v.op)}
		default:
			keep[v.id] = nil
		}
	}
	swept, err := sw.SweepSnapshots(ctx, keep, foreign)
	if err != nil {
		log.Error().Err(err).Msg("could not sweep stale snapshots")
	}
	return swept
}

// ReportExit proposes VMExited for vm, whose VMM died while the daemon ran.
// A rejection (the VM has a side effect in flight, or the death was already
// recorded) is not an error: it is logged at debug level and dropped.
func ReportExit(ctx context.Context, opt Options, vm, detail string) error {
	err := propose(ctx, opt, vm, detail)
	if _, rejected := fsm.AsRejection(err); rejected {
		opt.Log.Debug().Err(err).Str("vm", vm).Msg("VM exit not recorded: the state already accounts for it")
		return nil
	}
	return err
}

func propose(ctx context.Context, opt Options, vm, detail string) error {
	return opt.Propose.Propose(ctx, fsm.VMExited{Meta: opt.Meta(), VM: vm, Detail: detail, Restart: opt.Policy})
}

func (o Options) procRoot() string {
	if o.ProcRoot == "" {
		return "/proc"
	}
	return o.ProcRoot
}

func (o Options) concurrency() int {
	if o.Concurrency <= 0 {
		return 8
	}
	return o.Concurrency
}

func (o Options) killGrace() time.Duration {
	if o.KillGrace <= 0 {
		return 2 * time.Second
	}
	return o.KillGrace
}
