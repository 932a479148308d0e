package scheduler

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sbxlog/sbxlog/eventlog/event"
	"github.com/sbxlog/sbxlog/executors"
	"github.com/sbxlog/sbxlog/fsm"
)

// fakeDriver runs fn for every call and records the order of calls.
type fakeDriver struct {
	fn func(ctx context.Context, in fsm.Intent) (executors.Result, error)

	mu      sync.Mutex
	calls   []fsm.Intent
	running int
	maxRun  int
}

var _ executors.Driver = (*fakeDriver)(nil)

func (f *fakeDriver) do(ctx context.Context, in fsm.Intent) (executors.Result, error) {
	f.mu.Lock()
	f.calls = append(f.calls, in)
	f.running++
	f.maxRun = max(f.maxRun, f.running)
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		f.running--
		f.mu.Unlock()
	}()
	if f.fn == nil {
		return executors.Result{}, nil
	}
	return f.fn(ctx, in)
}

func (f *fakeDriver) BuildGolden(ctx context.Context, in fsm.BuildGolden) (executors.Result, error) {
	return f.do(ctx, in)
}

// The fake is an executors.Archiver too.
func (f *fakeDriver) Archive(ctx context.Context, in fsm.ArchiveVM) (executors.Result, error) {
	return f.do(ctx, in)
}
func (f *fakeDriver) Unarchive(ctx context.Context, in fsm.UnarchiveVM) (executors.Result, error) {
	return f.do(ctx, in)
}
func (f *fakeDriver) DeleteArchive(ctx context.Context, in fsm.DeleteArchiveVM) (executors.Result, error) {
	return f.do(ctx, in)
}
func (f *fakeDriver) Clone(ctx context.Context, in fsm.CloneVM) (executors.Result, error) {
	return f.do(ctx, in)
}
func (f *fakeDriver) Hibernate(ctx context.Context, in fsm.HibernateVM) (executors.Result, error) {
	return f.do(ctx, in)
}
func (f *fakeDriver) Wake(ctx context.Context, in fsm.WakeVM) (executors.Result, error) {
	return f.do(ctx, in)
}
func (f *fakeDriver) Promote(ctx context.Context, in fsm.PromoteVM) (executors.Result, error) {
	return f.do(ctx, in)
}
func (f *fakeDriver) CollectSnapshot(ctx context.Context, in fsm.CollectSnapshot) (executors.Result, error) {
	return f.do(ctx, in)
}
func (f *fakeDriver) Destroy(ctx context.Context, in fsm.DestroyVM) (executors.Result, error) {
	return f.do(ctx, in)
}
func (f *fakeDriver) Checkpoint(ctx context.Context, in fsm.CaptureCheckpoint) (executors.Result, error) {
	return f.do(ctx, in)
}
func (f *fakeDriver) RemoveCheckpoint(ctx context.Context, in fsm.RemoveCheckpoint) (executors.Result, error) {
	return f.do(ctx, in)
}
func (f *fakeDriver) ImportCheckpoint(ctx context.Context, in fsm.FetchCheckpoint) (executors.Result, error) {
	return f.do(ctx, in)
}
func (f *fakeDriver) AttachVolume(ctx context.Context, in fsm.AttachVolume) (executors.Result, error) {
	return f.do(ctx, in)
}
func (f *fakeDriver) DetachVolume(ctx context.Context, in fsm.DetachVolume) (executors.Result, error) {
	return f.do(ctx, in)
}

func (f *fakeDriver) callCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.calls)
}

func (f *fakeDriver) callOrder() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, c := range f.calls {
		out = append(out, c.Subject())
	}
	return out
}

// fakeProposer records commands; fn, if set, decides the answer.
type fakeProposer struct {
	fn func(cmd fsm.Command) error

	mu   sync.Mutex
	cmds []fsm.Command
	ch   chan fsm.Command
}

var _ Proposer = (*fakeProposer)(nil)

func newProposer() *fakeProposer { return &fakeProposer{ch: make(chan fsm.Command, 100)} }

func (p *fakeProposer) Propose(_ context.Context, cmd fsm.Command) error {
	var err error
	if p.fn != nil {
		err = p.fn(cmd)
	}
	p.mu.Lock()
	p.cmds = append(p.cmds, cmd)
	p.mu.Unlock()
	p.ch <- cmd
	return err
}

// next waits for the next proposed command.
func (p *fakeProposer) next(t *testing.T) fsm.Command {
	t.Helper()
	select {
	case c := <-p.ch:
		return c
	case <-time.After(5 * time.Second):
		t.Fatal("no command proposed")
		return nil
	}
}

func (p *fakeProposer) none(t *testing.T, d time.Duration) {
	t.Helper()
	select {
	case c := <-p.ch:
		t.Fatalf("unexpected command %#v", c)
	case <-time.After(d):
	}
}

// countObserver counts what the scheduler reports.
type countObserver struct {
	mu       sync.Mutex
	outcomes map[Outcome]int
	retries  int
	steps    int
	maxWait  int
}

var _ Observer = (*countObserver)(nil)

func (c *countObserver) OpDone(_ fsm.IntentKind, o Outcome, _ time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.outcomes == nil {
		c.outcomes = map[Outcome]int{}
	}
	c.outcomes[o]++
}
func (c *countObserver) Retry(fsm.IntentKind, error) { c.mu.Lock(); c.retries++; c.mu.Unlock() }
func (c *countObserver) Step(fsm.IntentKind, string, time.Duration) {
	c.mu.Lock()
	c.steps++
	c.mu.Unlock()
}
func (c *countObserver) Queue(w, _ int) { c.mu.Lock(); c.maxWait = max(c.maxWait, w); c.mu.Unlock() }
func (c *countObserver) get(o Outcome) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.outcomes[o]
}

var opN atomic.Uint64

func nextOp() event.OpID { return event.OpIDFromUint(1_700_000_000_000, opN.Add(1)) }

var key = fsm.PoolKey{Template: "t", Net: "none", Size: "small"}

func refill(vm string, seq uint64) fsm.CloneVM {
	return fsm.CloneVM{OpID: nextOp(), VM: vm, Key: key, RunDir: "i/" + vm, GoldenDir: "golden/g", ReqSeq: seq}
}

var fixedNow = time.Unix(1_800_000_000, 0)

func newTestScheduler(t *testing.T, d executors.Driver, p Proposer, opt Options) *Scheduler {
	t.Helper()
	if opt.Now == nil {
		opt.Now = func() time.Time { return fixedNow }
	}
	if opt.Retry.Initial == 0 {
		opt.Retry.Initial = time.Millisecond
	}
	return startScheduler(t, d, p, opt)
}

// startScheduler starts a scheduler with opt as given, shut down when the
// test ends.
func startScheduler(t *testing.T, d executors.Driver, p Proposer, opt Options) *Scheduler {
	t.Helper()
	sc := New(d, p, opt)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := sc.Shutdown(ctx); err != nil {
			t.Error(err)
		}
	})
	return sc
}

func TestSchedulerResultMeta(t *testing.T) {
	d := &fakeDriver{fn: func(context.Context, fsm.Intent) (executors.Result, error) {
		return executors.Result{Report: event.ExecReport{Steps: []event.Step{{Name: "a", NS: 5}}, CopyMode: "reflink"}}, nil
	}}
	p := newProposer()
	obs := &countObserver{}
	sc := newTestScheduler(t, d, p, Options{Observer: obs})
	in := refill("vm-1", 1)
	sc.Offer([]fsm.Intent{in})
	cmd, ok := p.next(t).(fsm.VMCloned)
	if !ok {
		t.Fatalf("got %T, want VMCloned", cmd)
	}
	if cmd.Op != event.DeriveOpID(in.OpID, "result") || cmd.Cause != in.OpID || cmd.Now != fixedNow.UnixNano() {
		t.Fatalf("meta %+v", cmd.Meta)
	}
	if cmd.VM != "vm-1" || cmd.Report == nil || cmd.Report.CopyMode != "reflink" || len(cmd.Report.Steps) != 1 {
		t.Fatalf("command %+v", cmd)
	}
	waitUntil(t, "op done", func() bool { return obs.get(OutcomeDone) == 1 })
	if obs.steps != 1 {
		t.Fatalf("observer saw %d steps", obs.steps)
	}
}

// TestSchedulerResultCommands: every intent kind maps to its success and
// failure command.
func TestSchedulerResultCommands(t *testing.T) {
	lost := errors.New("gone")
	cases := []struct {
		in      fsm.Intent
		err     error
		want    string
		wantErr string
	}{
		{fsm.BuildGolden{OpID: nextOp(), Key: key}, nil, "fsm.GoldenBuilt", ""},
		{fsm.BuildGolden{OpID: nextOp(), Key: key}, executors.Unrecoverablef("no template"), "fsm.GoldenFailed", "no template"},
		{refill("vm-c", 1), executors.Unrecoverablef("boom"), "fsm.VMCloneFailed", "boom"},
		{fsm.HibernateVM{OpID: nextOp(), VM: "vm-h"}, nil, "fsm.HibernateDone", ""},
		{fsm.HibernateVM{OpID: nextOp(), VM: "vm-h"}, &executors.Unrecoverable{Err: lost, Lost: true}, "fsm.HibernateFailed lost", "gone"},
		{fsm.WakeVM{OpID: nextOp(), VM: "vm-w"}, nil, "fsm.WakeDone", ""},
		{fsm.WakeVM{OpID: nextOp(), VM: "vm-w"}, executors.Unrecoverablef("bad"), "fsm.WakeFailed", "bad"},
		{fsm.DestroyVM{OpID: nextOp(), VM: "vm-d"}, nil, "fsm.VMDestroyed", ""},
		{fsm.CaptureCheckpoint{OpID: nextOp(), VM: "vm-k", Checkpoint: "ck_k"}, nil, "fsm.CheckpointTaken", ""},
		{fsm.CaptureCheckpoint{OpID: nextOp(), VM: "vm-k", Checkpoint: "ck_k"}, &executors.Unrecoverable{Err: lost, Lost: true}, "fsm.CheckpointFailed lost", "gone"},
		{fsm.RemoveCheckpoint{OpID: nextOp(), Checkpoint: "ck_k"}, nil, "fsm.CheckpointRemoved", ""},
		{fsm.PromoteVM{OpID: nextOp(), VM: "vm-p"}, nil, "fsm.PromoteDone", ""},
		{fsm.PromoteVM{OpID: nextOp(), VM: "vm-p"}, &executors.Unrecoverable{Err: lost, Lost: true}, "fsm.PromoteFailed lost", "gone"},
		{fsm.CollectSnapshot{OpID: nextOp(), Dir: "golden/old"}, nil, "fsm.SnapshotCollected", ""},
		{fsm.AttachVolume{VolumeIntent: fsm.VolumeIntent{OpID: nextOp(), VM: "vm-v", Disk: fsm.VolumeDisk{Name: "data"}}}, nil, "fsm.VolumeAttachDone", ""},
		{fsm.AttachVolume{VolumeIntent: fsm.VolumeIntent{OpID: nextOp(), VM: "vm-v", Disk: fsm.VolumeDisk{Name: "data"}}}, executors.Unrecoverablef("no such file"), "fsm.VolumeAttachError", "no such file"},
		{fsm.DetachVolume{VolumeIntent: fsm.VolumeIntent{OpID: nextOp(), VM: "vm-v", Disk: fsm.VolumeDisk{Name: "data"}}}, nil, "fsm.VolumeDetachDone", ""},
		{fsm.DetachVolume{VolumeIntent: fsm.VolumeIntent{OpID: nextOp(), VM: "vm-v", Disk: fsm.VolumeDisk{Name: "data"}}}, executors.Unrecoverablef("target is busy"), "fsm.VolumeDetachError", "target is busy"},
		{fsm.ArchiveVM{OpID: nextOp(), VM: "vm-a"}, nil, "fsm.ArchiveDone", ""},
		{fsm.ArchiveVM{OpID: nextOp(), VM: "vm-a"}, executors.Unrecoverablef("put"), "fsm.ArchiveFailed", "put"},
		{fsm.UnarchiveVM{OpID: nextOp(), VM: "vm-u"}, nil, "fsm.UnarchiveDone", ""},
		{fsm.UnarchiveVM{OpID: nextOp(), VM: "vm-u"}, &executors.Unrecoverable{Err: lost, Lost: true}, "fsm.UnarchiveFailed lost", "gone"},
		{fsm.DeleteArchiveVM{OpID: nextOp(), VM: "vm-x"}, nil, "fsm.VMDestroyed", ""},
		{fsm.FetchCheckpoint{OpID: nextOp(), Checkpoint: "ck_i"}, nil, "fsm.CheckpointImported", ""},
		{fsm.FetchCheckpoint{OpID: nextOp(), Checkpoint: "ck_i"}, executors.Unrecoverablef("not_found: origin said 404"), "fsm.CheckpointImportFailed", "not_found: origin said 404"},
	}
	for _, c := range cases {
		d := &fakeDriver{fn: func(context.Context, fsm.Intent) (executors.Result, error) {
			return executors.Result{SnapshotDir: "hibernate/x", Digest: "sha256:ab", Checkpoint: &fsm.CheckpointMeta{Tenant: "acme"}}, c.err
		}}
		p := newProposer()
		sc := newTestScheduler(t, d, p, Options{})
		sc.Offer([]fsm.Intent{c.in})
		cmd := p.next(t)
		got := fmt.Sprintf("%T", cmd)
		var msg string
		switch x := cmd.(type) {
		case fsm.HibernateFailed:
			msg = x.Error
			if x.Lost {
				got += " lost"
			}
		case fsm.GoldenFailed:
			msg = x.Error
		case fsm.VMCloneFailed:
			msg = x.Error
		case fsm.WakeFailed:
			msg = x.Error
		case fsm.VolumeAttachError:
			msg = x.Error
		case fsm.VolumeDetachError:
			msg = x.Error
		case fsm.ArchiveFailed:
			msg = x.Error
		case fsm.UnarchiveFailed:
			msg = x.Error
			if x.Lost {
				got += " lost"
			}
		case fsm.ArchiveDone:
			if x.Archive != "hibernate/x" {
				t.Errorf("ArchiveDone archive %q", x.Archive)
			}
		case fsm.UnarchiveDone:
			if x.SnapshotDir != "hibernate/x" {
				t.Errorf("UnarchiveDone snapshot dir %q", x.SnapshotDir)
			}
		case fsm.HibernateDone:
			if x.SnapshotDir != "hibernate/x" {
				t.Errorf("HibernateDone snapshot dir %q", x.SnapshotDir)
			}
		case fsm.CheckpointTaken:
			if x.SnapshotDir != "hibernate/x" || x.Checkpoint != "ck_k" {
				t.Errorf("CheckpointTaken %+v", x)
			}
		case fsm.CheckpointFailed:
			msg = x.Error
			if x.Lost {
				got += " lost"
			}
		case fsm.PromoteDone:
			if x.SnapshotDir != "hibernate/x" || x.Digest != "sha256:ab" {
				t.Errorf("PromoteDone %+v", x)
			}
		case fsm.PromoteFailed:
			msg = x.Error
			if x.Lost {
				got += " lost"
			}
		case fsm.CheckpointImported:
			if x.SnapshotDir != "hibernate/x" || x.Checkpoint != "ck_i" || x.Imported.Tenant != "acme" {
				t.Errorf("CheckpointImported %+v", x)
			}
		case fsm.CheckpointImportFailed:
			msg = x.Error
		case fsm.SnapshotCollected:
			if x.Dir != "golden/old" {
				t.Errorf("SnapshotCollected dir %q", x.Dir)
			}
		}
		if got != c.want || !strings.Contains(msg, c.wantErr) {
			t.Errorf("%T with %v: got %s %q, want %s %q", c.in, c.err, got, msg, c.want, c.wantErr)
		}
	}
}

func TestSchedulerDedupe(t *testing.T) {
	release := make(chan struct{})
	d := &fakeDriver{fn: func(ctx context.Context, in fsm.Intent) (executors.Result, error) {
		<-release
		return executors.Result{}, nil
	}}
	p := newProposer()
	sc := newTestScheduler(t, d, p, Options{Concurrency: 4})
	in := refill("vm-1", 1)
	sc.Offer([]fsm.Intent{in, in})
	waitUntil(t, "first call", func() bool { return d.callCount() == 1 })
	sc.Offer([]fsm.Intent{in}) // while running
	close(release)
	p.next(t)
	p.none(t, 50*time.Millisecond)
	if n := d.callCount(); n != 1 {
		t.Fatalf("driver called %d times for one intent", n)
	}
}

func TestSchedulerPriority(t *testing.T) {
	gate := make(chan struct{})
	first := true
	var mu sync.Mutex
	d := &fakeDriver{fn: func(ctx context.Context, in fsm.Intent) (executors.Result, error) {
		mu.Lock()
		wait := first
		first = false
		mu.Unlock()
		if wait {
			<-gate
		}
		return executors.Result{}, nil
	}}
	p := newProposer()
	sc := newTestScheduler(t, d, p, Options{Concurrency: 1})
	sc.Offer([]fsm.Intent{refill("blocker", 0)})
	waitUntil(t, "blocker running", func() bool { return d.callCount() == 1 })
	// Offered in two batches, out of order: the queue must merge them by
	// priority class, then request order.
	sc.Offer([]fsm.Intent{
		refill("refill-2", 20),
		fsm.DestroyVM{OpID: nextOp(), VM: "destroy", ReqSeq: 5},
		fsm.BuildGolden{OpID: nextOp(), Key: key, ReqSeq: 1},
	})
	sc.Offer([]fsm.Intent{
		refill("refill-1", 10),
		fsm.HibernateVM{OpID: nextOp(), VM: "hibernate", ReqSeq: 9},
		fsm.WakeVM{OpID: nextOp(), VM: "wake", ReqSeq: 8},
		fsm.CloneVM{OpID: nextOp(), VM: "claim", ForClaim: "sb_1", ReqSeq: 30},
	})
	close(gate)
	for i := 0; i < 8; i++ {
		p.next(t)
	}
	want := []string{"blocker", "claim", "wake", "hibernate", "destroy", key.String(), "refill-1", "refill-2"}
	if got := d.callOrder(); strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("order %v, want %v", got, want)
	}
}

func TestSchedulerConcurrencyLimit(t *testing.T) {
	release := make(chan struct{})
	d := &fakeDriver{fn: func(ctx context.Context, in fsm.Intent) (executors.Result, error) {
		<-release
		return executors.Result{}, nil
	}}
	p := newProposer()
	sc := newTestScheduler(t, d, p, Options{Concurrency: 3})
	var ins []fsm.Intent
	for i := 0; i < 10; i++ {
		ins = append(ins, refill(fmt.Sprintf("vm-%d", i), uint64(i)))
	}
	sc.Offer(ins)
	waitUntil(t, "3 running", func() bool { _, r := sc.Stats(); return r == 3 })
	// The scheduler counts an operation as running before its goroutine enters
	// the driver: wait for all three to be inside it, or a fast release
	// would let them through one by one and hide the limit being reached.
	waitUntil(t, "3 inside the driver", func() bool { d.mu.Lock(); defer d.mu.Unlock(); return d.running == 3 })
	if w, _ := sc.Stats(); w != 7 {
		t.Fatalf("%d waiting, want 7", w)
	}
	close(release)
	for i := 0; i < 10; i++ {
		p.next(t)
	}
	d.mu.Lock()
	maxRun := d.maxRun
	d.mu.Unlock()
	if maxRun != 3 {
		t.Fatalf("at most %d ran at once, want 3", maxRun)
	}
}

func TestSchedulerRetryThenSuccess(t *testing.T) {
	var n atomic.Int32
	var times []time.Time
	var mu sync.Mutex
	d := &fakeDriver{fn: func(context.Context, fsm.Intent) (executors.Result, error) {
		mu.Lock()
		times = append(times, time.Now())
		mu.Unlock()
		if n.Add(1) < 3 {
			return executors.Result{}, errors.New("transient")
		}
		return executors.Result{}, nil
	}}
	p := newProposer()
	obs := &countObserver{}
	sc := newTestScheduler(t, d, p, Options{Observer: obs, Retry: RetryPolicy{Initial: 20 * time.Millisecond}})
	sc.Offer([]fsm.Intent{refill("vm-1", 1)})
	if _, ok := p.next(t).(fsm.VMCloned); !ok {
		t.Fatal("want VMCloned after retries")
	}
	if n.Load() != 3 || obs.retries != 2 {
		t.Fatalf("%d calls, %d retries; want 3 and 2", n.Load(), obs.retries)
	}
	// Backoff doubles: >= 20 ms, then >= 40 ms.
	if g1, g2 := times[1].Sub(times[0]), times[2].Sub(times[1]); g1 < 20*time.Millisecond || g2 < 40*time.Millisecond {
		t.Fatalf("backoff gaps %v, %v", g1, g2)
	}
}

func TestSchedulerRetriesExhausted(t *testing.T) {
	d := &fakeDriver{fn: func(context.Context, fsm.Intent) (executors.Result, error) {
		return executors.Result{}, errors.New("still broken")
	}}
	p := newProposer()
	sc := newTestScheduler(t, d, p, Options{Retry: RetryPolicy{Attempts: 3}})
	sc.Offer([]fsm.Intent{fsm.WakeVM{OpID: nextOp(), VM: "vm-1"}})
	cmd, ok := p.next(t).(fsm.WakeFailed)
	if !ok || cmd.Lost || !strings.Contains(cmd.Error, "still broken") {
		t.Fatalf("got %#v", cmd)
	}
	if d.callCount() != 3 {
		t.Fatalf("%d calls, want 3", d.callCount())
	}
}

func TestSchedulerUnrecoverableStops(t *testing.T) {
	d := &fakeDriver{fn: func(context.Context, fsm.Intent) (executors.Result, error) {
		return executors.Result{}, fmt.Errorf("step x: %w", executors.Unrecoverablef("no golden"))
	}}
	p := newProposer()
	sc := newTestScheduler(t, d, p, Options{})
	in := refill("vm-1", 1)
	sc.Offer([]fsm.Intent{in})
	if _, ok := p.next(t).(fsm.VMCloneFailed); !ok {
		t.Fatal("want VMCloneFailed")
	}
	p.none(t, 30*time.Millisecond)
	if d.callCount() != 1 {
		t.Fatalf("%d calls, want 1 (no retry)", d.callCount())
	}
}

func TestSchedulerPanicIsFailure(t *testing.T) {
	d := &fakeDriver{fn: func(context.Context, fsm.Intent) (executors.Result, error) { panic("recipe bug") }}
	p := newProposer()
	sc := newTestScheduler(t, d, p, Options{})
	sc.Offer([]fsm.Intent{refill("vm-1", 1)})
	cmd, ok := p.next(t).(fsm.VMCloneFailed)
	if !ok || !strings.Contains(cmd.Error, "recipe bug") {
		t.Fatalf("got %#v", cmd)
	}
}

func TestSchedulerTimeoutRetries(t *testing.T) {
	var n atomic.Int32
	d := &fakeDriver{fn: func(ctx context.Context, _ fsm.Intent) (executors.Result, error) {
		if n.Add(1) == 1 {
			<-ctx.Done() // hangs until the per-attempt timeout
			return executors.Result{}, ctx.Err()
		}
		return executors.Result{}, nil
	}}
	p := newProposer()
	sc := newTestScheduler(t, d, p, Options{Timeouts: map[fsm.IntentKind]time.Duration{fsm.KindHibernate: 30 * time.Millisecond}})
	sc.Offer([]fsm.Intent{fsm.HibernateVM{OpID: nextOp(), VM: "vm-1"}})
	if _, ok := p.next(t).(fsm.HibernateDone); !ok {
		t.Fatal("want HibernateDone after a timed-out attempt")
	}
	if n.Load() != 2 {
		t.Fatalf("%d calls", n.Load())
	}
}

func TestSchedulerCapacityParksRefills(t *testing.T) {
	var mu sync.Mutex
	full := true
	d := &fakeDriver{fn: func(_ context.Context, in fsm.Intent) (executors.Result, error) {
		mu.Lock()
		defer mu.Unlock()
		if full && in.Subject() == "vm-full" {
			return executors.Result{}, fmt.Errorf("clone_disk: %w", syscall.ENOSPC)
		}
		return executors.Result{}, nil
	}}
	p := newProposer()
	const park = 300 * time.Millisecond
	sc := newTestScheduler(t, d, p, Options{CapacityPark: park})
	in := refill("vm-full", 1)
	sc.Offer([]fsm.Intent{in})
	cf, ok := p.next(t).(fsm.CapacityFull)
	if !ok || cf.Key != nil || cf.Op != event.DeriveOpID(in.OpID, "capacity") {
		t.Fatalf("want a node-wide CapacityFull first, got %#v", cf)
	}
	if _, ok := p.next(t).(fsm.VMCloneFailed); !ok {
		t.Fatal("want VMCloneFailed")
	}
	parkedAt := time.Now()
	// During the park a refill waits; a claim clone does not.
	sc.Offer([]fsm.Intent{refill("vm-refill", 2), fsm.CloneVM{OpID: nextOp(), VM: "vm-claim", ForClaim: "sb_1", ReqSeq: 3}})
	c1 := p.next(t).(fsm.VMCloned)
	if c1.VM != "vm-claim" {
		t.Fatalf("first served %s, want the claim clone", c1.VM)
	}
	c2 := p.next(t).(fsm.VMCloned)
	if c2.VM != "vm-refill" {
		t.Fatalf("got %s", c2.VM)
	}
	if waited := time.Since(parkedAt); waited < park-20*time.Millisecond {
		t.Fatalf("refill ran %v after the park began, want >= %v", waited, park)
	}
}

func TestSchedulerStaleResultDropsAfterCommit(t *testing.T) {
	var ran atomic.Bool
	d := &fakeDriver{fn: func(context.Context, fsm.Intent) (executors.Result, error) {
		return executors.Result{AfterCommit: func(context.Context) error { ran.Store(true); return nil }}, nil
	}}
	p := newProposer()
	p.fn = func(fsm.Command) error { return &fsm.Rejection{Code: fsm.InvalidTransition, Msg: "stale"} }
	obs := &countObserver{}
	sc := newTestScheduler(t, d, p, Options{Observer: obs})
	sc.Offer([]fsm.Intent{fsm.WakeVM{OpID: nextOp(), VM: "vm-1"}})
	p.next(t)
	waitUntil(t, "stale outcome", func() bool { return obs.get(OutcomeStale) == 1 })
	p.none(t, 30*time.Millisecond) // a rejection is not retried
	if ran.Load() {
		t.Fatal("AfterCommit ran for a rejected result")
	}
}

func TestSchedulerAfterCommitRunsAfterPropose(t *testing.T) {
	proposed := make(chan struct{})
	after := make(chan bool, 1)
	d := &fakeDriver{fn: func(context.Context, fsm.Intent) (executors.Result, error) {
		return executors.Result{AfterCommit: func(context.Context) error {
			select {
			case <-proposed:
				after <- true
			default:
				after <- false
			}
			return nil
		}}, nil
	}}
	p := newProposer()
	p.fn = func(fsm.Command) error { close(proposed); return nil }
	sc := newTestScheduler(t, d, p, Options{})
	sc.Offer([]fsm.Intent{fsm.WakeVM{OpID: nextOp(), VM: "vm-1"}})
	select {
	case ok := <-after:
		if !ok {
			t.Fatal("AfterCommit ran before the result was proposed")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("AfterCommit never ran")
	}
}

func TestSchedulerProposeRetriesTransportErrors(t *testing.T) {
	var n atomic.Int32
	d := &fakeDriver{}
	p := newProposer()
	p.fn = func(fsm.Command) error {
		if n.Add(1) < 3 {
			return errors.New("append: disk busy")
		}
		return nil
	}
	obs := &countObserver{}
	sc := newTestScheduler(t, d, p, Options{Observer: obs})
	sc.Offer([]fsm.Intent{refill("vm-1", 1)})
	p.next(t)
	p.next(t)
	p.next(t)
	waitUntil(t, "done", func() bool { return obs.get(OutcomeDone) == 1 })
	if d.callCount() != 1 {
		t.Fatal("a propose failure re-ran the driver")
	}
}

func TestSchedulerDestroyFailure(t *testing.T) {
	d := &fakeDriver{fn: func(context.Context, fsm.Intent) (executors.Result, error) {
		return executors.Result{}, executors.Unrecoverablef("not ours")
	}}
	p := newProposer()
	obs := &countObserver{}
	sc := newTestScheduler(t, d, p, Options{Observer: obs})
	in := fsm.DestroyVM{OpID: nextOp(), VM: "vm-1"}
	sc.Offer([]fsm.Intent{in})
	waitUntil(t, "failed", func() bool { return obs.get(OutcomeFailed) == 1 })
	p.none(t, 20*time.Millisecond) // no failure command exists for a destroy
	sc.Offer([]fsm.Intent{in})
	p.none(t, 20*time.Millisecond)
	if d.callCount() != 1 {
		t.Fatalf("a failed destroy re-ran on re-offer (%d calls)", d.callCount())
	}
}

func TestSchedulerShutdown(t *testing.T) {
	started := make(chan struct{})
	var sawCancel atomic.Bool
	d := &fakeDriver{fn: func(ctx context.Context, _ fsm.Intent) (executors.Result, error) {
		close(started)
		<-ctx.Done()
		sawCancel.Store(true)
		return executors.Result{}, ctx.Err()
	}}
	p := newProposer()
	obs := &countObserver{}
	sc := New(d, p, Options{Observer: obs})
	sc.Offer([]fsm.Intent{refill("vm-1", 1)})
	<-started
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := sc.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if err := sc.Shutdown(ctx); err != nil {
		t.Fatalf("second Shutdown: %v", err)
	}
	if !sawCancel.Load() {
		t.Fatal("running operation was not canceled")
	}
	if obs.get(OutcomeAbandoned) != 1 {
		t.Fatal("interrupted operation not reported abandoned")
	}
	p.none(t, 20*time.Millisecond) // no failure is reported for an interrupted op
	sc.Offer([]fsm.Intent{refill("vm-2", 2)})
	if d.callCount() != 1 {
		t.Fatal("Offer after Shutdown ran something")
	}
}

func TestSchedulerShutdownTimesOut(t *testing.T) {
	stuck := make(chan struct{})
	d := &fakeDriver{fn: func(ctx context.Context, _ fsm.Intent) (executors.Result, error) {
		<-stuck // ignores its context
		return executors.Result{}, nil
	}}
	sc := New(d, newProposer(), Options{})
	sc.Offer([]fsm.Intent{refill("vm-1", 1)})
	waitUntil(t, "running", func() bool { return d.callCount() == 1 })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := sc.Shutdown(ctx); err == nil {
		t.Fatal("Shutdown returned before its goroutines ended")
	}
	close(stuck)
	if err := sc.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func TestDefaultConcurrency(t *testing.T) {
	if c := DefaultConcurrency(); c < 4 || c > 256 {
		t.Fatalf("DefaultConcurrency %d outside [4, 256]", c)
	}
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}
