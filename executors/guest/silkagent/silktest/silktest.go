// Package silktest holds the acceptance suite of the agent's tool ops
// (issue 23's acceptance 3, 5 and 6: the whole-tree ops and fs_watch, git,
// the language-server broker), run through the project's own client
// (silkd.Conn) against every agent: the engine in process on the host, the
// simulated guest of chsim and nodetest, the busybox guest under QEMU and
// the Debian guest behind sandboxd's agent relay. Run takes an Agent: a
// dialer for fresh connections, a directory of the guest the suite may
// fill, and what the guest has. Where the simulated guest differs it says
// so and the suite asserts that answer (Simulated); nothing is skipped.
package silktest

import (
	"archive/tar"
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"path"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/sbxlog/sbxlog/executors/guest/silkd"
)

// Dial returns a fresh connection to the agent; the suite closes it.
type Dial func(t testing.TB) *silkd.Conn

// Agent is the agent under test and what its guest has.
type Agent struct {
	// Dial opens a new connection to it.
	Dial Dial
	// Base is a directory of the guest the suite fills (made if missing).
	Base string
	// Simulated: the simulated guest, which runs no shell (the watched file
	// is made by fs_write, no sha256sum runs in the guest) and answers the
	// git and lsp ops unimplemented, saying it is simulated.
	Simulated bool
	// GitBinary: the guest has git, so the repositories are started by
	// `git init` in the guest and what the git ops wrote is read back by
	// git itself. Without it they are made on the host and pushed (the
	// protocol has no git_init).
	GitBinary bool
	// LSPDir is the agent's directory of language-server manifests
	// (silkagent.DefaultLSPDir in a real guest); the suite writes into it.
	LSPDir string
	// Files and FileSize shape the tree of the round trip (default 1000
	// files of 10 KiB: 10 MiB).
	Files, FileSize int
	// Timeout bounds the suite (default 5 min; a guest under TCG is slow).
	Timeout time.Duration
}

func (a Agent) ctx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), cmp.Or(a.Timeout, 5*time.Minute))
	t.Cleanup(cancel)
	return ctx
}

// Run runs the whole suite: tree (acceptance 3), git (5), lsp (6).
func Run(t *testing.T, a Agent) {
	t.Run("tree", func(t *testing.T) { Tree(t, a) })
	t.Run("git", func(t *testing.T) { Git(t, a) })
	t.Run("lsp", func(t *testing.T) { LSP(t, a) })
}

// notSimulated asserts the simulated guest's answer to an op it does not
// simulate: unimplemented, saying the guest is simulated.
func notSimulated(t testing.TB, op string, err error) {
	t.Helper()
	if !errors.Is(err, silkd.ErrUnimplemented) || !strings.Contains(err.Error(), "simulated") {
		t.Fatalf("%s on the simulated guest = %v, want unimplemented saying it is simulated", op, err)
	}
}

// guestRun runs argv in the guest and returns its stdout; a failure or a
// non-zero exit is fatal.
func guestRun(t testing.TB, ctx context.Context, c *silkd.Conn, argv ...string) string {
	t.Helper()
	var out, errb bytes.Buffer
	res, err := c.Exec(ctx, silkd.Exec{Argv: argv}, silkd.ExecIO{Stdout: &out, Stderr: &errb})
	if err != nil || res.Code != 0 {
		t.Fatalf("exec %q in the guest: %+v, %v, stderr %q", argv, res, err, errb.String())
	}
	return out.String()
}

// Files is a tree by relative path.
type Files map[string][]byte

// TestTree is n files of about size bytes each under 21 directories, of
// deterministic pseudo-random text (lines of hex digits, seeded by the
// file's index); every tenth file has the word "needle" on its third line,
// which hex cannot spell anywhere else.
func TestTree(n, size int) Files {
	out := Files{}
	for i := range n {
		var b bytes.Buffer
		fmt.Fprintf(&b, "file %d\nline two\n", i)
		if i%10 == 0 {
			b.WriteString("a needle here\n")
		}
		rng := rand.New(rand.NewPCG(uint64(i), 0x5b71_7e57))
		var raw [32]byte
		for b.Len() < size {
			for j := 0; j < len(raw); j += 8 {
				v := rng.Uint64()
				for k := range 8 {
					raw[j+k] = byte(v >> (8 * k))
				}
			}
			b.WriteString(hex.EncodeToString(raw[:]))
			b.WriteByte('\n')
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

// changeWatched acts on the guest by other means than the suite's fs ops:
// argv run by the guest's sh, or on the simulated guest, which runs no
// shell, sim (fs ops).
func changeWatched(ctx context.Context, a Agent, c *silkd.Conn, sh string, args []string, sim func() error) error {
	if a.Simulated {
		return sim()
	}
	res, err := c.Exec(ctx, silkd.Exec{Argv: append([]string{"sh", "-c", sh, "sh"}, args...)}, silkd.ExecIO{})
	if err == nil && res.Code != 0 {
		err = fmt.Errorf("sh -c %q exited %d", sh, res.Code)
	}
	return err
}

// awaitEvents reads w until each of want has come, in order (other events
// between them are passed over).
func awaitEvents(t testing.TB, w *silkd.Watch, want ...silkd.Event) {
	t.Helper()
	var seen []silkd.Event
	for len(want) > 0 {
		ev, err := w.Next()
		if err != nil {
			t.Fatalf("watch ended (%v) before %+v; it said %+v", err, want, seen)
		}
		seen = append(seen, ev)
		if ev == want[0] {
			want = want[1:]
		}
	}
}

// guestSums is the sha256 of every file under dir, by path relative to it,
// as the guest's sha256sum computes them.
func guestSums(t testing.TB, ctx context.Context, c *silkd.Conn, dir string) map[string]string {
	t.Helper()
	out := guestRun(t, ctx, c, "sh", "-c", `cd "$1" && find . -type f | xargs sha256sum`, "sh", dir)
	sums := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		sum, name, ok := strings.Cut(line, "  ")
		if !ok {
			t.Fatalf("sha256sum said %q", line)
		}
		sums[strings.TrimPrefix(name, "./")] = sum
	}
	return sums
}

// Tree is acceptance 3, the round trip of the whole-tree ops: a tree of
// a.Files files pushed as tar under Base/proj, a word found in it and
// replaced, a file created by an exec seen by fs_watch and its move seen
// renamed at both ends (fs ops on the simulated guest), the sha256 of
// every file in the guest (its sha256sum) and pulled back compared with
// the test's, and a second push merged. Each step's duration is logged.
func Tree(t testing.TB, a Agent) {
	ctx := a.ctx(t)
	c := a.Dial(t)
	n := cmp.Or(a.Files, 1000)
	files := TestTree(n, cmp.Or(a.FileSize, 10<<10))
	archive := Tar(t, files)
	dest := a.Base + "/proj"
	if err := c.Mkdir(ctx, a.Base, true); err != nil {
		t.Fatal(err)
	}
	step := time.Now()
	lap := func(what string) {
		t.Helper()
		t.Logf("%s: %v", what, time.Since(step))
		step = time.Now()
	}
	if err := c.Push(ctx, dest, bytes.NewReader(archive)); err != nil {
		t.Fatal(err)
	}
	lap(fmt.Sprintf("fs_push of %d files, %d bytes of tar (%.1f MiB/s)", n, len(archive),
		float64(len(archive))/(1<<20)/time.Since(step).Seconds()))

	es, err := c.List(ctx, dest)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range es {
		if strings.HasPrefix(e.Name, ".sbx-push-") {
			t.Fatalf("staging %s left in %s", e.Name, dest)
		}
	}

	step = time.Now()
	matches, err := c.Find(ctx, dest, `\bneedle\b`, "*.txt")
	if err != nil {
		t.Fatal(err)
	}
	lap(fmt.Sprintf("fs_find: %d matches", len(matches)))
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

	step = time.Now()
	res, err := c.Replace(ctx, hit, `need(le)`, "pin${1}s")
	if err != nil {
		t.Fatal(err)
	}
	lap(fmt.Sprintf("fs_replace of %d files", len(res)))
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
	if again, err := c.Find(ctx, dest, `\bneedle\b`, ""); err != nil || len(again) != 0 {
		t.Fatalf("find after the replace = %+v, %v", again, err)
	}

	// The watch sees a file created after it is armed, by an exec, and
	// its move, renamed at both ends.
	step = time.Now()
	w, err := a.Dial(t).Watch(ctx, dest, true)
	if err != nil {
		t.Fatal(err)
	}
	created, moved := dest+"/d1/new.txt", dest+"/d1/moved.txt"
	if err := changeWatched(ctx, a, c, `echo hi > "$1"`, []string{created}, func() error {
		return c.WriteFile(ctx, silkd.FsWrite{Path: created}, strings.NewReader("hi\n"))
	}); err != nil {
		t.Fatal(err)
	}
	awaitEvents(t, w, silkd.Event{Kind: "created", Path: created})
	if err := changeWatched(ctx, a, c, `mv "$1" "$2"`, []string{created, moved}, func() error {
		return c.Rename(ctx, created, moved)
	}); err != nil {
		t.Fatal(err)
	}
	awaitEvents(t, w, silkd.Event{Kind: "renamed", Path: created}, silkd.Event{Kind: "renamed", Path: moved})
	w.Close()
	lap("fs_watch armed, a file created and moved, their events seen")
	files["d1/moved.txt"] = []byte("hi\n")

	if a.Simulated {
		t.Log("the simulated guest has no sha256sum: the files are compared as pulled")
	} else {
		step = time.Now()
		sums := guestSums(t, ctx, c, dest)
		lap(fmt.Sprintf("sha256sum of %d files in the guest", len(sums)))
		if len(sums) != len(files) {
			t.Fatalf("the guest has %d files, want %d", len(sums), len(files))
		}
		for name, want := range files {
			if sum := sha256.Sum256(want); sums[name] != hex.EncodeToString(sum[:]) {
				t.Fatalf("%s: sha256 %q in the guest, want %x", name, sums[name], sum)
			}
		}
	}

	step = time.Now()
	var pulled bytes.Buffer
	if _, err := c.Pull(ctx, dest, &pulled); err != nil {
		t.Fatal(err)
	}
	lap(fmt.Sprintf("fs_pull of %d bytes of tar", pulled.Len()))
	back, modes := Untar(t, pulled.Bytes())
	if len(back) != len(files) {
		t.Fatalf("pulled %d files, want %d", len(back), len(files))
	}
	for name, want := range files {
		got, ok := back["proj/"+name]
		if !ok || sha256.Sum256(got) != sha256.Sum256(want) {
			t.Fatalf("%s: pulled %d bytes, want %d (present %v)", name, len(got), len(want), ok)
		}
		if name != "d1/moved.txt" && modes["proj/"+name] != 0o640 {
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
	if _, err := c.Stat(ctx, moved); err != nil {
		t.Fatalf("a file of the tree is gone after a merge: %v", err)
	}
}
