package silkagent

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sbxlog/sbxlog/executors/guest/silkagent/silktest"
	"github.com/sbxlog/sbxlog/executors/guest/silkd"
)

// treeBackends are the two trees the whole-tree ops serve: the machine's
// own and the simulated guest's.
var treeBackends = []struct {
	name string
	fs   func(t *testing.T) (FS, string)
}{
	{"os", func(t *testing.T) (FS, string) { return OSFS{}, t.TempDir() }},
	{"mem", func(t *testing.T) (FS, string) {
		return NewMemFS([]MemFile{{Path: "/work", Dir: true, Mode: 0o755}}), "/work"
	}},
}

func conns(dial func() net.Conn) silktest.Dial {
	return func(t testing.TB) *silkd.Conn {
		c := silkd.NewConn(dial())
		t.Cleanup(func() { c.Close() })
		return c
	}
}

// Issue 23's tool-ops suite (silktest) on the engine with the host's files,
// processes and go-git: the 10 MiB, 1000-file round trip (files of 1 KiB
// under the race detector), the git ops and the language-server broker
// with the stub server run by the host's sh.
func TestToolOpsOS(t *testing.T) {
	size := 10 << 10
	if raceEnabled {
		size = 1 << 10
	}
	lspDir := t.TempDir()
	dial := serve(t, &Server{FS: OSFS{}, Procs: OSProcs{}, Git: true, LSPDir: lspDir, Now: func() time.Time { return time.Unix(1_700_000_000, 0) }})
	silktest.Run(t, silktest.Agent{Dial: conns(dial), Base: t.TempDir(), LSPDir: lspDir, FileSize: size, Timeout: 3 * time.Minute})
}

// The suite on the simulated guest: the whole-tree ops and fs_watch over
// its MemFS (the watched file made by fs_write); git and lsp answered
// unimplemented, saying it is simulated.
func TestToolOpsSim(t *testing.T) {
	size := 10 << 10
	if raceEnabled {
		size = 1 << 10
	}
	_, dial := simServer(t)
	silktest.Run(t, silktest.Agent{Dial: func(testing.TB) *silkd.Conn { return dial() }, Base: "/tmp", Simulated: true, FileSize: size, Timeout: 3 * time.Minute})
	if m, err := dial().Find(testCtx(t), "/tmp", "^file$", "f"); err != nil || len(m) != 1 || m[0].File != "/tmp/f" {
		t.Fatalf("find in the simulated guest = %+v, %v", m, err)
	}
}

// Without Simulated an unimplemented op does not claim a simulation.
func TestUnimplementedNotSimulated(t *testing.T) {
	c := client(t, serve(t, &Server{FS: OSFS{}}))
	_, err := c.GitStatus(testCtx(t), t.TempDir())
	if !errors.Is(err, silkd.ErrUnimplemented) || strings.Contains(err.Error(), "simulated") {
		t.Fatalf("git_status without a git backend = %v, want unimplemented, not simulated", err)
	}
}

// tarEntry is one entry of a hand-made archive.
type tarEntry struct {
	typ  byte
	name string
	link string
	data string
}

func rawTar(t *testing.T, entries ...tarEntry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Typeflag: e.typ, Name: e.name, Linkname: e.link, Mode: 0o644, Size: int64(len(e.data))}
		if e.typ != tar.TypeReg {
			h.Size = 0
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if e.typ == tar.TypeReg {
			if _, err := tw.Write([]byte(e.data)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// A push that names a path outside dest, reaches outside it through a
// link, or passes a bound is refused, and dest is left as it was.
func TestPushRefusals(t *testing.T) {
	reg := func(name string) tarEntry { return tarEntry{typ: tar.TypeReg, name: name, data: "x"} }
	sym := func(name, link string) tarEntry { return tarEntry{typ: tar.TypeSymlink, name: name, link: link} }
	cases := []struct {
		name    string
		archive func(t *testing.T) []byte
		msg     string
		osOnly  bool // symlinks: the simulated guest refuses them all
	}{
		{"dot-dot", func(t *testing.T) []byte { return rawTar(t, reg("ok.txt"), reg("a/../../evil")) }, `names with ".." are refused`, false},
		{"absolute", func(t *testing.T) []byte { return rawTar(t, reg("/etc/evil")) }, "absolute or empty names are refused", false},
		{"symlink out", func(t *testing.T) []byte { return rawTar(t, sym("l", "../../etc")) }, "leaves the destination", true},
		{"absolute symlink", func(t *testing.T) []byte { return rawTar(t, sym("l", "/etc")) }, "leaves the destination", true},
		{"symlink chain out", func(t *testing.T) []byte { return rawTar(t, sym("d/t", "s/.."), sym("d/s", "..")) }, "leaves the destination", true},
		{"symlink loop", func(t *testing.T) []byte { return rawTar(t, sym("a", "b"), sym("b", "a")) }, "leaves the destination", true},
		{"write through a symlink", func(t *testing.T) []byte { return rawTar(t, sym("l", "."), reg("l/x")) }, "lies below the archive's symlink", true},
		{"hard link out", func(t *testing.T) []byte {
			return rawTar(t, tarEntry{typ: tar.TypeLink, name: "h", link: "../../etc/passwd"})
		}, "hard link", false},
		{"too many entries", func(t *testing.T) []byte { return rawTar(t, reg("1"), reg("2"), reg("3"), reg("4")) }, "more than 3 entries", false},
		{"too many bytes", func(t *testing.T) []byte {
			return rawTar(t, tarEntry{typ: tar.TypeReg, name: "big", data: strings.Repeat("x", 2000)})
		}, "more than 1000 bytes", false},
		{"not a tar", func(t *testing.T) []byte { return bytes.Repeat([]byte("not a tar stream "), 100) }, "not a valid tar stream", false},
		{"cut short", func(t *testing.T) []byte { return rawTar(t, reg("a"), reg("b"))[:700] }, "not a valid tar stream", false},
	}
	for _, b := range treeBackends {
		t.Run(b.name, func(t *testing.T) {
			fsys, base := b.fs(t)
			dial := serve(t, &Server{FS: fsys, Limits: Limits{TarEntries: 3, TarBytes: 1000}})
			c := client(t, dial)
			ctx := testCtx(t)
			dest := base + "/dest"
			if err := c.Mkdir(ctx, dest, false); err != nil {
				t.Fatal(err)
			}
			for _, tc := range cases {
				if tc.osOnly && b.name == "mem" {
					continue
				}
				t.Run(tc.name, func(t *testing.T) {
					err := client(t, dial).Push(ctx, dest, bytes.NewReader(tc.archive(t)))
					if !errors.Is(err, silkd.ErrBadRequest) || !strings.Contains(err.Error(), tc.msg) {
						t.Fatalf("push = %v, want a bad_request with %q", err, tc.msg)
					}
					if es, err := c.List(ctx, dest); err != nil || len(es) != 0 {
						t.Fatalf("dest after a refused push: %v, %v", es, err)
					}
				})
			}
			t.Run("a symlink in the simulated guest", func(t *testing.T) {
				if b.name != "mem" {
					t.Skip("the real tree takes symlinks")
				}
				err := c.Push(ctx, dest, bytes.NewReader(rawTar(t, sym("l", "x"))))
				if !errors.Is(err, silkd.ErrBadRequest) || !strings.Contains(err.Error(), "holds no symlinks") {
					t.Fatalf("push = %v", err)
				}
			})
			t.Run("a stream without data_end", func(t *testing.T) {
				r := newRaw(t, dial)
				r.send(silkd.FsPush{Dest: dest}, silkd.Data{Data: rawTar(t, reg("a"))})
				if err := r.c.(interface{ CloseWrite() error }).CloseWrite(); err != nil {
					t.Fatal(err)
				}
				r.expectError(silkd.KindBadRequest, "stream ended before data_end")
				if es, err := c.List(ctx, dest); err != nil || len(es) != 0 {
					t.Fatalf("dest after a cut push: %v, %v", es, err)
				}
			})
		})
	}
}

// Symlinks inside the tree survive a push and a pull on the real tree.
func TestPushSymlinksInside(t *testing.T) {
	base := t.TempDir()
	c := client(t, serve(t, &Server{FS: OSFS{}}))
	ctx := testCtx(t)
	archive := rawTar(t,
		tarEntry{typ: tar.TypeReg, name: "lib/real.js", data: "code"},
		tarEntry{typ: tar.TypeSymlink, name: "bin/tool", link: "../lib/real.js"},
		tarEntry{typ: tar.TypeLink, name: "lib/copy.js", link: "lib/real.js"},
	)
	if err := c.Push(ctx, base+"/p", bytes.NewReader(archive)); err != nil {
		t.Fatal(err)
	}
	if target, err := os.Readlink(base + "/p/bin/tool"); err != nil || target != "../lib/real.js" {
		t.Fatalf("symlink %q, %v", target, err)
	}
	if b, err := os.ReadFile(base + "/p/lib/copy.js"); err != nil || string(b) != "code" {
		t.Fatalf("hard link %q, %v", b, err)
	}
	var out bytes.Buffer
	if _, err := c.Pull(ctx, base+"/p", &out); err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(&out)
	seen := map[string]string{}
	for {
		h, err := tr.Next()
		if err != nil {
			break
		}
		seen[h.Name] = h.Linkname
	}
	if link, ok := seen["p/bin/tool"]; !ok || link != "../lib/real.js" {
		t.Fatalf("pulled entries %v", seen)
	}
}

// fs_pull is bounded too, and refuses what has no base name.
func TestPullRefusals(t *testing.T) {
	base := t.TempDir()
	for i := range 5 {
		if err := os.WriteFile(filepath.Join(base, fmt.Sprint(i)), []byte("12345"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ctx := testCtx(t)
	for _, tc := range []struct {
		name   string
		limits Limits
		path   string
		kind   *silkd.Error
		msg    string
	}{
		{"entries", Limits{TarEntries: 3}, base, silkd.ErrBadRequest, "more than 3 entries"},
		{"bytes", Limits{TarBytes: 12}, base, silkd.ErrBadRequest, "more than 12 bytes"},
		{"root", Limits{}, "/", silkd.ErrBadRequest, "no base name"},
		{"missing", Limits{}, base + "/nope", silkd.ErrNotFound, "nope"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := client(t, serve(t, &Server{FS: OSFS{}, Limits: tc.limits}))
			_, err := c.Pull(ctx, tc.path, io.Discard)
			if !errors.Is(err, tc.kind) || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("pull = %v, want %v with %q", err, tc.kind, tc.msg)
			}
		})
	}
}

func TestFindAndReplaceBounds(t *testing.T) {
	for _, b := range treeBackends {
		t.Run(b.name, func(t *testing.T) {
			fsys, base := b.fs(t)
			c := client(t, serve(t, &Server{FS: fsys, Limits: Limits{FindMatches: 5, FindFileBytes: 100}}))
			ctx := testCtx(t)
			write := func(name, data string) {
				if err := c.WriteFile(ctx, silkd.FsWrite{Path: base + "/" + name}, strings.NewReader(data)); err != nil {
					t.Fatal(err)
				}
			}
			write("few.txt", "x\nx\r\nx\n")
			write("big.txt", strings.Repeat("x\n", 100))
			write("bin.dat", "x\xff\xfe\n")
			if m, err := c.Find(ctx, base, "x", ""); err != nil || len(m) != 3 || m[1].Content != "x" || m[1].Line != 2 {
				t.Fatalf("find skipping the big and the binary file = %+v, %v", m, err)
			}
			write("more.txt", "x\nx\nx\n")
			if _, err := c.Find(ctx, base, "x", ""); !errors.Is(err, silkd.ErrBadRequest) || !strings.Contains(err.Error(), "more than 5 matches") {
				t.Fatalf("find past the bound = %v", err)
			}
			if _, err := c.Find(ctx, base, "(", ""); !errors.Is(err, silkd.ErrBadRequest) {
				t.Fatalf("find of a bad pattern = %v", err)
			}
			if _, err := c.Find(ctx, base+"/nope", "x", ""); !errors.Is(err, silkd.ErrNotFound) {
				t.Fatalf("find under a missing path = %v", err)
			}
			res, err := c.Replace(ctx, []string{base + "/few.txt", base + "/big.txt"}, "x", "yy")
			if err != nil || len(res) != 2 || res[0].Replacements != 3 || res[1].Replacements != 0 {
				t.Fatalf("replace = %+v, %v", res, err)
			}
			var got bytes.Buffer
			if _, err := c.ReadFile(ctx, base+"/few.txt", &got); err != nil || got.String() != "yy\nyy\r\nyy\n" {
				t.Fatalf("replaced file %q, %v", got.String(), err)
			}
			if _, err := c.Replace(ctx, []string{base + "/nope"}, "x", "y"); !errors.Is(err, silkd.ErrNotFound) {
				t.Fatalf("replace of a missing file = %v", err)
			}
			if _, err := c.Replace(ctx, []string{base + "/few.txt"}, "(", "y"); !errors.Is(err, silkd.ErrBadRequest) {
				t.Fatalf("replace with a bad pattern = %v", err)
			}
		})
	}
}

// burstFS is a Watcher that reports n events before its watch is armed,
// so the queue is full before the client reads anything.
type burstFS struct {
	FS
	n int
}

func (b burstFS) Watch(p string, _ bool, emit func(silkd.Event), _ func(error)) (func(), error) {
	for i := range b.n {
		emit(silkd.Event{Kind: "created", Path: fmt.Sprintf("%s/%d", p, i)})
	}
	return func() {}, nil
}

func TestWatchOverflowAndEnd(t *testing.T) {
	ctx := testCtx(t)
	dial := serve(t, &Server{FS: burstFS{FS: NewMemFS(nil), n: 10}, Limits: Limits{WatchQueue: 4}})
	w, err := client(t, dial).Watch(ctx, "/w", false)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 4 {
		ev, err := w.Next()
		if err != nil || ev.Path != fmt.Sprintf("/w/%d", i) {
			t.Fatalf("event %d = %+v, %v", i, ev, err)
		}
	}
	if _, err := w.Next(); !errors.Is(err, silkd.ErrInternal) || !strings.Contains(err.Error(), overflowMessage) {
		t.Fatalf("after the queue's bound = %v", err)
	}

	// A frame from the client ends the watch without a terminal frame, and
	// the connection serves the next RPC.
	mem := NewMemFS([]MemFile{{Path: "/w", Dir: true, Mode: 0o755}})
	r := newRaw(t, serve(t, &Server{FS: mem}))
	r.send(silkd.FsWatch{Path: "/w"})
	r.expect(silkd.TypeReady)
	if err := mem.Mkdir("/w/a", false); err != nil {
		t.Fatal(err)
	}
	r.expect(&silkd.Event{Kind: "created", Path: "/w/a"})
	r.send(silkd.Info{})
	r.expect(silkd.TypeInfo)
	if err := mem.Mkdir("/w/b", false); err != nil {
		t.Fatal(err)
	}
	r.send(silkd.FsStat{Path: "/w/b"})
	r.expect(silkd.TypeStat)

	if _, err := client(t, serve(t, &Server{FS: mem})).Watch(ctx, "/nope", true); !errors.Is(err, silkd.ErrNotFound) {
		t.Fatalf("watch of a missing path = %v", err)
	}
	if _, err := client(t, serve(t, &Server{FS: OSFS{}})).Watch(ctx, t.TempDir()+"/nope", true); !errors.Is(err, silkd.ErrNotFound) {
		t.Fatalf("watch of a missing path (os) = %v", err)
	}
}

// The real tree's watch names each change as the old agent did: a move is
// renamed at both of its ends (also one from outside the watch: the old
// agent's inotify said renamed for every IN_MOVED_TO; the fsnotify this
// agent used said created), a chmod is modified, and a directory moved
// within the tree is watched under its new name. A directory's removal is
// said once.
func TestWatchOSKinds(t *testing.T) {
	base := t.TempDir()
	root, outside := base+"/w", base+"/outside"
	for _, d := range []string{root, outside} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	w, err := client(t, serve(t, &Server{FS: OSFS{}})).Watch(testCtx(t), root, true)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	touch := func(p string) error {
		f, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
		if err == nil {
			err = f.Close()
		}
		return err
	}
	for _, step := range []struct {
		do   func() error
		want []silkd.Event
	}{
		{func() error { return touch(root + "/a") }, []silkd.Event{{Kind: "created", Path: root + "/a"}}},
		{func() error { return os.Chmod(root+"/a", 0o600) }, []silkd.Event{{Kind: "modified", Path: root + "/a"}}},
		{func() error { return os.Rename(root+"/a", root+"/b") }, []silkd.Event{{Kind: "renamed", Path: root + "/a"}, {Kind: "renamed", Path: root + "/b"}}},
		{func() error {
			if err := touch(outside + "/x"); err != nil {
				return err
			}
			return os.Rename(outside+"/x", root+"/x")
		}, []silkd.Event{{Kind: "renamed", Path: root + "/x"}}},
		{func() error { return os.Rename(root+"/x", outside+"/y") }, []silkd.Event{{Kind: "renamed", Path: root + "/x"}}},
		{func() error { return os.Mkdir(root+"/d", 0o755) }, []silkd.Event{{Kind: "created", Path: root + "/d"}}},
		{func() error { return touch(root + "/d/f") }, []silkd.Event{{Kind: "created", Path: root + "/d/f"}}},
		{func() error { return os.Rename(root+"/d", root+"/e") }, []silkd.Event{{Kind: "renamed", Path: root + "/d"}, {Kind: "renamed", Path: root + "/e"}}},
		{func() error { return touch(root + "/e/g") }, []silkd.Event{{Kind: "created", Path: root + "/e/g"}}},
		{func() error { return os.Chmod(root+"/e", 0o700) }, []silkd.Event{{Kind: "modified", Path: root + "/e"}}},
		{func() error { return os.RemoveAll(root + "/e") }, []silkd.Event{{Kind: "deleted", Path: root + "/e/f"}, {Kind: "deleted", Path: root + "/e/g"}, {Kind: "deleted", Path: root + "/e"}}},
		{func() error { return os.Remove(root + "/b") }, []silkd.Event{{Kind: "deleted", Path: root + "/b"}}},
	} {
		if err := step.do(); err != nil {
			t.Fatal(err)
		}
		var got []silkd.Event
		for len(got) < len(step.want) {
			ev, err := w.Next()
			if err != nil {
				t.Fatalf("after %+v: %v", got, err)
			}
			got = append(got, ev)
		}
		// RemoveAll's order of a directory's entries is the directory's.
		slices.SortFunc(got, func(a, b silkd.Event) int { return strings.Compare(a.Path+a.Kind, b.Path+b.Kind) })
		want := slices.Clone(step.want)
		slices.SortFunc(want, func(a, b silkd.Event) int { return strings.Compare(a.Path+a.Kind, b.Path+b.Kind) })
		if !slices.Equal(got, want) {
			t.Fatalf("events %+v, want %+v", got, want)
		}
	}
	// Nothing more was said (a directory's chmod and removal once, not
	// again by its own watch): the next event is the marker's.
	if err := touch(root + "/marker"); err != nil {
		t.Fatal(err)
	}
	if ev, err := w.Next(); err != nil || ev != (silkd.Event{Kind: "created", Path: root + "/marker"}) {
		t.Fatalf("after the steps: %+v, %v; want the marker's creation", ev, err)
	}
}
