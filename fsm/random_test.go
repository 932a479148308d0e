package fsm_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/sbxlog/sbxlog/eventlog/event"
	"github.com/sbxlog/sbxlog/fsm"
	"github.com/sbxlog/sbxlog/fsm/fsmsim"
)

// The randomized test (issue acceptance 3). Each seed drives SBX_FSM_STEPS
// (default 12,000) commands from fsmsim: valid and invalid ones, executor
// results (some failures, some stale) and ticks moving time. After every step
// it checks the invariants; every `cadence` steps, replay equivalence:
//
//   - live: the state the commands were decided and applied on, as the engine
//     does it: DecidePayloads, then ApplyDecoded with the payloads as built
//     (no decoding, no sequence, no node); each payload must equal its own
//     encode+decode, the condition ApplyDecoded relies on;
//   - replica: a second state fed the binary log records (encoded and decoded
//     as the log stores them), incrementally, which is a full replay done a
//     step at a time; plus a from-scratch full replay every 25 cadences and at
//     the end;
//   - snapshot + tail: a state encoding taken at a random earlier sequence,
//     decoded, with the log's tail applied.
//
// All three hashes must be equal. On failure the run is repeated with every
// check at every step to find the shortest failing prefix, which is printed
// with the seed and the commands leading to it.
//
// SBX_FSM_SEEDS=1,2,3, SBX_FSM_STEPS=n and SBX_FSM_FAIL_PERCENT=p override
// the defaults.
func TestRandomized(t *testing.T) {
	// One seed by default keeps the -race run short; CI or a soak sets
	// SBX_FSM_SEEDS for more.
	seeds := []uint64{20260901}
	if v := os.Getenv("SBX_FSM_SEEDS"); v != "" {
		seeds = nil
		for _, f := range strings.Split(v, ",") {
			n, err := strconv.ParseUint(strings.TrimSpace(f), 10, 64)
			if err != nil {
				t.Fatalf("SBX_FSM_SEEDS: %v", err)
			}
			seeds = append(seeds, n)
		}
	}
	steps := 12_000
	if v := os.Getenv("SBX_FSM_STEPS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			t.Fatalf("SBX_FSM_STEPS: %v", err)
		}
		steps = n
	}
	seen := map[event.Type]int{}
	var seenMu sync.Mutex
	t.Cleanup(func() {
		// The workload must exercise every transition the log can record.
		if t.Failed() || steps < 5000 || os.Getenv("SBX_FSM_FAIL_PERCENT") != "" {
			return
		}
		for _, ty := range event.Types() {
			if seen[ty] == 0 {
				t.Errorf("no seed produced a %s event: the workload misses a transition", ty)
			}
		}
	})
	for _, seed := range seeds {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			t.Parallel()
			r := newRun(seed, 100)
			f := r.run(steps)
			if f == nil {
				t.Logf("seed %d: %d steps, %d events, %d rejections, %d no-ops; final: %d claims (%d live), %d VMs, %d pools; hash %s",
					seed, steps, len(r.log), r.rejected, r.noops, len(r.live.ClaimIDs()), r.live.LiveClaims(), len(r.live.VMIDs()), len(r.live.Pools()), fsm.HashHex(r.live))
				t.Logf("rejections by code: %v", r.codes)
				t.Logf("events by type: %v", r.types)
				seenMu.Lock()
				for ty, n := range r.types {
					seen[ty] += n
				}
				seenMu.Unlock()
				return
			}
			short := shrink(seed, f, nil)
			t.Fatalf("seed %d fails; shortest failing prefix: %d steps (reproduce: SBX_FSM_SEEDS=%d SBX_FSM_STEPS=%d go test ./fsm -run TestRandomized)\n%v\nlast commands:\n%s",
				seed, short.step, seed, short.step, short.err, strings.Join(short.tail, "\n"))
		})
	}
}

// shrink re-runs a failed seed with every check at every step: it stops at
// the first step whose prefix fails, the shortest failing prefix.
func shrink(seed uint64, f *failure, extra func(*fsm.State) error) *failure {
	r := newRun(seed, 1)
	r.extra = extra
	if short := r.run(f.step); short != nil {
		return short
	}
	return f
}

// The shrinker finds the first failing step even when the failure is only
// noticed at a later cadence check.
func TestRandomizedShrinks(t *testing.T) {
	first := 0
	extra := func(s *fsm.State) error {
		if s.LiveClaims() >= 6 {
			return fmt.Errorf("%d live claims", s.LiveClaims())
		}
		return nil
	}
	// The reference: the first step after which the property fails.
	ref := newRun(3, 1)
	for i := 1; i <= 3000 && first == 0; i++ {
		if err := ref.step(i); err != nil {
			t.Fatal(err)
		}
		if extra(ref.live) != nil {
			first = i
		}
	}
	if first == 0 {
		t.Fatal("the property never failed; pick another")
	}
	r := newRun(3, 100)
	r.extra = extra
	f := r.run(3000)
	if f == nil || f.step <= first || f.step%100 != 0 {
		t.Fatalf("cadence run: %+v, want a failure after step %d at a cadence step", f, first)
	}
	if short := shrink(3, f, extra); short.step != first || len(short.tail) == 0 {
		t.Fatalf("shrunk to %d steps, want %d", short.step, first)
	}
}

type failure struct {
	step int
	err  error
	tail []string
}

type snap struct {
	seq  uint64
	data []byte
}

type run struct {
	// extra is an additional invariant checked with the replay checks
	// (every cadence steps); the shrink test uses it.
	extra     func(*fsm.State) error
	seed      uint64
	cadence   int
	sim       *fsmsim.Sim
	live      *fsm.State
	replica   *fsm.State
	log       []event.Event // as stored: sequenced, with node
	snaps     []snap
	history   []string
	rejected  int
	codes     map[fsm.Code]int
	types     map[event.Type]int
	noops     int
	pick      uint64
	lastTickT int64
}

// simOptions: SBX_FSM_FAIL_PERCENT overrides the share of failed executor
// results, to stress the failure paths.
func simOptions() fsmsim.Options {
	var o fsmsim.Options
	if v, err := strconv.Atoi(os.Getenv("SBX_FSM_FAIL_PERCENT")); err == nil {
		o.FailPercent = v
	}
	return o
}

func newRun(seed uint64, cadence int) *run {
	return &run{seed: seed, cadence: cadence, sim: fsmsim.New(seed, simOptions()), live: fsm.New(), replica: fsm.New(), codes: map[fsm.Code]int{}, types: map[event.Type]int{}, pick: seed*2654435761 + 1}
}

func (r *run) rand(n int) int {
	r.pick = r.pick*6364136223846793005 + 1442695040888963407
	return int((r.pick >> 33) % uint64(n))
}

func (r *run) run(steps int) *failure {
	for i := 1; i <= steps; i++ {
		if err := r.step(i); err != nil {
			from := max(0, len(r.history)-12)
			return &failure{step: i, err: err, tail: r.history[from:]}
		}
		if i%r.cadence == 0 || i == steps {
			if err := r.replayCheck(i%(25*r.cadence) == 0 || i == steps); err != nil {
				from := max(0, len(r.history)-12)
				return &failure{step: i, err: err, tail: r.history[from:]}
			}
		}
	}
	return nil
}

func (r *run) step(i int) error {
	cmd := r.sim.Next(r.live)
	// Decide must not change the state: compared at every 8th step (and
	// at every step while shrinking), as the encoding is the costly part.
	var before []byte
	if r.cadence == 1 || i%8 == 0 {
		before = fsm.Encode(r.live)
	}
	evs, ps, err := fsm.DecidePayloads(r.live, cmd)
	desc := fmt.Sprintf("%5d %T %+v", i, cmd, cmd)
	if err != nil {
		desc += " -> " + err.Error()
	} else {
		names := make([]string, len(evs))
		for j, ev := range evs {
			names[j] = ev.Type.String() + "(" + ev.AggID + ")"
		}
		desc += " -> " + strings.Join(names, " ")
	}
	r.history = append(r.history, desc)
	if before != nil && !bytes.Equal(before, fsm.Encode(r.live)) {
		return errors.New("Decide changed the state")
	}
	if err != nil {
		if _, ok := fsm.AsRejection(err); !ok {
			return fmt.Errorf("Decide failed with a non-rejection: %v", err)
		}
		if evs != nil {
			return errors.New("Decide returned events with a rejection")
		}
		r.rejected++
		rj, _ := fsm.AsRejection(err)
		r.codes[rj.Code]++
		return r.invariants(cmd, nil)
	}
	if len(evs) == 0 {
		r.noops++
	}
	pendingBefore := map[event.OpID]bool{}
	for _, in := range fsm.Intents(r.live) {
		pendingBefore[in.IntentOp()] = true
	}
	for j := range evs {
		r.types[evs[j].Type]++
		live := evs[j]
		if back, err := live.Decode(); err != nil || !reflect.DeepEqual(back, ps[j]) {
			return fmt.Errorf("%s payload does not survive its codec: built %#v, decoded %#v (%v)", live.Type, ps[j], back, err)
		}
		if err := fsm.ApplyDecoded(r.live, &live, ps[j]); err != nil {
			return fmt.Errorf("Apply of an event Decide produced failed: %v", err)
		}
		stored := evs[j]
		stored.Seq, stored.Node = uint64(len(r.log)+1), "node-sim"
		rec, err := event.Decode(event.Encode(&stored))
		if err != nil {
			return err
		}
		r.log = append(r.log, rec)
		if err := fsm.Apply(r.replica, &rec); err != nil {
			return fmt.Errorf("replica: %v", err)
		}
	}
	if len(evs) > 0 && r.rand(40) == 0 {
		r.snaps = append(r.snaps, snap{seq: uint64(len(r.log)), data: fsm.Encode(r.live)})
	}
	if err := r.newIntents(evs, pendingBefore); err != nil {
		return err
	}
	return r.invariants(cmd, evs)
}

// newIntents checks NewIntents against Intents: it lists exactly the
// pending intents that were not pending before the batch (pendingBefore
// holds their op ids), in Intents order.
func (r *run) newIntents(evs []event.Event, pendingBefore map[event.OpID]bool) error {
	all := map[event.OpID]bool{}
	var created []fsm.Intent
	for _, in := range fsm.Intents(r.live) {
		all[in.IntentOp()] = true
		if !pendingBefore[in.IntentOp()] {
			created = append(created, in)
		}
	}
	got := fsm.NewIntents(r.live, evs)
	for _, in := range got {
		if !all[in.IntentOp()] {
			return fmt.Errorf("NewIntents returned %+v, which Intents does not list", in)
		}
	}
	if !reflect.DeepEqual(got, created) {
		return fmt.Errorf("NewIntents returned %+v, want the intents the batch created, %+v", got, created)
	}
	return nil
}

func (r *run) invariants(cmd fsm.Command, evs []event.Event) error {
	s := r.live
	if err := s.Check(); err != nil {
		return err
	}
	// Info counts equal the claims and VMs in each state.
	info := s.Info()
	var byStatus [16]int
	live := 0
	vmClaims := map[string]string{}
	for _, id := range s.ClaimIDs() {
		c, _ := s.Claim(id)
		byStatus[c.Status]++
		if c.Status.Live() {
			live++
			if other, dup := vmClaims[c.VM]; dup {
				return fmt.Errorf("VM %s in claims %s and %s", c.VM, other, id)
			}
			vmClaims[c.VM] = id
		}
	}
	for st := fsm.ClaimPending; st <= fsm.ClaimFailed; st++ {
		if info.Count(st) != byStatus[st] {
			return fmt.Errorf("info says %d %s claims, there are %d", info.Count(st), st, byStatus[st])
		}
	}
	if info.Live != live || s.LiveClaims() != live {
		return fmt.Errorf("info says %d live claims, there are %d", info.Live, live)
	}
	warm, refilling := map[fsm.PoolKey]int{}, map[fsm.PoolKey]int{}
	for _, id := range s.VMIDs() {
		v, _ := s.VM(id)
		switch {
		case v.Status == fsm.VMWarm:
			warm[v.Key]++
		case v.Status == fsm.VMCloning && v.Claim == "":
			refilling[v.Key]++
		}
	}
	for _, p := range info.Pools {
		if p.Warm != warm[p.Key] || p.Refilling != refilling[p.Key] {
			return fmt.Errorf("pool %s: info warm %d refilling %d, VMs say %d %d", p.Key, p.Warm, p.Refilling, warm[p.Key], refilling[p.Key])
		}
		// Once PUT pools drained it, no warm VM survives in the pool
		// (they move to destroying in the same decision).
		if p.Draining && p.Warm != 0 {
			return fmt.Errorf("draining pool %s still has %d warm VMs", p.Key, p.Warm)
		}
		// Refill clones in flight are not cancelled when warm_max drops;
		// they are trimmed as they finish, so warm VMs never exceed it.
		if !p.Draining && p.Warm > p.WarmMax {
			return fmt.Errorf("pool %s: %d warm over warm_max %d", p.Key, p.Warm, p.WarmMax)
		}
	}
	// No intent refers to a VM that is gone, and each matches its VM.
	for _, in := range fsm.Intents(s) {
		var vm string
		var want fsm.VMStatus
		switch in := in.(type) {
		case fsm.CloneVM:
			vm, want = in.VM, fsm.VMCloning
		case fsm.HibernateVM:
			vm, want = in.VM, fsm.VMHibernating
		case fsm.WakeVM:
			vm, want = in.VM, fsm.VMWaking
		case fsm.DestroyVM:
			vm, want = in.VM, fsm.VMDestroying
		case fsm.RestartVM:
			vm, want = in.VM, fsm.VMRestarting
		case fsm.PromoteVM:
			vm, want = in.VM, fsm.VMPromoting
		case fsm.CollectSnapshot:
			if r, ok := retired(s, in.Dir); !ok || r.Op != in.OpID || s.Mappers(in.Dir) != 0 {
				return fmt.Errorf("intent %+v: retired record %+v (%v), %d mappers", in, r, ok, s.Mappers(in.Dir))
			}
			continue
		case fsm.ArchiveVM:
			vm, want = in.VM, fsm.VMArchiving
		case fsm.UnarchiveVM:
			vm, want = in.VM, fsm.VMUnarchiving
		case fsm.DeleteArchiveVM:
			vm, want = in.VM, fsm.VMDestroying
		case fsm.BuildGolden:
			if g, ok := s.Golden(in.Key); !ok || g.Status != fsm.GoldenBuilding || g.Op != in.OpID {
				return fmt.Errorf("intent %+v: golden is %+v", in, g)
			}
			continue
		case fsm.CaptureCheckpoint:
			ck, ok := s.Checkpoint(in.Checkpoint)
			if v, _ := s.VM(in.VM); !ok || ck.Status != fsm.CheckpointTaking || ck.Op != in.OpID || v.Status != fsm.VMCheckpointing {
				return fmt.Errorf("intent %+v: checkpoint is %+v, VM %s", in, ck, v.Status)
			}
			continue
		case fsm.RemoveCheckpoint:
			if ck, ok := s.Checkpoint(in.Checkpoint); !ok || ck.Status != fsm.CheckpointDeleting || ck.Op != in.OpID || ck.SnapshotDir == "" {
				return fmt.Errorf("intent %+v: checkpoint is %+v", in, ck)
			}
			continue
		case fsm.FetchCheckpoint:
			if ck, ok := s.Checkpoint(in.Checkpoint); !ok || ck.Status != fsm.CheckpointImporting || ck.Op != in.OpID || ck.Source != in.Origin {
				return fmt.Errorf("intent %+v: checkpoint is %+v", in, ck)
			}
			continue
		case fsm.AttachVolume, fsm.DetachVolume:
			// A volume operation runs on its claim's VM, which is
			// claimed (or, its VMM having died meanwhile, restarting or
			// being destroyed).
			vi := volumeIntentOf(in)
			v, ok := s.VM(vi.VM)
			if !ok || v.Claim != vi.Claim || (v.Status != fsm.VMClaimed && v.Status != fsm.VMRestarting && v.Status != fsm.VMDestroying) {
				return fmt.Errorf("intent %T for VM %s: VM is %+v (exists %v)", in, vi.VM, v, ok)
			}
			continue
		}
		v, ok := s.VM(vm)
		if !ok || v.Status != want || v.Op != in.IntentOp() {
			return fmt.Errorf("intent %T for VM %s: VM is %+v (exists %v)", in, vm, v, ok)
		}
	}
	// After a Tick, everything due has fired: no pending claim is past its
	// serve deadline, no live lease has expired, and a second Tick at the
	// same time decides nothing.
	if tk, ok := cmd.(fsm.Tick); ok && tk.Op != event.ZeroOpID {
		now := tk.Now
		for _, id := range s.ClaimIDs() {
			c, _ := s.Claim(id)
			if c.Status == fsm.ClaimPending && c.ServeBy <= now {
				return fmt.Errorf("claim %s still pending %d ns after its serve deadline", id, now-c.ServeBy)
			}
			// A claim whose expiry archives outlives its lease until it is
			// archived; an archived one's deadline is its retention (0:
			// none), which ends it.
			if c.Status.Live() && c.Status != fsm.ClaimPending && c.Deadline != 0 && c.Deadline <= now && !(s.ExpiryArchives(&c) && !s.Archived(&c)) {
				return fmt.Errorf("claim %s live %d ns after its deadline", id, now-c.Deadline)
			}
		}
		again, err := fsm.Decide(s, fsm.Tick{Meta: fsm.Meta{Op: event.OpIDFromUint(1, 1), Now: now}})
		if err != nil || len(again) != 0 {
			return fmt.Errorf("a second Tick at the same time decided %d events (%v)", len(again), err)
		}
		r.lastTickT = now
	}
	return nil
}

func (r *run) replayCheck(full bool) error {
	if r.extra != nil {
		if err := r.extra(r.live); err != nil {
			return err
		}
	}
	want := fsm.Hash(r.live)
	if got := fsm.Hash(r.replica); got != want {
		return fmt.Errorf("replica of the log records hashes %x, live %x", got, want)
	}
	enc := fsm.Encode(r.live)
	back, err := fsm.Decode(enc)
	if err != nil {
		return fmt.Errorf("decode of the live state: %v", err)
	}
	if err := back.Check(); err != nil {
		return fmt.Errorf("decoded state: %v", err)
	}
	if !bytes.Equal(fsm.Encode(back), enc) {
		return errors.New("Encode(Decode(Encode(live))) differs")
	}
	if full {
		s := fsm.New()
		for i := range r.log {
			if err := fsm.Apply(s, &r.log[i]); err != nil {
				return fmt.Errorf("full replay: %v", err)
			}
		}
		if got := fsm.Hash(s); got != want {
			return fmt.Errorf("full replay hashes %x, live %x", got, want)
		}
	}
	// Snapshot at a random earlier sequence + tail; recent snapshots keep
	// the tail short.
	if len(r.snaps) > 0 {
		sn := r.snaps[max(0, len(r.snaps)-1-r.rand(min(len(r.snaps), 10)))]
		s, err := fsm.Decode(sn.data)
		if err != nil {
			return fmt.Errorf("snapshot at %d: %v", sn.seq, err)
		}
		for i := sn.seq; i < uint64(len(r.log)); i++ {
			if err := fsm.Apply(s, &r.log[i]); err != nil {
				return fmt.Errorf("tail after snapshot %d: %v", sn.seq, err)
			}
		}
		if got := fsm.Hash(s); got != want {
			return fmt.Errorf("snapshot at %d + tail hashes %x, live %x", sn.seq, got, want)
		}
	}
	return nil
}

// retired returns the retired record of dir.
func retired(s *fsm.State, dir string) (fsm.RetiredRec, bool) {
	for _, r := range s.Retired() {
		if r.Dir == dir {
			return r, true
		}
	}
	return fsm.RetiredRec{}, false
}

func volumeIntentOf(in fsm.Intent) fsm.VolumeIntent {
	if a, ok := in.(fsm.AttachVolume); ok {
		return a.VolumeIntent
	}
	return in.(fsm.DetachVolume).VolumeIntent
}
