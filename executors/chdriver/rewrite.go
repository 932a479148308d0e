package chdriver

import (
	"context"
	"errors"
	"io/fs"
	"path/filepath"
	"syscall"

	"github.com/sbxlog/sbxlog/executors/fsx"
)

// rewriteDisk is a hibernate's AfterCommit: the snapshot's disk, a reflink
// of the VM's, carries every copy-on-write fragment the guest's writes made
// since the disk was last dense, and the next wake (and the hibernate after
// it) would FICLONE all of them. Past the extent bound it is rewritten
// densely in the background, off the hibernate's path, and swapped in
// crash-safely (fsx.RewriteDense); the snapshot being stopped, nothing
// writes it meanwhile, and a wake that clones it during the rewrite gets
// the old or the new file, equal in content. A snapshot a wake or destroy
// removed first is no error.
func (d *Driver) rewriteDisk(snapDir string) func(context.Context) error {
	if d.extents < 0 {
		return nil
	}
	return func(context.Context) error {
		disk := filepath.Join(snapDir, DiskFile)
		res, err := fsx.RewriteDense(disk, d.extents)
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.EOPNOTSUPP) {
			return nil // gone already, or a filesystem without FIEMAP (no reflink either)
		}
		if err != nil {
			return err
		}
		if res.Rewritten {
			d.log.Info().Str("disk", disk).Int("extents_before", res.Before).Int("extents_after", res.After).
				Int64("bytes", res.Bytes).Msg("rewrote a fragmented snapshot disk densely")
		}
		return nil
	}
}
