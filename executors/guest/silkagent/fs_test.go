package silkagent

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"io"
	"net"
	"slices"
	"strings"
	"testing"

	"github.com/sbxlog/sbxlog/executors/guest/silkd"
)

// The file ops behave the same on the real tree and on MemFS.
func TestFiles(t *testing.T) {
	for _, tc := range []struct {
		name string
		fs   func(t *testing.T) (FS, string)
	}{
		{"os", func(t *testing.T) (FS, string) { return OSFS{}, t.TempDir() }},
		{"mem", func(t *testing.T) (FS, string) { return NewMemFS(nil), "/work" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fsys, base := tc.fs(t)
			fileSuite(t, serve(t, &Server{FS: fsys}), base)
		})
	}
}

func fileSuite(t *testing.T, dial func() net.Conn, base string) {
	ctx := testCtx(t)
	c := client(t, dial)
	if err := c.Mkdir(ctx, base+"/a/b/c", true); err != nil {
		t.Fatal(err)
	}
	if err := c.Mkdir(ctx, base+"/a/b/c", true); err != nil {
		t.Fatalf("mkdir -p of an existing dir: %v", err)
	}
	if err := c.Mkdir(ctx, base+"/x/y", false); !errors.Is(err, silkd.ErrNotFound) {
		t.Fatalf("mkdir without parents under a missing dir = %v", err)
	}

	// A large random file round-trips byte for byte, with its mode.
	data := randomBytes(3*silkd.BulkChunk+123, 5)
	mode := uint32(0o600)
	f := base + "/a/b/data.bin"
	if err := c.WriteFile(ctx, silkd.FsWrite{Path: f, Mode: &mode}, bytes.NewReader(data)); err != nil {
		t.Fatal(err)
	}
	var back bytes.Buffer
	if n, err := c.ReadFile(ctx, f, &back); err != nil || n != int64(len(data)) || sha256.Sum256(back.Bytes()) != sha256.Sum256(data) {
		t.Fatalf("read back %d bytes, %v", n, err)
	}
	st, err := c.Stat(ctx, f)
	if err != nil || st.Kind != silkd.FileRegular || st.Size != uint64(len(data)) || st.Mode != 0o600 || st.MtimeEpochSecs == 0 {
		t.Fatalf("stat %+v, %v", st, err)
	}
	// Overwriting keeps the mode unless one is given.
	if err := c.WriteFile(ctx, silkd.FsWrite{Path: f}, strings.NewReader("short")); err != nil {
		t.Fatal(err)
	}
	if st, err := c.Stat(ctx, f); err != nil || st.Size != 5 || st.Mode != 0o600 {
		t.Fatalf("after overwrite: %+v, %v", st, err)
	}
	if err := c.WriteFile(ctx, silkd.FsWrite{Path: base + "/new"}, strings.NewReader("")); err != nil {
		t.Fatal(err)
	}
	if st, err := c.Stat(ctx, base+"/new"); err != nil || st.Size != 0 || st.Mode != 0o644 {
		t.Fatalf("new empty file: %+v, %v", st, err)
	}

	es, err := c.List(ctx, base+"/a/b")
	if err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(es, func(x, y silkd.Entry) int { return strings.Compare(x.Name, y.Name) })
	want := []silkd.Entry{{Name: "c", Kind: silkd.FileDir}, {Name: "data.bin", Kind: silkd.FileRegular, Size: 5}}
	if len(es) != 2 || es[0].Name != want[0].Name || es[0].Kind != want[0].Kind || es[1] != want[1] {
		t.Fatalf("list %+v, want %+v", es, want)
	}

	if err := c.Rename(ctx, base+"/a/b", base+"/moved"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Stat(ctx, base+"/moved/data.bin"); err != nil {
		t.Fatalf("rename did not move the tree: %v", err)
	}
	if err := c.Remove(ctx, base+"/moved", false); err == nil {
		t.Fatal("non-recursive rm of a non-empty dir succeeded")
	}
	if err := c.Remove(ctx, base+"/moved", true); err != nil {
		t.Fatal(err)
	}
	if err := c.Remove(ctx, base+"/moved", true); !errors.Is(err, silkd.ErrNotFound) {
		t.Fatalf("rm of a missing path = %v", err)
	}

	for _, tc := range []struct {
		name string
		err  error
		kind *silkd.Error
	}{
		{"read missing", func() error { _, err := c.ReadFile(ctx, base+"/nope", io.Discard); return err }(), silkd.ErrNotFound},
		{"read a dir", func() error { _, err := c.ReadFile(ctx, base+"/a", io.Discard); return err }(), silkd.ErrBadRequest},
		{"stat missing", func() error { _, err := c.Stat(ctx, base+"/nope"); return err }(), silkd.ErrNotFound},
		{"list missing", func() error { _, err := c.List(ctx, base+"/nope"); return err }(), silkd.ErrNotFound},
		{"write under a missing dir", c.WriteFile(ctx, silkd.FsWrite{Path: base + "/no/dir/f"}, strings.NewReader("x")), silkd.ErrNotFound},
		{"write over a dir", c.WriteFile(ctx, silkd.FsWrite{Path: base + "/a"}, strings.NewReader("x")), silkd.ErrBadRequest},
		{"empty path", func() error { _, err := c.Stat(ctx, ""); return err }(), silkd.ErrBadRequest},
		{"rename missing", c.Rename(ctx, base+"/nope", base+"/nope2"), silkd.ErrNotFound},
	} {
		if !errors.Is(tc.err, tc.kind) {
			t.Errorf("%s: %v, want %v", tc.name, tc.err, tc.kind)
		}
	}

	// An upload cut short leaves nothing behind, and its refusal ends the
	// RPC: the next request is served.
	r := newRaw(t, dial)
	r.send(silkd.FsWrite{Path: base + "/partial"}, silkd.Data{Data: []byte("half")}, silkd.FsStat{Path: base + "/partial"})
	r.expectError(silkd.KindBadRequest, "stream ended before data_end")
	r.expectError(silkd.KindNotFound, "")
	r.send(silkd.FsWrite{Path: base + "/partial2"}, silkd.Data{Data: []byte("half")})
	r.c.Close()
	waitUntil(t, "the cut uploads to leave nothing", func() bool {
		es, err := c.List(ctx, base)
		return err == nil && !slices.ContainsFunc(es, func(e silkd.Entry) bool { return strings.Contains(e.Name, "partial") })
	})
}

// A MemFS survives Files -> NewMemFS whole (chsim keeps a guest's tree
// across hibernate this way).
func TestMemFSFiles(t *testing.T) {
	m := NewMemFS(nil)
	if err := m.Mkdir("/w/d", true); err != nil {
		t.Fatal(err)
	}
	up, err := m.Create("/w/d/f", nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = up.Write([]byte("content"))
	if err := up.Commit(); err != nil {
		t.Fatal(err)
	}
	files := m.Files()
	if len(files) != 3 || files[2].Path != "/w/d/f" || string(files[2].Data) != "content" || !files[0].Dir {
		t.Fatalf("Files = %+v", files)
	}
	m2 := NewMemFS(files)
	if !slices.EqualFunc(m2.Files(), files, func(a, b MemFile) bool {
		return a.Path == b.Path && a.Dir == b.Dir && a.Mode == b.Mode && a.Mtime == b.Mtime && bytes.Equal(a.Data, b.Data)
	}) {
		t.Fatalf("round trip: %+v", m2.Files())
	}
	// Relative and unclean paths name the same nodes.
	if st, err := m2.Stat("w/./d/../d/f"); err != nil || st.Size != 7 {
		t.Fatalf("stat of an unclean path: %+v, %v", st, err)
	}
}
