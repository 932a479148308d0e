// Package fsx holds the filesystem primitives the executor recipes are built from:
// reflink clones with a sparse-copy fallback, hard links, atomic small-file writes,
// ordered fsync of whole trees, temp dirs inside the snapshot store, and FIEMAP
// inspection used by tests to prove that a clone shares its extents.
//
// Contract, per helper:
//
//   - Cloner.Clone(dst, src) makes dst a copy of the regular file src. It first tries
//     FICLONE (a reflink: dst shares src's extents, O(1) in file size). Where the
//     filesystem cannot reflink (EOPNOTSUPP, EXDEV, EINVAL, ENOTTY), it copies only the
//     data ranges that SEEK_DATA/SEEK_HOLE report, so holes stay holes. Which path is
//     possible is detected once per (source st_dev, destination st_dev) pair, and the
//     fallback is logged once per pair. dst is created O_EXCL unless Overwrite is given;
//     on failure dst is removed, so a failed Clone never leaves a partial file. Size and
//     permission bits of src are preserved. Clone does not fsync: the recipe decides
//     when durability is needed (SyncTree).
//   - Link(dst, src) hard-links; it succeeds without change when dst already is src.
//   - WriteFileAtomic writes a temp file in the same directory, fsyncs it, renames it
//     over path and fsyncs the directory: readers see the old or the new content, and
//     after return the new content survives a crash.
//   - SyncTree(dir) fsyncs every regular file under dir, then every directory below
//     dir deepest first, then dir, then dir's parent. Files before directories because a
//     directory fsync makes its entries durable, and an entry must never become
//     durable pointing at data that is not; the parent last because it holds dir's own
//     name.
//   - SyncDir(dir) fsyncs one directory: what makes a create, rename or remove in it
//     durable (callers outside fsx that change a directory themselves use it).
//   - MkTempDir creates a directory named TempPrefix+prefix+random inside the store, on
//     the store's filesystem, so the final RenameDir is a same-filesystem atomic rename.
//     SweepTemp removes every TempPrefix entry of the store; it is for start-up only,
//     before any recipe runs.
//   - RenameDir renames without replacing an existing target and fsyncs the parent
//     directories of both names.
//   - Extents/AllExtentsShared/SharedBytes read FIEMAP; AllocatedBytes/IsSparse read
//     st_blocks.
//
// FS is the interface recipes use for every side-effecting filesystem step, so a test
// can wrap the real OS implementation in a Recorder and check the order of steps or
// abort the recipe at any step.
//
// Errors: ErrSameFile (Clone with Overwrite onto its own source), ErrNotRegular
// (Clone of something that is not a regular file); other failures wrap the
// underlying *fs.PathError, so errors.Is(err, fs.ErrExist) and friends work.
package fsx
