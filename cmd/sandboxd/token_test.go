package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestLoadOrCreateToken(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "sub", "api.token")
	tok, created, err := loadOrCreateToken(path)
	if err != nil || !created || !strings.HasPrefix(tok, "sbxroot_") || len(tok) != len("sbxroot_")+64 {
		t.Fatalf("first call: %q created=%v err=%v", tok, created, err)
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("token file mode: %v, %v", fi, err)
	}
	again, created, err := loadOrCreateToken(path)
	if err != nil || created || again != tok {
		t.Fatalf("second call: %q created=%v err=%v, want %q", again, created, err, tok)
	}
	other, _, err := loadOrCreateToken(filepath.Join(dir, "other.token"))
	if err != nil || other == tok {
		t.Fatalf("a second file must get a fresh token: %q, %v", other, err)
	}
	// An operator's own file: the first line, trimmed.
	mine := filepath.Join(dir, "mine.token")
	if err := os.WriteFile(mine, []byte("  s3cret \nsecond line\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got, created, err := loadOrCreateToken(mine); err != nil || created || got != "s3cret" {
		t.Fatalf("operator file: %q created=%v err=%v", got, created, err)
	}
	empty := filepath.Join(dir, "empty.token")
	if err := os.WriteFile(empty, []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := loadOrCreateToken(empty); err == nil || !strings.Contains(err.Error(), "is empty") {
		t.Fatalf("empty file: %v", err)
	}
	if _, _, err := loadOrCreateToken(filepath.Join(empty, "x")); err == nil {
		t.Fatal("a path under a regular file must fail")
	}
}
