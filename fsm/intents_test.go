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
	out := Outcome{SnapshotDir: "golden/x", Digest: "sha256:ab", Report: event.ExecReport{CopyMode: "reflink", Steps: []event.Step{{Name: "boot", NS: 7}}}}
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
		{CaptureCheckpoint{OpID: op, Checkpoint: "ck_7", VM: "vm-7", Claim: claimID(7)}, KindCheckpoint, "ck_7", false,
			CheckpointTaken{Meta: m, Checkpoint: "ck_7", SnapshotDir: out.SnapshotDir, Report: rep},
			CheckpointFailed{Meta: m, Checkpoint: "ck_7", Error: "boom", Lost: true}},
		{RemoveCheckpoint{OpID: op, Checkpoint: "ck_8", SnapshotDir: "checkpoint/ck_8"}, KindCheckpointDelete, "ck_8", false,
			CheckpointRemoved{Meta: m, Checkpoint: "ck_8", Report: rep},
			nil},
		{PromoteVM{OpID: op, VM: "vm-7", Claim: claimID(7), Target: kB}, KindPromote, "vm-7", false,
			PromoteDone{Meta: m, VM: "vm-7", SnapshotDir: out.SnapshotDir, Digest: out.Digest, Report: rep},
			PromoteFailed{Meta: m, VM: "vm-7", Error: "boom", Lost: true}},
		{CollectSnapshot{OpID: op, Dir: "golden/old"}, KindCollect, "golden/old", false,
			SnapshotCollected{Meta: m, Dir: "golden/old"},
			nil},
		{AttachVolume{VolumeIntent{OpID: op, VM: "vm-7", Claim: claimID(7), Disk: VolumeDisk{Name: "data"}}}, KindAttachVolume, "vm-7/data", false,
			VolumeAttachDone{Meta: m, Claim: claimID(7), VM: "vm-7", Volume: "data"},
			VolumeAttachError{Meta: m, Claim: claimID(7), VM: "vm-7", Volume: "data", Error: "boom"}},
		{DetachVolume{VolumeIntent{OpID: op, VM: "vm-8", Claim: claimID(8), Disk: VolumeDisk{Name: "data"}}}, KindDetachVolume, "vm-8/data", false,
			VolumeDetachDone{Meta: m, Claim: claimID(8), VM: "vm-8", Volume: "data"},
			VolumeDetachError{Meta: m, Claim: claimID(8), VM: "vm-8", Volume: "data", Error: "boom"}},
		{ArchiveVM{OpID: op, VM: "vm-7", Claim: claimID(7)}, KindArchive, "vm-7", false,
			ArchiveDone{Meta: m, VM: "vm-7", Archive: out.SnapshotDir, Report: rep},
			ArchiveFailed{Meta: m, VM: "vm-7", Error: "boom", Lost: true}},
		{UnarchiveVM{OpID: op, VM: "vm-8", Claim: claimID(8)}, KindUnarchive, "vm-8", false,
			UnarchiveDone{Meta: m, VM: "vm-8", SnapshotDir: out.SnapshotDir, Report: rep},
			UnarchiveFailed{Meta: m, VM: "vm-8", Error: "boom", Lost: true}},
		{DeleteArchiveVM{OpID: op, VM: "vm-9"}, KindArchiveDelete, "vm-9", false,
			VMDestroyed{Meta: m, VM: "vm-9", Report: rep},
			nil},
		{FetchCheckpoint{OpID: op, Checkpoint: "ck_9", Origin: "10.0.0.2:7777"}, KindCheckpointImport, "ck_9", false,
			CheckpointImported{Meta: m, Checkpoint: "ck_9", SnapshotDir: out.SnapshotDir, Report: rep},
			CheckpointImportFailed{Meta: m, Checkpoint: "ck_9", Error: "boom"}},
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
