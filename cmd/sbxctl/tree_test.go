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

// cp -r copies trees both ways; a file copied to a guest directory (with
// or without its trailing "/") lands under its base name; each copy ends
// with a summary line on stderr; a directory without -r is a usage error
// (issue 25 item 10: cp a ID:/tmp/ failed, cp took no directories).
func TestCpDirectoriesAndDestDirs(t *testing.T) {
	startNode(t, 1)
	cl := claimOne(t)
	src := t.TempDir()
	files := map[string]string{"top.txt": "top", "sub/leaf.txt": "leaf"}
	for name, data := range files {
		p := filepath.Join(src, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	mustRun(t, "push", cl.ID, t.TempDir(), "/work/dir") // the simulated guest has no mkdir
	for _, dest := range []string{cl.ID + ":/work/dir/", cl.ID + ":/work/dir"} {
		code, out, errs := sbx("cp", filepath.Join(src, "top.txt"), dest)
		if code != 0 || out != "" || !strings.HasPrefix(errs, "copied "+filepath.Join(src, "top.txt")+" to "+cl.ID+":/work/dir/top.txt (3 B in ") {
			t.Fatalf("cp to %s: exit %d, stdout %q, stderr %q", dest, code, out, errs)
		}
	}
	if out := mustRun(t, "cp", cl.ID+":/work/dir/top.txt", "-"); out != "top" {
		t.Fatalf("file in the directory reads %q", out)
	}
	if code, _, errs := sbx("cp", src, cl.ID+":/work/tree"); code != 2 || !strings.Contains(errs, "cp -r copies directories") {
		t.Fatalf("directory without -r: exit %d, %q", code, errs)
	}
	mustRun(t, "cp", "-r", src, cl.ID+":/work/tree")
	if out := mustRun(t, "cp", cl.ID+":/work/tree/sub/leaf.txt", "-"); out != "leaf" {
		t.Fatalf("a copied tree's file reads %q", out)
	}
	back := t.TempDir()
	if code, _, errs := sbx("cp", cl.ID+":/work/tree", back); code != 2 || !strings.Contains(errs, "cp -r copies directories") {
		t.Fatalf("guest directory without -r: exit %d, %q", code, errs)
	}
	code, _, errs := sbx("cp", "-r", "-q", cl.ID+":/work/tree", back)
	if code != 0 || errs != "" {
		t.Fatalf("cp -r -q back: exit %d, %q", code, errs)
	}
	// A destination that does not exist becomes the copy, as with cp -r
	// (README's round trip: cp -r ./proj ID:/work/proj, back to ./out).
	fresh := filepath.Join(t.TempDir(), "out")
	mustRun(t, "cp", "-r", "-q", cl.ID+":/work/tree", fresh)
	for name, data := range files {
		if got, err := os.ReadFile(filepath.Join(back, "tree", name)); err != nil || string(got) != data {
			t.Fatalf("%s copied back: %q, %v", name, got, err)
		}
		if got, err := os.ReadFile(filepath.Join(fresh, name)); err != nil || string(got) != data {
			t.Fatalf("%s copied back to a new directory: %q, %v", name, got, err)
		}
	}
	if ents, _ := os.ReadDir(filepath.Dir(fresh)); len(ents) != 1 {
		t.Fatalf("beside the new directory: %d entries, want only it (no temporary left)", len(ents))
	}
}
