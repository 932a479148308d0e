package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rs/zerolog"
)

// archive_dir is opened at start: a path that is not an existing, writable
// directory refuses the start with an error naming it.
func TestArchiveDirRefused(t *testing.T) {
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for dir, want := range map[string]string{
		file:                "not a directory",
		"/nonexistent/arch": "no such file",
		"/proc/1":           "not writable",
	} {
		c := Config{ArchiveDir: dir, DataDir: t.TempDir()}
		err := c.openArchive(zerolog.Nop())
		if err == nil || !strings.Contains(err.Error(), "archive_dir") || !strings.Contains(err.Error(), want) {
			t.Errorf("archive_dir %s: %v, want an error with %q", dir, err, want)
		}
	}
	c := Config{ArchiveDir: t.TempDir(), DataDir: t.TempDir()}
	if err := c.openArchive(zerolog.Nop()); err != nil || c.archive == nil {
		t.Fatalf("a writable dir: %v", err)
	}
}
