package fsm

import (
	"reflect"
	"testing"

	"github.com/sbxlog/sbxlog/eventlog/event"
)

// Each intent type names its kind and subject and builds its own result
// and failure commands; a destroy has no failure command.
func TestIntentMethods(t *testing.T) {
	op := event.OpIDFromUint(1, 1)
	m := Meta{Op: event.OpIDFromUint(1, 2), Cause: op, Now: 5}
	out := Outcome{SnapshotDir: "golden/x", Report: event.ExecReport{CopyMode: "reflink", Steps: []event.Step{{Name: "boot", NS: 7}}}}
	rep := &out.Report
	cases := []struct {
		in      Intent
		kind    IntentKind
		subject string
		refill  bool
		done    Command
		failed  Command
	}{
		{BuildGolden{OpID: op, Key: kA}, KindGolden, kA.String(), false,
			GoldenBuilt{Meta: m, Key: kA, SnapshotDir: out.SnapshotDir, Report: rep},
			GoldenFailed{Meta: m, Key: kA, Error: "boom"}},
		{CloneVM{OpID: op, VM: "vm-1", Key: kA, ForClaim: claimID(1)}, KindClone, "vm-1", false,
			VMCloned{Meta: m, VM: "vm-1", Report: rep},
			VMCloneFailed{Meta: m, VM: "vm-1", Error: "boom"}},
		{CloneVM{OpID: op, VM: "vm-2", Key: kA}, KindClone, "vm-2", true,
			VMCloned{Meta: m, VM: "vm-2", Report: rep},
			VMCloneFailed{Meta: m, VM: "vm-2", Error: "boom"}},
		{HibernateVM{OpID: op, VM: "vm-3", Claim: claimID(3)}, KindHibernate, "vm-3", false,
			HibernateDone{Meta: m, VM: "vm-3", SnapshotDir: out.SnapshotDir, Report: rep},
			HibernateFailed{Meta: m, VM: "vm-3", Error: "boom", Lost: true}},
		{WakeVM{OpID: op, VM: "vm-4", Claim: claimID(4)}, KindWake, "vm-4", false,
			WakeDone{Meta: m, VM: "vm-4", Report: rep},
			WakeFailed{Meta: m, VM: "vm-4", Error: "boom", Lost: true}},
		{DestroyVM{OpID: op, VM: "vm-5"}, KindDestroy, "vm-5", false,
			VMDestroyed{Meta: m, VM: "vm-5", Report: rep},
			nil},
		{RestartVM{OpID: op, VM: "vm-6", Claim: claimID(6)}, KindRestart, "vm-6", false,
			VMRestarted{Meta: m, VM: "vm-6", Report: rep},
			VMRestartFailed{Meta: m, VM: "vm-6", Error: "boom"}},
		{ArchiveVM{OpID: op, VM: "vm-7", Claim: claimID(7)}, KindArchive, "vm-7", false,
			ArchiveDone{Meta: m, VM: "vm-7", Archive: out.SnapshotDir, Report: rep},
			ArchiveFailed{Meta: m, VM: "vm-7", Error: "boom", Lost: true}},
		{UnarchiveVM{OpID: op, VM: "vm-8", Claim: claimID(8)}, KindUnarchive, "vm-8", false,
			UnarchiveDone{Meta: m, VM: "vm-8", SnapshotDir: out.SnapshotDir, Report: rep},
			UnarchiveFailed{Meta: m, VM: "vm-8", Error: "boom", Lost: true}},
		{DeleteArchiveVM{OpID: op, VM: "vm-9"}, KindArchiveDelete, "vm-9", false,
			VMDestroyed{Meta: m, VM: "vm-9", Report: rep},
			nil},
	}
	for _, c := range cases {
		t.Run(string(c.kind)+"/"+c.subject, func(t *testing.T) {
			if c.in.Kind() != c.kind || c.in.Subject() != c.subject || c.in.IntentOp() != op || IsRefill(c.in) != c.refill {
				t.Fatalf("kind %q subject %q op %s refill %v", c.in.Kind(), c.in.Subject(), c.in.IntentOp(), IsRefill(c.in))
			}
			if got := c.in.Succeeded(m, out); !reflect.DeepEqual(got, c.done) {
				t.Errorf("Succeeded = %#v, want %#v", got, c.done)
			}
			if got := c.in.Failed(m, "boom", true); !reflect.DeepEqual(got, c.failed) {
				t.Errorf("Failed = %#v, want %#v", got, c.failed)
			}
		})
	}
}

// The result commands an intent builds are the ones the state accepts.
func TestIntentResultsAreAccepted(t *testing.T) {
	h := newHarness(t)
	h.node()
	h.pools(PoolSpec{PoolKey: kA, Warm: 1})
	in := h.intentFor("", kA)
	h.do(in.Succeeded(h.res(in), Outcome{SnapshotDir: "goldens/a"}), event.TypeGoldenBuilt)
	h.do(Refill{Meta: h.meta()}, event.TypeVMCloneRequested)
	clone := Intents(h.s)[0]
	if !IsRefill(clone) {
		t.Fatalf("%+v is not a refill", clone)
	}
	h.do(clone.Failed(h.res(clone), "no space", false), event.TypeVMCloneFailed, event.TypePoolParked)
}
