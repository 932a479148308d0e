package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// push copies a local directory's contents in, pull copies a guest
// directory back under its base name (over the simulated guest).
func TestPushPullCommands(t *testing.T) {
	startNode(t, 1)
	cl := claimOne(t)
	t.Setenv(envSandboxToken, cl.Token)
	src := t.TempDir()
	files := map[string]string{"a.txt": "alpha", "sub/b.txt": "beta", "sub/deeper/c.bin": strings.Repeat("\x00\x01", 70000)}
	for name, data := range files {
		p := filepath.Join(src, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o640); err != nil {
			t.Fatal(err)
		}
	}
	mustRun(t, "push", cl.ID, src, "/work/proj")
	if out := mustRun(t, "cp", cl.ID+":/work/proj/sub/b.txt", "-"); out != "beta" {
		t.Fatalf("a pushed file reads %q", out)
	}
	dst := t.TempDir()
	mustRun(t, "pull", cl.ID, "/work/proj", dst)
	for name, data := range files {
		got, err := os.ReadFile(filepath.Join(dst, "proj", name))
		if err != nil || !bytes.Equal(got, []byte(data)) {
			t.Fatalf("%s pulled back: %d bytes, %v", name, len(got), err)
		}
		if st, _ := os.Stat(filepath.Join(dst, "proj", name)); st.Mode().Perm() != 0o640 {
			t.Fatalf("%s: mode %v, want 0640", name, st.Mode().Perm())
		}
	}
	if code, _, errs := sbx("pull", cl.ID, "/work/missing", dst); code != 1 || !strings.Contains(errs, "not_found") {
		t.Fatalf("pull of a missing path: exit %d, %q", code, errs)
	}
	if code, _, errs := sbx("push", cl.ID, filepath.Join(src, "a.txt"), "/work/x"); code != 2 || !strings.Contains(errs, "not a directory") {
		t.Fatalf("push of a file: exit %d, %q", code, errs)
	}
}
