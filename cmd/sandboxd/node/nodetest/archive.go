package nodetest

import (
	"context"

	"github.com/sbxlog/sbxlog/executors"
	"github.com/sbxlog/sbxlog/executors/layout"
	"github.com/sbxlog/sbxlog/fsm"
)

var _ executors.Archiver = (*FakeDriver)(nil)

// Archive implements executors.Archiver: the fake's archive is a name,
// made at once (a node whose api.Config has Archive set sends these).
func (f *FakeDriver) Archive(ctx context.Context, in fsm.ArchiveVM) (executors.Result, error) {
	if err := f.held(ctx); err != nil {
		return executors.Result{}, err
	}
	f.archives.Add(1)
	return executors.Result{SnapshotDir: f.instance + "/" + in.VM + "-" + in.OpID.String()}, nil
}

// Unarchive implements executors.Archiver: the snapshot is "back" at once.
func (f *FakeDriver) Unarchive(ctx context.Context, in fsm.UnarchiveVM) (executors.Result, error) {
	if err := f.held(ctx); err != nil {
		return executors.Result{}, err
	}
	f.unarchives.Add(1)
	return executors.Result{SnapshotDir: layout.HibernateRel(in.VM, in.OpID)}, nil
}

// DeleteArchive implements executors.Archiver: a destroy of an archived VM.
func (f *FakeDriver) DeleteArchive(ctx context.Context, _ fsm.DeleteArchiveVM) (executors.Result, error) {
	if err := f.held(ctx); err != nil {
		return executors.Result{}, err
	}
	f.destroys.Add(1)
	return executors.Result{}, nil
}

// ArchiveCalls returns how many archives and unarchives the fake answered.
func (f *FakeDriver) ArchiveCalls() (archives, unarchives int64) {
	return f.archives.Load(), f.unarchives.Load()
}
