package transport

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/rs/zerolog"

	"github.com/sbxlog/sbxlog/eventlog/event"
	"github.com/sbxlog/sbxlog/executors"
	"github.com/sbxlog/sbxlog/executors/fsx"
	"github.com/sbxlog/sbxlog/executors/layout"
	"github.com/sbxlog/sbxlog/fsm"
)

const (
	testID     = "ck_00aa112233445566"
	testFormat = "cloud-hypervisor"
	testToken  = "fleet-root"
)

var testHead = Head{ID: testID, Format: testFormat, Key: event.PoolKey{Template: "default", Net: "none", Size: "small"},
	Name: "before", Tenant: "acme", SandboxID: "sb_00aa112233445566", CreatedNS: 1_790_000_000_000_000_000, ExpiresNS: 1_790_086_400_000_000_000}

// checkpointDir makes a checkpoint-like dir: a sparse "memory" file (a
// few data blocks in 4 MiB of holes), a small config and meta.
func checkpointDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	f, err := os.Create(filepath.Join(dir, "memory-ranges"))
	if err != nil {
		t.Fatal(err)
	}
	for _, off := range []int64{0, 1 << 20, 3<<20 + 17} {
		if _, err := f.WriteAt(bytes.Repeat([]byte{byte(off>>20) + 1}, 5000), off); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Truncate(4 << 20); err != nil {
		t.Fatal(err)
	}
	f.Close()
	for name, data := range map[string]string{"config.json": `{"cpus":1}`, "meta.json": `{"version":1}`, ".sbx-tmp-x": "not part of it"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func blobOf(t *testing.T, dir string) []byte {
	t.Helper()
	b, err := Open(dir, testHead)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	var buf bytes.Buffer
	if _, err := b.WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func fileSum(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// A blob carries the dir's files (not its hidden entries) byte for byte;
// holes stay holes.
func TestBlobRoundTrip(t *testing.T) {
	src := checkpointDir(t)
	blob := blobOf(t, src)
	dst := t.TempDir()
	head, err := Receive(bytes.NewReader(blob), dst, testID, testFormat, 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	if head.Tenant != "acme" || head.SandboxID != testHead.SandboxID || len(head.Files) != 3 {
		t.Fatalf("head %+v", head)
	}
	for _, f := range head.Files {
		if fileSum(t, filepath.Join(src, f.Name)) != fileSum(t, filepath.Join(dst, f.Name)) {
			t.Errorf("%s differs", f.Name)
		}
	}
	if _, err := os.Stat(filepath.Join(dst, ".sbx-tmp-x")); err == nil {
		t.Error("a hidden entry was sent")
	}
	var st syscall.Stat_t
	if err := syscall.Stat(filepath.Join(dst, "memory-ranges"), &st); err != nil {
		t.Fatal(err)
	}
	if st.Blocks*512 >= 1<<20 {
		t.Errorf("memory-ranges: %d bytes allocated of 4 MiB with 15 KB of data: holes were written", st.Blocks*512)
	}
}

type entry struct {
	name string
	typ  byte
	data []byte
	size int64 // -1: len(data)
}

func rawTar(t *testing.T, entries ...entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		size := int64(len(e.data))
		if e.size >= 0 && e.size != 0 {
			size = e.size
		}
		typ := e.typ
		if typ == 0 {
			typ = tar.TypeReg
		}
		h := &tar.Header{Name: e.name, Typeflag: typ, Size: size, Mode: 0o644}
		if typ == tar.TypeSymlink {
			h.Linkname, h.Size = "/etc/passwd", 0
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if typ == tar.TypeReg {
			if _, err := tw.Write(e.data); err != nil {
				t.Fatal(err)
			}
		}
	}
	tw.Close()
	return buf.Bytes()
}

func headJSON(t *testing.T, mod func(*Head)) []byte {
	h := testHead
	h.Version = Version
	h.Files = []File{{Name: "a", Size: 3}}
	if mod != nil {
		mod(&h)
	}
	b, err := json.Marshal(h)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func sumsJSON(files map[string]string) []byte {
	out := map[string]string{}
	for n, d := range files {
		s := sha256.Sum256([]byte(d))
		out[n] = hex.EncodeToString(s[:])
	}
	b, _ := json.Marshal(Sums{SHA256: out})
	return b
}

// A blob that is not exactly what it announced is refused: unsafe names,
// links, sizes, digests, formats, caps, trailing entries.
func TestReceiveRefuses(t *testing.T) {
	good := sumsJSON(map[string]string{"a": "abc"})
	cases := []struct {
		name string
		blob func(t *testing.T) []byte
		max  int64
	}{
		{"traversal name", func(t *testing.T) []byte {
			return rawTar(t, entry{name: HeadName, data: headJSON(t, func(h *Head) { h.Files[0].Name = "../../etc/cron.d/x" })},
				entry{name: "../../etc/cron.d/x", data: []byte("abc")}, entry{name: SumsName, data: sumsJSON(map[string]string{"../../etc/cron.d/x": "abc"})})
		}, 0},
		{"absolute name", func(t *testing.T) []byte {
			return rawTar(t, entry{name: HeadName, data: headJSON(t, func(h *Head) { h.Files[0].Name = "/etc/passwd" })})
		}, 0},
		{"hidden name", func(t *testing.T) []byte {
			return rawTar(t, entry{name: HeadName, data: headJSON(t, func(h *Head) { h.Files[0].Name = MarkerName })})
		}, 0},
		{"entry other than announced", func(t *testing.T) []byte {
			return rawTar(t, entry{name: HeadName, data: headJSON(t, nil)}, entry{name: "../a", data: []byte("abc")})
		}, 0},
		{"symlink", func(t *testing.T) []byte {
			return rawTar(t, entry{name: HeadName, data: headJSON(t, nil)}, entry{name: "a", typ: tar.TypeSymlink})
		}, 0},
		{"device", func(t *testing.T) []byte {
			return rawTar(t, entry{name: HeadName, data: headJSON(t, nil)}, entry{name: "a", typ: tar.TypeChar})
		}, 0},
		{"size other than announced", func(t *testing.T) []byte {
			return rawTar(t, entry{name: HeadName, data: headJSON(t, nil)}, entry{name: "a", data: []byte("abcd")})
		}, 0},
		{"digest mismatch", func(t *testing.T) []byte {
			return rawTar(t, entry{name: HeadName, data: headJSON(t, nil)}, entry{name: "a", data: []byte("abd")}, entry{name: SumsName, data: good})
		}, 0},
		{"digest missing", func(t *testing.T) []byte {
			return rawTar(t, entry{name: HeadName, data: headJSON(t, nil)}, entry{name: "a", data: []byte("abc")}, entry{name: SumsName, data: []byte(`{"sha256":{}}`)})
		}, 0},
		{"oversize", func(t *testing.T) []byte {
			return rawTar(t, entry{name: HeadName, data: headJSON(t, func(h *Head) { h.Files[0].Size = 1 << 40 })})
		}, 1 << 30},
		{"another hypervisor's format", func(t *testing.T) []byte {
			return rawTar(t, entry{name: HeadName, data: headJSON(t, func(h *Head) { h.Format = "qemu" })})
		}, 0},
		{"another checkpoint", func(t *testing.T) []byte {
			return rawTar(t, entry{name: HeadName, data: headJSON(t, func(h *Head) { h.ID = "ck_ffffffffffffffff" })})
		}, 0},
		{"unknown head field", func(t *testing.T) []byte {
			return rawTar(t, entry{name: HeadName, data: []byte(`{"version":1,"id":"` + testID + `","format":"cloud-hypervisor","files":[{"name":"a","size":3}],"exec":"x"}`)})
		}, 0},
		{"no head", func(t *testing.T) []byte { return rawTar(t, entry{name: "a", data: []byte("abc")}) }, 0},
		{"entry after the digests", func(t *testing.T) []byte {
			return rawTar(t, entry{name: HeadName, data: headJSON(t, nil)}, entry{name: "a", data: []byte("abc")}, entry{name: SumsName, data: good},
				entry{name: "b", data: []byte("x")})
		}, 0},
		{"not a tar", func(t *testing.T) []byte { return []byte(strings.Repeat("x", 2000)) }, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			max := c.max
			if max == 0 {
				max = 1 << 30
			}
			dir := t.TempDir()
			_, err := Receive(bytes.NewReader(c.blob(t)), dir, testID, testFormat, max)
			if !errors.Is(err, ErrRefused) {
				t.Fatalf("err %v, want ErrRefused", err)
			}
			// Nothing was written outside dir.
			if _, err := os.Stat(filepath.Join(filepath.Dir(dir), "etc")); err == nil {
				t.Fatal("a file escaped the dir")
			}
		})
	}
	// The well-formed one is taken.
	blob := rawTar(t, entry{name: HeadName, data: headJSON(t, nil)}, entry{name: "a", data: []byte("abc")}, entry{name: SumsName, data: good})
	if _, err := Receive(bytes.NewReader(blob), t.TempDir(), testID, testFormat, 1<<30); err != nil {
		t.Fatal(err)
	}
	// A stream cut mid-file broke off: not the origin's refusal.
	if _, err := Receive(bytes.NewReader(blob[:1024+100]), t.TempDir(), testID, testFormat, 1<<30); !errors.Is(err, ErrStream) {
		t.Fatalf("cut stream: %v", err)
	}
}

// origin serves blobs of dir as a node's blob route does (root token only).
type origin struct {
	srv   *httptest.Server
	gets  atomic.Int64
	blob  atomic.Pointer[[]byte]
	state atomic.Int32 // http status to answer
}

func newOrigin(t *testing.T, blob []byte) *origin {
	o := &origin{}
	o.blob.Store(&blob)
	o.state.Store(http.StatusOK)
	o.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		o.gets.Add(1)
		if r.Header.Get("Authorization") != "Bearer "+testToken || r.URL.Path != "/v1/checkpoints/"+testID+"/blob" {
			w.WriteHeader(http.StatusForbidden)
			return
		}
		if s := int(o.state.Load()); s != http.StatusOK {
			w.WriteHeader(s)
			w.Write([]byte(`{"error":"unknown checkpoint"}`))
			return
		}
		w.Write(*o.blob.Load())
	}))
	t.Cleanup(o.srv.Close)
	return o
}

func (o *origin) addr() string { return strings.TrimPrefix(o.srv.URL, "http://") }

func newReceiver(t *testing.T, hook func(string) error) (*Receiver, layout.Roots) {
	roots := layout.RootsIn(t.TempDir())
	if err := os.MkdirAll(filepath.Join(roots.Store, layout.CheckpointStore), 0o755); err != nil {
		t.Fatal(err)
	}
	r := &Receiver{}
	c := Config{Roots: roots, Format: testFormat, Token: testToken, Log: zerolog.Nop()}
	if hook != nil {
		c.Hook = func(_ context.Context, step string, _ event.OpID) error { return hook(step) }
	}
	r.UseTransport(c)
	return r, roots
}

// storeEntries lists the store's top level and checkpoint dir.
func storeEntries(t *testing.T, roots layout.Roots) []string {
	var out []string
	for _, d := range []string{roots.Store, filepath.Join(roots.Store, layout.CheckpointStore)} {
		ents, err := os.ReadDir(d)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range ents {
			if e.Name() != layout.CheckpointStore {
				out = append(out, e.Name())
			}
		}
	}
	return out
}

var opN atomic.Uint64

func fetchIntent(o *origin) fsm.FetchCheckpoint {
	return fsm.FetchCheckpoint{OpID: event.OpIDFromUint(7, opN.Add(1)), Checkpoint: testID, Origin: o.addr()}
}

// An import lands the checkpoint under its id with its origin's record; a
// re-run of the op fetches nothing again.
func TestImport(t *testing.T) {
	src := checkpointDir(t)
	o := newOrigin(t, blobOf(t, src))
	r, roots := newReceiver(t, nil)
	in := fetchIntent(o)
	res, err := r.ImportCheckpoint(context.Background(), in)
	if err != nil {
		t.Fatal(err)
	}
	if res.SnapshotDir != layout.CheckpointRel(testID) || res.Checkpoint == nil || res.Checkpoint.Tenant != "acme" ||
		res.Checkpoint.Claim != testHead.SandboxID || res.Checkpoint.Expires != testHead.ExpiresNS || res.Checkpoint.Key.Template != "default" {
		t.Fatalf("result %+v %+v", res, res.Checkpoint)
	}
	final := filepath.Join(roots.Store, res.SnapshotDir)
	for _, f := range []string{"memory-ranges", "config.json", "meta.json"} {
		if fileSum(t, filepath.Join(src, f)) != fileSum(t, filepath.Join(final, f)) {
			t.Errorf("%s differs", f)
		}
	}
	var steps []string
	for _, s := range res.Report.Steps {
		steps = append(steps, s.Name)
	}
	if got := strings.Join(steps, ","); got != "check,mktemp,fetch,marker,sync_files,rename,sync_tree" {
		t.Errorf("steps %s", got)
	}
	res2, err := r.ImportCheckpoint(context.Background(), in)
	if err != nil || o.gets.Load() != 1 || res2.Checkpoint.Tenant != "acme" {
		t.Fatalf("re-run: %v, %d GETs, %+v", err, o.gets.Load(), res2)
	}
	// Its marker is not part of what this node would send on.
	again := blobOf(t, final)
	head, err := Receive(bytes.NewReader(again), t.TempDir(), testID, testFormat, 1<<30)
	if err != nil || len(head.Files) != 3 {
		t.Fatalf("blob of the import: %v %+v", err, head.Files)
	}
	if got := storeEntries(t, roots); len(got) != 1 {
		t.Fatalf("store holds %v", got)
	}
}

// Each failure is classed for the waiting claim and leaves nothing in the
// store.
func TestImportFailures(t *testing.T) {
	src := checkpointDir(t)
	blob := blobOf(t, src)
	corrupt := bytes.Clone(blob)
	// Flip a byte of the first file's data (after the head's entry).
	i := bytes.Index(corrupt, []byte(`{"cpus":1}`))
	corrupt[i+2] ^= 1
	down, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	downAddr := down.Addr().String()
	down.Close()
	cases := []struct {
		name   string
		setup  func(o *origin, in *fsm.FetchCheckpoint)
		reason string
	}{
		{"origin says 404", func(o *origin, _ *fsm.FetchCheckpoint) { o.state.Store(http.StatusNotFound) }, fsm.ImportNotFound},
		{"origin down", func(_ *origin, in *fsm.FetchCheckpoint) { in.Origin = downAddr }, fsm.ImportUnreachable},
		{"origin refuses the token", func(o *origin, _ *fsm.FetchCheckpoint) { o.state.Store(http.StatusForbidden) }, fsm.ImportUnreachable},
		{"digest mismatch", func(o *origin, _ *fsm.FetchCheckpoint) { o.blob.Store(&corrupt) }, fsm.ImportRefused},
		{"cut stream", func(o *origin, _ *fsm.FetchCheckpoint) { b := blob[:len(blob)/2]; o.blob.Store(&b) }, fsm.ImportUnreachable},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			o := newOrigin(t, blob)
			r, roots := newReceiver(t, nil)
			in := fetchIntent(o)
			c.setup(o, &in)
			_, err := r.ImportCheckpoint(context.Background(), in)
			if !executors.IsUnrecoverable(err) || fsm.ImportFailureReason(err.Error()) != c.reason {
				t.Fatalf("err %v, want an unrecoverable %s", err, c.reason)
			}
			if got := storeEntries(t, roots); len(got) != 0 {
				t.Fatalf("store holds %v after a failed import", got)
			}
		})
	}
	var unconfigured Receiver
	if _, err := unconfigured.ImportCheckpoint(context.Background(), fsm.FetchCheckpoint{Checkpoint: testID}); !executors.IsUnrecoverable(err) {
		t.Fatalf("unconfigured: %v", err)
	}
}

// A crash before any step leaves the import done or absent, and the re-run
// of the op completes it; a temp dir a crash left is the start-up sweep's.
func TestImportCrashAtEachStep(t *testing.T) {
	blob := blobOf(t, checkpointDir(t))
	for _, step := range []string{StepCheck, StepMkTemp, StepFetch, StepMarker, StepSyncFiles, StepRename, StepSyncTree} {
		t.Run(step, func(t *testing.T) {
			o := newOrigin(t, blob)
			var crash atomic.Bool
			crash.Store(true)
			r, roots := newReceiver(t, func(s string) error {
				if s == step && crash.Load() {
					return errors.New("crash")
				}
				return nil
			})
			in := fetchIntent(o)
			if _, err := r.ImportCheckpoint(context.Background(), in); err == nil {
				t.Fatal("no failure at the step")
			}
			// Done (renamed, its marker in) or absent; never half there.
			final := filepath.Join(roots.Store, layout.CheckpointRel(testID))
			if _, err := os.Stat(final); err == nil {
				if _, err := os.Stat(filepath.Join(final, MarkerName)); err != nil {
					t.Fatal("a checkpoint without its marker under its name")
				}
			}
			if _, err := fsx.SweepTemp(roots.Store); err != nil {
				t.Fatal(err)
			}
			crash.Store(false)
			res, err := r.ImportCheckpoint(context.Background(), in)
			if err != nil || res.Checkpoint == nil {
				t.Fatalf("re-run: %v", err)
			}
			if got := storeEntries(t, roots); len(got) != 1 {
				t.Fatalf("store holds %v", got)
			}
		})
	}
	// A leftover of an earlier failed import of the id (another op) is
	// replaced; a dir this node did not import is never touched.
	o := newOrigin(t, blob)
	r, roots := newReceiver(t, nil)
	if _, err := r.ImportCheckpoint(context.Background(), fetchIntent(o)); err != nil {
		t.Fatal(err)
	}
	if _, err := r.ImportCheckpoint(context.Background(), fetchIntent(o)); err != nil || o.gets.Load() != 2 {
		t.Fatalf("import over an older op's: %v (%d GETs)", err, o.gets.Load())
	}
	final := filepath.Join(roots.Store, layout.CheckpointRel(testID))
	if err := os.Remove(filepath.Join(final, MarkerName)); err != nil {
		t.Fatal(err)
	}
	if _, err := r.ImportCheckpoint(context.Background(), fetchIntent(o)); !executors.IsUnrecoverable(err) {
		t.Fatalf("import over a foreign dir: %v", err)
	}
	if _, err := os.Stat(filepath.Join(final, "meta.json")); err != nil {
		t.Fatal("the foreign dir was touched")
	}
}
