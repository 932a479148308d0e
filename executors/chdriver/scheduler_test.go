package chdriver

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/sbxlog/sbxlog/eventlog/event"
	"github.com/sbxlog/sbxlog/executors/scheduler"
	"github.com/sbxlog/sbxlog/fsm"
)

// chanProposer hands every proposed command to the test.
type chanProposer chan fsm.Command

func (c chanProposer) Propose(_ context.Context, cmd fsm.Command) error {
	c <- cmd
	return nil
}

func (c chanProposer) next(t *testing.T) fsm.Command {
	t.Helper()
	select {
	case cmd := <-c:
		return cmd
	case <-time.After(20 * time.Second):
		t.Fatal("no result proposed")
		return nil
	}
}

// TestSchedulerWithCHDriver drives the real recipes through the scheduler:
// refill clones, hibernate, wake (whose snapshot is dropped only after the
// result was proposed) and destroys.
func TestSchedulerWithCHDriver(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "")
	golden := h.seed(sharedGolden(t))
	props := make(chanProposer, 16)
	sc := scheduler.New(h.d, props, scheduler.Options{Concurrency: 4})
	t.Cleanup(func() { _ = sc.Shutdown(context.Background()) })

	var vms []string
	var ins []fsm.Intent
	for i := 0; i < 6; i++ {
		vm := fmt.Sprintf("vm-%016x", 0xa0+i)
		vms = append(vms, vm)
		in := cloneIntent(vm, golden, testKey)
		in.ReqSeq = uint64(i)
		ins = append(ins, in)
	}
	sc.Offer(ins)
	for range vms {
		c, ok := props.next(t).(fsm.VMCloned)
		if !ok || c.Report == nil || len(c.Report.Steps) == 0 {
			t.Fatalf("want VMCloned with a report, got %#v", c)
		}
	}
	if n := len(h.liveVMMs()); n != len(vms) {
		t.Fatalf("%d VMMs, want %d", n, len(vms))
	}

	vm := vms[0]
	hib := fsm.HibernateVM{OpID: newOp(), VM: vm, Key: testKey, RunDir: testInstance + "/" + vm}
	sc.Offer([]fsm.Intent{hib})
	hd, ok := props.next(t).(fsm.HibernateDone)
	if !ok || hd.Cause != hib.OpID || hd.Op != event.DeriveOpID(hib.OpID, "result") {
		t.Fatalf("want HibernateDone for the intent, got %#v", hd)
	}
	snap := h.store(hd.SnapshotDir)
	sc.Offer([]fsm.Intent{fsm.WakeVM{OpID: newOp(), VM: vm, Key: testKey, RunDir: hib.RunDir, SnapshotDir: hd.SnapshotDir}})
	if _, ok := props.next(t).(fsm.WakeDone); !ok {
		t.Fatal("want WakeDone")
	}
	waitFor(t, 5*time.Second, "snapshot dropped after the wake was committed", func() bool {
		_, err := os.Stat(snap)
		return os.IsNotExist(err)
	})

	var ds []fsm.Intent
	for _, vm := range vms {
		ds = append(ds, fsm.DestroyVM{OpID: newOp(), VM: vm, Key: testKey, Instance: testInstance, RunDir: testInstance + "/" + vm})
	}
	sc.Offer(ds)
	for range vms {
		if _, ok := props.next(t).(fsm.VMDestroyed); !ok {
			t.Fatal("want VMDestroyed")
		}
	}
	if n := len(h.liveVMMs()); n != 0 {
		t.Fatalf("%d VMMs left", n)
	}
}
