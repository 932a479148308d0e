package chdriver

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/sbxlog/sbxlog/executors/egress/nft"
	"github.com/sbxlog/sbxlog/executors/reconcile"
	"github.com/sbxlog/sbxlog/fsm"
)

// laneOwner is the owner of the test lane's tables: the driver's instance.
var laneOwner = nft.OwnerOf(testInstance)

// nsLane is an nft.Lane whose kernel calls run in nsTaps' namespace.
func nsLane(t *testing.T, n *nsTaps) *nft.Lane {
	t.Helper()
	k := nft.KernelOps(laneOwner)
	ops := nft.Ops{
		Install: func(l nft.Lock) error { return n.do(func() error { return k.Install(l) }) },
		Remove:  func(tap string) error { return n.do(func() error { return k.Remove(tap) }) },
		Tables: func() (m map[string]nft.State, err error) {
			err = n.do(func() error { m, err = k.Tables(); return err })
			return m, err
		},
		TapExists: func(tap string) (ok bool, err error) {
			err = n.do(func() error { ok, err = k.TapExists(tap); return err })
			return ok, err
		},
		Isolate:   func(tap string) error { return n.do(func() error { return k.Isolate(tap) }) },
		DeleteTap: func(tap string) error { return n.do(func() error { return k.DeleteTap(tap) }) },
	}
	l, err := nft.NewLane(nft.LaneConfig{Bridge: testBridge, Addr: netip.MustParseAddr("10.77.0.1"), MAC: net.HardwareAddr{2, 0, 0, 0, 0, 1}, Ops: &ops})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func (n *nsTaps) inspect(t *testing.T, tap string) (nft.State, error) {
	t.Helper()
	var st nft.State
	err := n.do(func() error {
		var err error
		st, err = laneOwner.Inspect(tap)
		return err
	})
	return st, err
}

// recDoors records the doors the driver opens.
type recDoors struct {
	mu   sync.Mutex
	open map[string]netip.AddrPort // VM -> TCP door (zero: vsock doors)
	sock map[string]string
}

func (r *recDoors) Open(vm string, tcp netip.AddrPort, vsock string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.open[vm], r.sock[vm] = tcp, vsock
	return nil
}

func (r *recDoors) Close(vm string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.open, vm)
	delete(r.sock, vm)
}

func (r *recDoors) get(vm string) (netip.AddrPort, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	d, ok := r.open[vm]
	return d, ok
}

// egressHarness is a harness whose driver has an egress lane: taps and
// locks in a namespace of their own, doors recorded.
func egressHarness(t *testing.T) (*nsTaps, *nft.Lane, *recDoors, *harness) {
	t.Helper()
	taps := newNSTaps(t)
	lane := nsLane(t, taps)
	doors := &recDoors{open: map[string]netip.AddrPort{}, sock: map[string]string{}}
	h := newHarness(t, "", func(c *Config) { c.Bridge, c.Taps, c.Egress, c.Doors = testBridge, taps, lane, doors })
	return taps, lane, doors, h
}

// TestEgressLocks: every egress tap the recipes make is locked to the VM's
// door before the VMM runs and unlocked with the tap (hibernate, destroy,
// a failed clone); wake locks it again on the same door; the doors follow
// the VM; none-lane VMs get vsock doors; the start-up pass repairs a lock
// that went missing and removes one no VM owns.
func TestEgressLocks(t *testing.T) {
	t.Parallel()
	taps, lane, doors, h := egressHarness(t)
	var locked []string
	h.setHook(func(_ context.Context, s StepCall) error {
		// When the VMM launches, the tap must already be locked.
		if s.Step == StepLaunch && !s.Undo {
			vm := filepath.Base(s.RunDir)
			if st, err := taps.inspect(t, TapName(testInstance, vm)); err == nil && st.OK {
				locked = append(locked, vm)
			}
		}
		return nil
	})
	ctx := context.Background()
	k := fsm.PoolKey{Template: "default", Net: NetEgress, Size: "small"}
	golden := h.buildGolden(k)
	const vm1, vm2 = "vm-00000000000000e1", "vm-00000000000000e2"
	if _, err := h.d.Clone(ctx, cloneIntent(vm1, golden, k)); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(locked, vm1) {
		t.Fatal("the VMM launched before the tap was locked")
	}
	h.setHook(nil)
	door, ok := lane.Door(vm1)
	st, err := taps.inspect(t, TapName(testInstance, vm1))
	if !ok || err != nil || !st.OK || st.Lock.Door != door || st.Lock.GuestMAC.String() != MAC(vm1) {
		t.Fatalf("lock after clone: %+v %v (door %s %v)", st, err, door, ok)
	}
	if got, ok := doors.get(vm1); !ok || got != door {
		t.Fatalf("doors after clone: %s %v, want %s", got, ok, door)
	}
	if err := taps.do(func() error {
		l, err := netlink.LinkByName(TapName(testInstance, vm1))
		if err != nil {
			return err
		}
		pi, err := netlink.LinkGetProtinfo(l)
		if err == nil && !pi.Isolated {
			err = errors.New("not an isolated bridge port")
		}
		return err
	}); err != nil {
		t.Fatalf("tap after clone: %v", err)
	}

	// A clone that fails after its tap was locked leaves no lock.
	h.setHook(abortAtProbe)
	if _, err := h.d.Clone(ctx, cloneIntent(vm2, golden, k)); !errors.Is(err, errAbort) {
		t.Fatalf("clone: %v", err)
	}
	h.setHook(nil)
	if _, err := taps.inspect(t, TapName(testInstance, vm2)); !errors.Is(err, nft.ErrNotLocked) {
		t.Fatalf("failed clone left a lock: %v", err)
	}
	if _, ok := doors.get(vm2); ok {
		t.Fatal("failed clone left doors open")
	}

	hib := fsm.HibernateVM{OpID: newOp(), VM: vm1, Key: k, RunDir: testInstance + "/" + vm1}
	hres, err := h.d.Hibernate(ctx, hib)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := taps.inspect(t, TapName(testInstance, vm1)); !errors.Is(err, nft.ErrNotLocked) {
		t.Fatalf("hibernate left a lock: %v", err)
	}
	if _, ok := doors.get(vm1); ok {
		t.Fatal("hibernate left doors open")
	}
	if _, err := h.d.Wake(ctx, fsm.WakeVM{OpID: newOp(), VM: vm1, Key: k, RunDir: hib.RunDir, SnapshotDir: hres.SnapshotDir}); err != nil {
		t.Fatal(err)
	}
	if again, _ := lane.Door(vm1); again != door {
		t.Fatalf("woken VM's door %s, want %s again", again, door)
	}
	if st, err := taps.inspect(t, TapName(testInstance, vm1)); err != nil || !st.OK {
		t.Fatalf("woken VM not locked: %+v %v", st, err)
	}

	// A none-lane VM gets vsock doors and no lock.
	const vm3 = "vm-00000000000000e3"
	g2 := h.buildGolden(testKey)
	if _, err := h.d.Clone(ctx, cloneIntent(vm3, g2, testKey)); err != nil {
		t.Fatal(err)
	}
	if d, ok := doors.get(vm3); !ok || d.IsValid() {
		t.Fatalf("none-lane doors: %s %v, want vsock doors", d, ok)
	}

	// Start-up: vm1's lock went missing, a stray lock of no VM exists.
	if err := taps.do(func() error { return laneOwner.Remove(TapName(testInstance, vm1)) }); err != nil {
		t.Fatal(err)
	}
	if err := taps.Create("sbxstray0000000", testBridge); err != nil {
		t.Fatal(err)
	}
	stray := nft.Lock{Tap: "sbxstray0000000", GuestMAC: net.HardwareAddr{2, 9, 9, 9, 9, 9}, GuestIP: netip.MustParseAddr("10.77.0.251"), Door: netip.MustParseAddrPort("10.77.0.1:21000"), DoorMAC: net.HardwareAddr{2, 0, 0, 0, 0, 1}}
	if err := taps.do(func() error { return laneOwner.Install(stray) }); err != nil {
		t.Fatal(err)
	}
	rep, err := h.d.ReconcileEgress(ctx, []reconcile.VMRef{
		{ID: vm1, Key: k, RunDir: testInstance + "/" + vm1, Status: fsm.VMClaimed},
		{ID: vm3, Key: testKey, RunDir: testInstance + "/" + vm3, Status: fsm.VMWarm},
	})
	if err != nil || !slices.Equal(rep.Repaired, []string{vm1}) || !slices.Equal(rep.Removed, []string{"sbxstray0000000"}) || len(rep.Failed) != 0 {
		t.Fatalf("reconcile: %+v %v", rep, err)
	}
	if st, err := taps.inspect(t, TapName(testInstance, vm1)); err != nil || !st.OK || st.Lock.Door != door {
		t.Fatalf("repaired lock: %+v %v, want door %s", st, err, door)
	}

	for _, vm := range []string{vm1, vm3} {
		key := k
		if vm == vm3 {
			key = testKey
		}
		if _, err := h.d.Destroy(ctx, fsm.DestroyVM{OpID: newOp(), VM: vm, Key: key, Instance: testInstance, RunDir: testInstance + "/" + vm}); err != nil {
			t.Fatal(err)
		}
		if _, ok := doors.get(vm); ok {
			t.Fatalf("%s: doors open after destroy", vm)
		}
	}
	if _, err := taps.inspect(t, TapName(testInstance, vm1)); !errors.Is(err, nft.ErrNotLocked) {
		t.Fatalf("destroy left a lock: %v", err)
	}
	if _, ok := lane.Door(vm1); ok {
		t.Fatal("destroy left the door allocated")
	}
}

// abortAtProbe is a step hook failing a recipe at its readiness probe,
// once its VMM runs (on its tap, locked, when it is an egress VM).
func abortAtProbe(_ context.Context, s StepCall) error {
	if s.Step == StepProbe && !s.Undo {
		return errAbort
	}
	return nil
}

// tapSteps keeps the steps (and rollback actions) of a trace that act on a
// VM's VMM, tap, lock and run dir, in order.
func tapSteps(entries []string) []string {
	keep := map[string]bool{StepTapCreate: true, StepEgressLock: true, StepLaunch: true, StepTerminate: true, StepTapDelete: true, StepEgressUnlock: true, StepRemoveRun: true}
	var out []string
	for _, e := range entries {
		kind, name, _ := strings.Cut(e, " ")
		if (kind == "step" && keep[name]) || (kind == "undo" && keep[strings.TrimPrefix(name, "undo_")]) {
			out = append(out, e)
		}
	}
	return out
}

// TestEgressTapOrder: every recipe that ends an egress VM deletes its tap
// before removing the tap's lock (destroy, hibernate, a failed clone's
// rollback), and a rollback whose VMM could not be stopped deletes the tap
// but keeps the lock and its door port; the start-up reconcile removes the
// table the deleted tap left.
func TestEgressTapOrder(t *testing.T) {
	t.Parallel()
	taps, lane, _, h := egressHarness(t)
	ctx := context.Background()
	k := fsm.PoolKey{Template: "default", Net: NetEgress, Size: "small"}
	golden := h.buildGolden(k)
	const vm1, vm2, vm3 = "vm-00000000000000f1", "vm-00000000000000f2", "vm-00000000000000f3"
	h.tr.reset()
	if _, err := h.d.Clone(ctx, cloneIntent(vm1, golden, k)); err != nil {
		t.Fatal(err)
	}
	checkSequence(t, "egress clone", tapSteps(h.tr.reset()), []string{
		"step " + StepTapCreate, "step " + StepEgressLock, "step " + StepLaunch,
	})
	hib := fsm.HibernateVM{OpID: newOp(), VM: vm1, Key: k, RunDir: testInstance + "/" + vm1}
	if _, err := h.d.Hibernate(ctx, hib); err != nil {
		t.Fatal(err)
	}
	checkSequence(t, "egress hibernate", tapSteps(h.tr.reset()), []string{
		"step " + StepTerminate, "step " + StepTapDelete, "step " + StepEgressUnlock, "step " + StepRemoveRun,
	})

	if _, err := h.d.Clone(ctx, cloneIntent(vm2, golden, k)); err != nil {
		t.Fatal(err)
	}
	h.tr.reset()
	if _, err := h.d.Destroy(ctx, fsm.DestroyVM{OpID: newOp(), VM: vm2, Key: k, Instance: testInstance, RunDir: testInstance + "/" + vm2}); err != nil {
		t.Fatal(err)
	}
	checkSequence(t, "egress destroy", tapSteps(h.tr.reset()), []string{
		"step " + StepTerminate, "step " + StepTapDelete, "step " + StepEgressUnlock, "step " + StepRemoveRun,
	})

	// A clone that fails after its launch rolls back in the same order.
	h.setHook(abortAtProbe)
	if _, err := h.d.Clone(ctx, cloneIntent(vm3, golden, k)); !errors.Is(err, errAbort) {
		t.Fatalf("clone: %v", err)
	}
	checkSequence(t, "egress clone rollback", tapSteps(h.tr.reset()), []string{
		"step " + StepTapCreate, "step " + StepEgressLock, "step " + StepLaunch,
		"undo undo_" + StepTerminate, "undo undo_" + StepTapDelete, "undo undo_" + StepEgressUnlock, "undo undo_" + StepRemoveRun,
	})

	// The rollback's terminate fails (the VMM is killed behind the
	// driver's back, so none is left running): the tap goes, the lock and
	// the door port stay.
	h.setHook(func(ctx context.Context, s StepCall) error {
		switch {
		case s.Step == "undo_"+StepTerminate:
			if pid, ok := vmmPid(s.RunDir); ok {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
			return errors.New("test: the VMM could not be stopped")
		}
		return abortAtProbe(ctx, s)
	})
	if _, err := h.d.Clone(ctx, cloneIntent(vm3, golden, k)); !errors.Is(err, errAbort) {
		t.Fatalf("clone: %v", err)
	}
	h.setHook(nil)
	checkSequence(t, "egress clone rollback, VMM not stopped", tapSteps(h.tr.reset()), []string{
		"step " + StepTapCreate, "step " + StepEgressLock, "step " + StepLaunch,
		"undo undo_" + StepTerminate, "undo undo_" + StepTapDelete, "undo undo_" + StepRemoveRun,
	})
	if _, err := taps.inspect(t, TapName(testInstance, vm3)); errors.Is(err, nft.ErrNotLocked) {
		t.Fatal("the lock was removed although the VMM may still run")
	}
	if _, ok := lane.Door(vm3); !ok {
		t.Fatal("the door port was freed although the VMM may still run")
	}
	if names, _ := taps.links(t); slices.Contains(names, TapName(testInstance, vm3)) {
		t.Fatalf("the tap is still there: %v", names)
	}

	// Start-up: the table of the deleted tap is an orphan, removed.
	rep, err := h.d.ReconcileEgress(ctx, nil)
	if err != nil || !slices.Equal(rep.Removed, []string{TapName(testInstance, vm3)}) {
		t.Fatalf("reconcile: %+v %v, want the orphan of %s removed", rep, err, TapName(testInstance, vm3))
	}
	if _, err := taps.inspect(t, TapName(testInstance, vm3)); !errors.Is(err, nft.ErrNotLocked) {
		t.Fatalf("orphan table after the reconcile: %v", err)
	}
}
