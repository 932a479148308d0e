// Package archive moves hibernate snapshots between the node's snapshot
// store and a second store, the archive, and holds that second store's
// directory implementation.
//
// The contract:
//
//   - Store is what an archive backend implements (its doc comment is the
//     contract). DirStore is the directory one: a directory on another
//     filesystem. Put copies a snapshot's files into a temp dir named for the
//     archive, fsyncing each file, then the temp dir, then writes the
//     manifest (sha256 per file, fsync, rename, fsync: the manifest is the
//     last thing written), reads every file back from the disk (the page
//     cache dropped) against the manifest, and only then renames the temp
//     dir to the archive's name and fsyncs its parent. A crash at any step
//     leaves either no archive under the name or a complete, verified one;
//     a leftover temp dir is replaced by the next Put of that name and
//     removed by SweepTemp at start-up (the instance's own only).
//   - Get copies an archive back, verifying every file against the
//     manifest: a mismatch is ErrCorrupt, nothing under the name is
//     ErrNotFound.
//   - Executor performs the fsm's archive intents (ArchiveVM, UnarchiveVM,
//     DeleteArchiveVM) as recipes of named idempotent steps: an archive is
//     put and verified before the local snapshot is removed; an unarchive
//     copies back into a temp dir inside the local store, fsyncs, renames
//     it into place and only then deletes the archive. Re-run after a crash
//     at any step, each completes or rolls back.
//
// Checksums are fsx.ContentSum's: SHA-256 over the file's size and its
// non-zero 4 KiB pages with their offsets, so a sparse guest memory file
// costs its data, not its size, and a copy that keeps holes as holes has
// the same sum.
package archive

import (
	"context"
	"errors"
)

// Store is a second store for snapshots, written by the archive recipes.
// A name is '/'-separated (instance, then an archive of it), unique per
// archive and never reused for other contents.
//
// Contract, which an object store can keep as well as a directory:
//   - Put(name, dir) stores the regular files of the snapshot directory
//     dir under name and returns only once the archive is durable and its
//     every file verified against its manifest (per-file SHA-256); the
//     manifest is written last, so an archive without one is not an
//     archive. Put of a name that is already complete returns nil without
//     copying. On error nothing complete is left under name.
//   - Get(name, dir) copies the archive's files into dir (an existing,
//     empty directory), fsyncing each file, and verifies each against the
//     manifest: ErrCorrupt on a mismatch or a missing file, ErrNotFound
//     when name has no complete archive. On error dir may hold partial
//     files: the caller owns dir.
//   - Has reports whether name has a complete archive.
//   - Delete removes name's archive; a missing one is not an error.
//
// Every method may be called concurrently for different names; calls for
// one name never overlap (the state machine has one operation in flight
// per VM).
type Store interface {
	Put(ctx context.Context, name, dir string) error
	Get(ctx context.Context, name, dir string) error
	Has(ctx context.Context, name string) (bool, error)
	Delete(ctx context.Context, name string) error
}

// Errors of Store.
var (
	ErrNotFound = errors.New("archive: no such archive")
	ErrCorrupt  = errors.New("archive: checksum mismatch")
)
