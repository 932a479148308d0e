package chdriver

import (
	"context"
	"fmt"
	"net/netip"
	"testing"

	"github.com/sbxlog/sbxlog/eventlog/event"
	"github.com/sbxlog/sbxlog/executors"
	"github.com/sbxlog/sbxlog/executors/ch"
	"github.com/sbxlog/sbxlog/fsm"
)

// TestSnapshotRollbackOpensDoors: a snapshot of a live VM that fails and
// lets the VM run on (a hibernate rolled back, left claimed by fsm
// HibernateFailed; a checkpoint that failed) leaves the VM with its doors.
// After a crash the restarted daemon's proxy holds no door for the VM (the
// start-up reconcile leaves a VM in flight to its intent and opens only
// adopted VMs' doors), and within one run a hibernate's stop closed them
// before the shutdown that failed; either way only the recipe can give
// them back.
func TestSnapshotRollbackOpensDoors(t *testing.T) {
	t.Parallel()
	_, golden, _ := sharedSnapshots(t)
	hibernate := func(h *harness, vm string, op event.OpID) (executors.Result, error) {
		return h.d.Hibernate(context.Background(), fsm.HibernateVM{OpID: op, VM: vm, Key: testKey, RunDir: testInstance + "/" + vm})
	}
	checkpoint := func(h *harness, vm string, op event.OpID) (executors.Result, error) {
		return h.d.Checkpoint(context.Background(), captureIntent("ck_"+vm[3:], vm, "", op))
	}
	cases := []struct {
		name   string
		recipe fsm.IntentKind
		run    func(h *harness, vm string, op event.OpID) (executors.Result, error)
		crash  string // step the first run dies at, the VM paused ("": no crash)
		fail   string // step the (re-)run aborts at
	}{
		// The re-run fails before its rename and resumes the VM.
		{"hibernate/crash before the rename", fsm.KindHibernate, hibernate, StepSnapshot, StepRename},
		// The crashed run stored its snapshot; the re-run fails making it
		// durable again, removes it and resumes the VM.
		{"hibernate/crash after the rename", fsm.KindHibernate, hibernate, StepShutdown, StepSyncTree},
		// No crash: the stop closed the doors, then the shutdown failed.
		{"hibernate/shutdown fails", fsm.KindHibernate, hibernate, "", StepShutdown},
		// The re-run fails while the VM is paused, and resumes it.
		{"checkpoint/fails paused", fsm.KindCheckpoint, checkpoint, StepSnapshot, StepCloneDisk},
		// The re-run fails after the VM ran on.
		{"checkpoint/fails after the resume", fsm.KindCheckpoint, checkpoint, StepSnapshot, StepSyncFiles},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			doors := &recDoors{open: map[string]netip.AddrPort{}, sock: map[string]string{}}
			h := newHarness(t, "", func(c *Config) { c.Doors = doors })
			vm := fmt.Sprintf("vm-00000000000000f%d", i)
			h.clone(vm, h.seed(golden))
			if _, ok := doors.get(vm); !ok {
				t.Fatal("the clone left the VM without its doors")
			}
			op := newOp()
			if tc.crash != "" {
				h.inject(tc.recipe, tc.crash, modeCrash)
				if _, err := tc.run(h, vm, op); err == nil {
					t.Fatal("the recipe succeeded through an injected crash")
				}
				h.afterFailure(modeCrash)
				if st := h.vmState(vm); st != ch.StatePaused {
					t.Fatalf("after the crash the VM is %q, want Paused", st)
				}
				doors.Close(vm) // the restarted daemon's proxy holds no door
			}
			h.inject(tc.recipe, tc.fail, modeAbort)
			if _, err := tc.run(h, vm, op); err == nil {
				t.Fatal("the recipe succeeded through an injected failure")
			}
			h.clearInjection()
			h.checkRunning(vm, 1)
			if _, ok := doors.get(vm); !ok {
				t.Fatal("the failed recipe left the running VM without its doors")
			}
		})
	}
}
