// Package silktest holds the acceptance suites of the agent's tool ops
// (the whole-tree ops, fs_watch, git and the language-server broker), run
// through the project's own client (silkd.Conn) against any agent: the
// agent engine in process on the host, the simulated guest of chsim and
// nodetest, and the real guest under QEMU. A suite takes a dialer for fresh
// connections and a base directory of the guest that it may fill.
package silktest

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"path"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/sbxlog/sbxlog/executors/guest/silkd"
)

// Dial returns a fresh connection to the agent; the suite closes it.
type Dial func(t testing.TB) *silkd.Conn

// Files is a tree by relative path.
type Files map[string][]byte

// TestTree is n files of about size bytes each, under a few directories;
// every tenth file has the word "needle" on its third line.
func TestTree(n, size int) Files {
	out := Files{}
	for i := range n {
		var b bytes.Buffer
		fmt.Fprintf(&b, "file %d\nline two\n", i)
		if i%10 == 0 {
			b.WriteString("a needle here\n")
		}
		line := strings.Repeat(fmt.Sprintf("%x", sha256.Sum256([]byte{byte(i), byte(i >> 8)})), 2) + "\n"
		for b.Len() < size {
			b.WriteString(line)
		}
		out[fmt.Sprintf("d%d/sub%d/f%04d.txt", i%7, i%3, i)] = b.Bytes()
	}
	return out
}

// Tar archives files (sorted, mode 0640) with their parent directories.
func Tar(t testing.TB, files Files) []byte {
	t.Helper()
	b, err := TarFiles(files)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TarFiles is Tar without a testing.TB, for benchmarks.
func TarFiles(files Files) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	dirs := map[string]bool{}
	for _, n := range names {
		var parents []string
		for d := path.Dir(n); d != "."; d = path.Dir(d) {
			parents = append([]string{d}, parents...)
		}
		for _, d := range parents {
			if !dirs[d] {
				dirs[d] = true
				if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: 0o755}); err != nil {
					return nil, err
				}
			}
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: n, Mode: 0o640, Size: int64(len(files[n]))}); err != nil {
			return nil, err
		}
		if _, err := tw.Write(files[n]); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// Untar reads an archive's regular files and their modes.
func Untar(t testing.TB, b []byte) (Files, map[string]int64) {
	t.Helper()
	files, modes := Files{}, map[string]int64{}
	tr := tar.NewReader(bytes.NewReader(b))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return files, modes
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			data, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			files[h.Name], modes[h.Name] = data, h.Mode
		}
	}
}

// CreateFile makes a file appear in the guest by other means than the
// suite's own fs ops (an exec in a real guest).
type CreateFile func(ctx context.Context, c *silkd.Conn, path string) error

// ExecCreate creates the file with a shell in the guest.
func ExecCreate(ctx context.Context, c *silkd.Conn, p string) error {
	res, err := c.Exec(ctx, silkd.Exec{Argv: []string{"sh", "-c", "echo hi > " + p}}, silkd.ExecIO{})
	if err == nil && res.Code != 0 {
		err = fmt.Errorf("sh exited %d", res.Code)
	}
	return err
}

// WriteCreate creates the file with fs_write (a simulated guest runs no
// shell).
func WriteCreate(ctx context.Context, c *silkd.Conn, p string) error {
	return c.WriteFile(ctx, silkd.FsWrite{Path: p}, strings.NewReader("hi\n"))
}

// Tree is the acceptance round trip of the whole-tree ops: a tree of n
// files of about size bytes pushed as tar under base/proj, a word found and
// replaced in it, a file created (by create) seen by fs_watch, the tree
// pulled back and every file's sha256 compared, and a second push merged.
// It returns the push's duration.
func Tree(t testing.TB, ctx context.Context, dial Dial, base string, n, size int, create CreateFile) time.Duration {
	c := dial(t)
	files := TestTree(n, size)
	archive := Tar(t, files)
	dest := base + "/proj"
	start := time.Now()
	if err := c.Push(ctx, dest, bytes.NewReader(archive)); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	t.Logf("fs_push of %d files, %d bytes of tar: %v", n, len(archive), took)

	es, err := c.List(ctx, dest)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range es {
		if strings.HasPrefix(e.Name, ".sbx-push-") {
			t.Fatalf("staging %s left in %s", e.Name, dest)
		}
	}

	matches, err := c.Find(ctx, dest, `\bneedle\b`, "*.txt")
	if err != nil {
		t.Fatal(err)
	}
	if want := (n + 9) / 10; len(matches) != want {
		t.Fatalf("%d matches, want %d", len(matches), want)
	}
	var hit []string
	for _, m := range matches {
		if m.Line != 3 || m.Content != "a needle here" || !strings.HasPrefix(m.File, dest+"/") {
			t.Fatalf("match %+v", m)
		}
		hit = append(hit, m.File)
	}
	if none, err := c.Find(ctx, dest, "needle", "*.go"); err != nil || len(none) != 0 {
		t.Fatalf("find with a glob no file matches = %v, %v", none, err)
	}

	res, err := c.Replace(ctx, hit, `need(le)`, "pin${1}s")
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != len(hit) {
		t.Fatalf("%d replace results for %d files", len(res), len(hit))
	}
	for i, r := range res {
		if r.File != hit[i] || r.Replacements != 1 {
			t.Fatalf("replace result %+v", r)
		}
		rel := strings.TrimPrefix(r.File, dest+"/")
		files[rel] = bytes.Replace(files[rel], []byte("needle"), []byte("pinles"), 1)
	}

	// The watch sees a file created after it is armed.
	w, err := dial(t).Watch(ctx, dest, true)
	if err != nil {
		t.Fatal(err)
	}
	created := dest + "/d1/new.txt"
	if err := create(ctx, c, created); err != nil {
		t.Fatal(err)
	}
	for {
		ev, err := w.Next()
		if err != nil {
			t.Fatal(err)
		}
		if ev.Path == created && ev.Kind == "created" {
			break
		}
	}
	w.Close()
	files["d1/new.txt"] = []byte("hi\n")

	var pulled bytes.Buffer
	if _, err := c.Pull(ctx, dest, &pulled); err != nil {
		t.Fatal(err)
	}
	back, modes := Untar(t, pulled.Bytes())
	if len(back) != len(files) {
		t.Fatalf("pulled %d files, want %d", len(back), len(files))
	}
	for name, want := range files {
		got, ok := back["proj/"+name]
		if !ok || sha256.Sum256(got) != sha256.Sum256(want) {
			t.Fatalf("%s: pulled %d bytes, want %d (present %v)", name, len(got), len(want), ok)
		}
		if name != "d1/new.txt" && modes["proj/"+name] != 0o640 {
			t.Fatalf("%s: mode %o, want 640", name, modes["proj/"+name])
		}
	}

	// A second push merges into the tree: new files arrive, the others stay.
	if err := c.Push(ctx, dest, bytes.NewReader(Tar(t, Files{"d1/more.txt": []byte("more")}))); err != nil {
		t.Fatal(err)
	}
	if st, err := c.Stat(ctx, dest+"/d1/more.txt"); err != nil || st.Size != 4 {
		t.Fatalf("merged file: %+v, %v", st, err)
	}
	if _, err := c.Stat(ctx, created); err != nil {
		t.Fatalf("a file of the tree is gone after a merge: %v", err)
	}
	return took
}
