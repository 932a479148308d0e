package executors

import (
	"context"
	"testing"

	"github.com/sbxlog/sbxlog/eventlog/event"
	"github.com/sbxlog/sbxlog/fsm"
)

// recorder is a Driver (and Restarter) that records which method ran.
type recorder struct{ called string }

func (r *recorder) note(m string) (Result, error) { r.called = m; return Result{}, nil }

func (r *recorder) BuildGolden(context.Context, fsm.BuildGolden) (Result, error) {
	return r.note("BuildGolden")
}
func (r *recorder) Clone(context.Context, fsm.CloneVM) (Result, error) { return r.note("Clone") }
func (r *recorder) Hibernate(context.Context, fsm.HibernateVM) (Result, error) {
	return r.note("Hibernate")
}
func (r *recorder) Wake(context.Context, fsm.WakeVM) (Result, error)       { return r.note("Wake") }
func (r *recorder) Destroy(context.Context, fsm.DestroyVM) (Result, error) { return r.note("Destroy") }
func (r *recorder) Restart(context.Context, fsm.RestartVM) (Result, error) { return r.note("Restart") }
func (r *recorder) Checkpoint(context.Context, fsm.CaptureCheckpoint) (Result, error) {
	return r.note("Checkpoint")
}
func (r *recorder) RemoveCheckpoint(context.Context, fsm.RemoveCheckpoint) (Result, error) {
	return r.note("RemoveCheckpoint")
}
func (r *recorder) Promote(context.Context, fsm.PromoteVM) (Result, error) { return r.note("Promote") }
func (r *recorder) CollectSnapshot(context.Context, fsm.CollectSnapshot) (Result, error) {
	return r.note("CollectSnapshot")
}
func (r *recorder) AttachVolume(context.Context, fsm.AttachVolume) (Result, error) {
	return r.note("AttachVolume")
}
func (r *recorder) DetachVolume(context.Context, fsm.DetachVolume) (Result, error) {
	return r.note("DetachVolume")
}

// noVolumes is a Driver that cannot attach volumes.
type noVolumes struct{ plain }

func (noVolumes) AttachVolume()                                            {} // not a VolumeAttacher: another signature
func (r *recorder) Archive(context.Context, fsm.ArchiveVM) (Result, error) { return r.note("Archive") }
func (r *recorder) Unarchive(context.Context, fsm.UnarchiveVM) (Result, error) {
	return r.note("Unarchive")
}
func (r *recorder) ImportCheckpoint(context.Context, fsm.FetchCheckpoint) (Result, error) {
	return r.note("ImportCheckpoint")
}
func (r *recorder) DeleteArchive(context.Context, fsm.DeleteArchiveVM) (Result, error) {
	return r.note("DeleteArchive")
}

// plain is a Driver without Restart.
type plain struct{ recorder }

func (p *plain) Restart() {} // not a Restarter: another signature

// bare is a Driver with only the Driver methods.
type bare struct{}

func (b *bare) BuildGolden(context.Context, fsm.BuildGolden) (Result, error) {
	return Result{}, nil
}
func (b *bare) Clone(context.Context, fsm.CloneVM) (Result, error)         { return Result{}, nil }
func (b *bare) Hibernate(context.Context, fsm.HibernateVM) (Result, error) { return Result{}, nil }
func (b *bare) Wake(context.Context, fsm.WakeVM) (Result, error)           { return Result{}, nil }
func (b *bare) Destroy(context.Context, fsm.DestroyVM) (Result, error)     { return Result{}, nil }
func (b *bare) Promote(context.Context, fsm.PromoteVM) (Result, error)     { return Result{}, nil }
func (b *bare) CollectSnapshot(context.Context, fsm.CollectSnapshot) (Result, error) {
	return Result{}, nil
}

// The dispatch table sends every intent kind to its Driver method, with a
// default timeout; a driver without Restart fails restarts as unrecoverable.
func TestDispatchTable(t *testing.T) {
	op := event.OpIDFromUint(1, 1)
	cases := []struct {
		in   fsm.Intent
		want string
	}{
		{fsm.BuildGolden{OpID: op}, "BuildGolden"},
		{fsm.CloneVM{OpID: op, VM: "vm-1"}, "Clone"},
		{fsm.HibernateVM{OpID: op, VM: "vm-1"}, "Hibernate"},
		{fsm.WakeVM{OpID: op, VM: "vm-1"}, "Wake"},
		{fsm.DestroyVM{OpID: op, VM: "vm-1"}, "Destroy"},
		{fsm.RestartVM{OpID: op, VM: "vm-1"}, "Restart"},
		{fsm.CaptureCheckpoint{OpID: op, VM: "vm-1", Checkpoint: "ck_1"}, "Checkpoint"},
		{fsm.RemoveCheckpoint{OpID: op, Checkpoint: "ck_1"}, "RemoveCheckpoint"},
		{fsm.PromoteVM{OpID: op, VM: "vm-1"}, "Promote"},
		{fsm.CollectSnapshot{OpID: op, Dir: "golden/x"}, "CollectSnapshot"},
		{fsm.AttachVolume{VolumeIntent: fsm.VolumeIntent{OpID: op, VM: "vm-1"}}, "AttachVolume"},
		{fsm.DetachVolume{VolumeIntent: fsm.VolumeIntent{OpID: op, VM: "vm-1"}}, "DetachVolume"},
		{fsm.ArchiveVM{OpID: op, VM: "vm-1"}, "Archive"},
		{fsm.UnarchiveVM{OpID: op, VM: "vm-1"}, "Unarchive"},
		{fsm.DeleteArchiveVM{OpID: op, VM: "vm-1"}, "DeleteArchive"},
		{fsm.FetchCheckpoint{OpID: op, Checkpoint: "ck_1"}, "ImportCheckpoint"},
	}
	for _, c := range cases {
		t.Run(string(c.in.Kind()), func(t *testing.T) {
			m, ok := MethodFor(c.in.Kind())
			if !ok || m.Timeout <= 0 {
				t.Fatalf("MethodFor(%q) = %+v, %v", c.in.Kind(), m, ok)
			}
			var r recorder
			if _, err := m.Call(context.Background(), &r, c.in); err != nil || r.called != c.want {
				t.Fatalf("called %q (%v), want %s", r.called, err, c.want)
			}
			if c.in.Kind() != fsm.KindRestart {
				// An intent of another kind is refused, not mistaken for one.
				other := fsm.Intent(fsm.RestartVM{OpID: op})
				if _, err := m.Call(context.Background(), &r, other); !IsUnrecoverable(err) {
					t.Fatalf("a restart intent through the %s method: %v", c.in.Kind(), err)
				}
			}
		})
	}
	if _, ok := MethodFor("no-such-kind"); ok {
		t.Fatal("an unknown kind has a method")
	}
	m, _ := MethodFor(fsm.KindRestart)
	var p plain
	if _, err := m.Call(context.Background(), &p, fsm.RestartVM{OpID: op, VM: "vm-1"}); !IsUnrecoverable(err) || p.called != "" {
		t.Fatalf("restart on a driver that cannot: %v, called %q", err, p.called)
	}
	// A driver without checkpoints fails a capture and has nothing to remove.
	var b bare
	m, _ = MethodFor(fsm.KindCheckpoint)
	if _, err := m.Call(context.Background(), &b, fsm.CaptureCheckpoint{OpID: op, VM: "vm-1"}); !IsUnrecoverable(err) {
		t.Fatalf("capture on a driver that cannot: %v", err)
	}
	m, _ = MethodFor(fsm.KindCheckpointDelete)
	if _, err := m.Call(context.Background(), &b, fsm.RemoveCheckpoint{OpID: op}); err != nil {
		t.Fatalf("removal on a driver without checkpoints: %v", err)
	}
	m, _ = MethodFor(fsm.KindCheckpointImport)
	if _, err := m.Call(context.Background(), &b, fsm.FetchCheckpoint{OpID: op}); !IsUnrecoverable(err) {
		t.Fatalf("import on a driver that cannot: %v", err)
	}
	// Volumes likewise: a driver that cannot attach fails the intents.
	for _, in := range []fsm.Intent{fsm.AttachVolume{VolumeIntent: fsm.VolumeIntent{OpID: op, VM: "vm-1"}}, fsm.DetachVolume{VolumeIntent: fsm.VolumeIntent{OpID: op, VM: "vm-1"}}} {
		m, _ := MethodFor(in.Kind())
		var bare noVolumes
		if _, err := m.Call(context.Background(), &bare, in); !IsUnrecoverable(err) || bare.called != "" {
			t.Fatalf("%s on a driver that cannot: %v, called %q", in.Kind(), err, bare.called)
		}
	}
	// A driver without an archive store fails the archive kinds for good.
	for _, in := range []fsm.Intent{fsm.ArchiveVM{OpID: op, VM: "vm-1"}, fsm.UnarchiveVM{OpID: op, VM: "vm-1"}, fsm.DeleteArchiveVM{OpID: op, VM: "vm-1"}} {
		m, _ := MethodFor(in.Kind())
		if _, err := m.Call(context.Background(), &b, in); !IsUnrecoverable(err) {
			t.Fatalf("%s on a driver without an archive store: %v", in.Kind(), err)
		}
	}
}
