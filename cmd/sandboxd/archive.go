package main

import (
	"fmt"
	"path/filepath"
	"syscall"

	"github.com/rs/zerolog"

	"github.com/sbxlog/sbxlog/executors/archive"
)

// openArchive opens archive_dir, refusing the start when it is not an
// existing, writable directory. One on the data dir's filesystem works
// but protects nothing against that disk's loss, so it is logged.
func (c *Config) openArchive(zl zerolog.Logger) error {
	if c.ArchiveDir == "" {
		return nil
	}
	dir, err := filepath.Abs(c.ArchiveDir)
	if err != nil {
		return fmt.Errorf("archive_dir: %w", err)
	}
	s, err := archive.OpenDir(dir)
	if err != nil {
		return fmt.Errorf("archive_dir: %w", err)
	}
	c.archive = s
	var a, d syscall.Stat_t
	if syscall.Stat(dir, &a) == nil && syscall.Stat(c.DataDir, &d) == nil && a.Dev == d.Dev {
		zl.Warn().Str("archive_dir", dir).Str("data_dir", c.DataDir).Msg("archive_dir is on the data dir's filesystem: archives survive no loss of that disk")
	}
	zl.Info().Str("archive_dir", dir).Msg("archive store")
	return nil
}
