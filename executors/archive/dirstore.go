package archive

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/sbxlog/sbxlog/executors/fsx"
	"github.com/sbxlog/sbxlog/fsm"
)

// ManifestFile is the manifest's name inside an archive.
const ManifestFile = "MANIFEST.json"

// Manifest lists an archive's files and their checksums.
type Manifest struct {
	Version int         `json:"version"`
	Files   []FileEntry `json:"files"`
}

// FileEntry is one file of a Manifest: its name, size and fsx.ContentSum.
type FileEntry struct {
	Name   string `json:"name"`
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
}

// Steps of DirStore's Put, in order, as the Hook sees them (the path is
// the file or directory the step acts on).
const (
	StepPutTemp     = "put_temp"     // (re)create the temp dir
	StepPutFile     = "put_file"     // copy one file (holes kept)
	StepFsyncFile   = "fsync_file"   // fsync that file
	StepFsyncDir    = "fsync_dir"    // fsync the temp dir
	StepPutManifest = "put_manifest" // manifest: temp, fsync, rename, fsync dir
	StepVerify      = "verify"       // drop the cache, read back, compare
	StepPutRename   = "put_rename"   // temp dir to the archive's name, fsync parent
)

// DirStore is a Store in a directory, meant to be on another filesystem
// than the snapshot store (a second disk, an NFS mount). An archive is the
// directory <Root>/<name> holding the files and ManifestFile; its temp dir
// is <Root>/<dir of name>/<fsx.TempPrefix><base of name>.
type DirStore struct {
	root string
	// Hook, if set, runs before every step of Put with the step and its
	// path; an error aborts Put there as a crash would (the temp dir is
	// left). Tests use it to record the order and to crash at a step.
	Hook func(step, path string) error
}

var _ Store = (*DirStore)(nil)

// OpenDir returns the DirStore rooted at root, which must be an existing,
// writable directory (checked by creating and removing a file in it).
func OpenDir(root string) (*DirStore, error) {
	if root == "" || !filepath.IsAbs(root) {
		return nil, fmt.Errorf("archive dir %q: not an absolute path", root)
	}
	st, err := os.Stat(root)
	if err != nil {
		return nil, fmt.Errorf("archive dir: %w", err)
	}
	if !st.IsDir() {
		return nil, fmt.Errorf("archive dir %s: not a directory", root)
	}
	probe, err := os.CreateTemp(root, fsx.TempPrefix+"probe-*")
	if err != nil {
		return nil, fmt.Errorf("archive dir %s: not writable: %w", root, err)
	}
	_ = probe.Close()
	if err := os.Remove(probe.Name()); err != nil {
		return nil, fmt.Errorf("archive dir %s: %w", root, err)
	}
	return &DirStore{root: filepath.Clean(root)}, nil
}

// Root is the store's directory.
func (s *DirStore) Root() string { return s.root }

// path resolves name (fsm.ValidRelPath: no "..", no hidden segment, so it
// can never name a temp dir or leave the root).
func (s *DirStore) path(name string) (string, error) {
	if !fsm.ValidRelPath(name) || strings.Contains(name, "\x00") {
		return "", fmt.Errorf("archive name %q: not a clean relative path", name)
	}
	return filepath.Join(s.root, filepath.FromSlash(name)), nil
}

func (s *DirStore) hook(step, path string) error {
	if s.Hook == nil {
		return nil
	}
	if err := s.Hook(step, path); err != nil {
		return fmt.Errorf("archive %s %s: %w", step, path, err)
	}
	return nil
}

// Has implements Store: the archive's directory with its manifest.
func (s *DirStore) Has(_ context.Context, name string) (bool, error) {
	final, err := s.path(name)
	if err != nil {
		return false, err
	}
	_, err = os.Stat(filepath.Join(final, ManifestFile))
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, fs.ErrNotExist):
		return false, nil
	}
	return false, err
}

// Put implements Store.
func (s *DirStore) Put(ctx context.Context, name, dir string) (err error) {
	final, err := s.path(name)
	if err != nil {
		return err
	}
	if ok, err := s.Has(ctx, name); err != nil || ok {
		return err
	}
	files, err := snapshotFiles(dir)
	if err != nil {
		return err
	}
	parent := filepath.Dir(final)
	tmp := filepath.Join(parent, fsx.TempPrefix+filepath.Base(final))
	if err := s.hook(StepPutTemp, tmp); err != nil {
		return err
	}
	if err := os.MkdirAll(parent, 0o750); err != nil {
		return fmt.Errorf("archive put %s: %w", name, err)
	}
	// A temp dir of an earlier, interrupted Put of this name is replaced.
	if err := os.RemoveAll(tmp); err != nil {
		return fmt.Errorf("archive put %s: %w", name, err)
	}
	if err := os.Mkdir(tmp, 0o750); err != nil {
		return fmt.Errorf("archive put %s: %w", name, err)
	}
	defer func() {
		if err != nil && !isHookErr(err) {
			_ = os.RemoveAll(tmp)
		}
	}()
	m := Manifest{Version: 1}
	for _, f := range files {
		if err := ctx.Err(); err != nil {
			return err
		}
		dst := filepath.Join(tmp, f)
		if err := s.hook(StepPutFile, dst); err != nil {
			return hookErr{err}
		}
		size, sum, err := copySparse(dst, filepath.Join(dir, f), func() error {
			if err := s.hook(StepFsyncFile, dst); err != nil {
				return hookErr{err}
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("archive put %s: %w", name, err)
		}
		m.Files = append(m.Files, FileEntry{Name: f, Size: size, SHA256: sum})
	}
	if err := s.hook(StepFsyncDir, tmp); err != nil {
		return hookErr{err}
	}
	if err := fsx.SyncDir(tmp); err != nil {
		return fmt.Errorf("archive put %s: %w", name, err)
	}
	data, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	if err := s.hook(StepPutManifest, filepath.Join(tmp, ManifestFile)); err != nil {
		return hookErr{err}
	}
	if err := fsx.WriteFileAtomic(filepath.Join(tmp, ManifestFile), data, 0o640); err != nil {
		return fmt.Errorf("archive put %s: %w", name, err)
	}
	if err := s.hook(StepVerify, tmp); err != nil {
		return hookErr{err}
	}
	if err := verify(tmp, m, true); err != nil {
		return fmt.Errorf("archive put %s: %w", name, err)
	}
	if err := s.hook(StepPutRename, final); err != nil {
		return hookErr{err}
	}
	if err := fsx.RenameDir(tmp, final); err != nil {
		return fmt.Errorf("archive put %s: %w", name, err)
	}
	return nil
}

// hookErr marks an error a Hook returned: a simulated crash, after which
// nothing is cleaned up (a real crash cleans nothing either).
type hookErr struct{ error }

func (h hookErr) Unwrap() error { return h.error }

func isHookErr(err error) bool { var h hookErr; return errors.As(err, &h) }

// Get implements Store.
func (s *DirStore) Get(ctx context.Context, name, dir string) error {
	final, err := s.path(name)
	if err != nil {
		return err
	}
	m, err := readManifest(final)
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%w: %s", ErrNotFound, name)
	}
	if err != nil {
		return err
	}
	for _, f := range m.Files {
		if err := ctx.Err(); err != nil {
			return err
		}
		if !validFileName(f.Name) {
			return fmt.Errorf("%w: %s: manifest names %q", ErrCorrupt, name, f.Name)
		}
		size, sum, err := copySparse(filepath.Join(dir, f.Name), filepath.Join(final, f.Name), nil)
		if errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("%w: %s: %s is missing", ErrCorrupt, name, f.Name)
		}
		if err != nil {
			return fmt.Errorf("archive get %s: %w", name, err)
		}
		if size != f.Size || sum != f.SHA256 {
			return fmt.Errorf("%w: %s: %s has %d bytes sha256 %s, manifest says %d bytes %s", ErrCorrupt, name, f.Name, size, sum, f.Size, f.SHA256)
		}
	}
	return nil
}

// Delete implements Store: the manifest goes first, so a crash mid-way
// leaves no archive that Has or Get would take.
func (s *DirStore) Delete(_ context.Context, name string) error {
	final, err := s.path(name)
	if err != nil {
		return err
	}
	if err := os.Remove(filepath.Join(final, ManifestFile)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("archive delete %s: %w", name, err)
	}
	if err := os.RemoveAll(final); err != nil {
		return fmt.Errorf("archive delete %s: %w", name, err)
	}
	return fsx.SyncDir(filepath.Dir(final))
}

// SweepTemp removes the temp dirs of interrupted Puts under <Root>/<prefix>
// (an instance's own names: another instance's are never touched), and
// returns what it removed. It is for start-up, before any Put runs.
func (s *DirStore) SweepTemp(prefix string) ([]string, error) {
	dir, err := s.path(prefix)
	if err != nil {
		return nil, err
	}
	if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	return fsx.SweepTemp(dir)
}

// snapshotFiles lists dir's regular files, sorted; a snapshot dir is flat,
// so anything else in it is refused rather than silently left behind.
func snapshotFiles(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("archive: %w", err)
	}
	var out []string
	for _, e := range ents {
		if !e.Type().IsRegular() || !validFileName(e.Name()) {
			return nil, fmt.Errorf("archive: %s: %s is not a regular file of a snapshot", dir, e.Name())
		}
		out = append(out, e.Name())
	}
	slices.Sort(out)
	return out, nil
}

func validFileName(n string) bool {
	return n != "" && n != ManifestFile && !strings.ContainsAny(n, "/\x00") && n[0] != '.'
}

func readManifest(dir string) (Manifest, error) {
	var m Manifest
	b, err := os.ReadFile(filepath.Join(dir, ManifestFile))
	if err != nil {
		return m, err
	}
	if err := json.Unmarshal(b, &m); err != nil || m.Version != 1 {
		return m, fmt.Errorf("%w: %s: unreadable manifest (%v)", ErrCorrupt, dir, err)
	}
	return m, nil
}

// verify checks every file of m in dir; dropCache first evicts each file's
// pages, so a file just written is read back from the disk, not from the
// page cache that wrote it. Files are checked concurrently (up to
// GOMAXPROCS at once): each check is a read and a hash, and with several at
// once the disk and the CPUs both stay busy.
func verify(dir string, m Manifest, dropCache bool) error {
	sem := make(chan struct{}, runtime.GOMAXPROCS(0))
	errs := make([]error, len(m.Files))
	var wg sync.WaitGroup
	for i, f := range m.Files {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			errs[i] = verifyFile(filepath.Join(dir, f.Name), f, dropCache)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// verifyFile checks one file of a manifest.
func verifyFile(p string, f FileEntry, dropCache bool) error {
	if dropCache {
		if err := fadviseDontNeed(p); err != nil {
			return err
		}
	}
	sum, err := fsx.ContentSum(p)
	if err != nil {
		return err
	}
	st, err := os.Stat(p)
	if err != nil {
		return err
	}
	if sum != f.SHA256 || st.Size() != f.Size {
		return fmt.Errorf("%w: %s: read back sha256 %s size %d, wrote %s size %d", ErrCorrupt, p, sum, st.Size(), f.SHA256, f.Size)
	}
	return nil
}

func fadviseDontNeed(p string) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	return unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED)
}

// copySparse copies src to dst (created, O_EXCL), writing only src's
// non-zero 4 KiB pages, so holes (and zero pages) stay holes, and returns
// the size and the fsx.ContentSum of what it copied, computed on the way.
// dst is fsynced (after beforeSync, when set) and closed.
func copySparse(dst, src string, beforeSync func() error) (size int64, sum string, err error) {
	in, err := os.Open(src)
	if err != nil {
		return 0, "", err
	}
	defer in.Close()
	st, err := in.Stat()
	if err != nil {
		return 0, "", err
	}
	size = st.Size()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, st.Mode().Perm())
	if err != nil {
		return 0, "", err
	}
	defer func() {
		if cerr := out.Close(); err == nil && cerr != nil {
			err = cerr
		}
	}()
	h := fsx.NewContentHash(size)
	// Runs of non-zero pages are written with one call each, and their
	// writeback is started at once (SYNC_FILE_RANGE_WRITE, which waits for
	// nothing), so the disk writes while the next runs are read and hashed
	// and the fsync below has little left to wait for. The fsync is still
	// what makes the file durable.
	outFd := int(out.Fd())
	if err := fsx.DataRuns(in, size, func(off int64, run []byte) error {
		h.Add(off, run)
		if _, err := out.WriteAt(run, off); err != nil {
			return err
		}
		_ = unix.SyncFileRange(outFd, off, int64(len(run)), unix.SYNC_FILE_RANGE_WRITE)
		return nil
	}); err != nil {
		return 0, "", err
	}
	if err := out.Truncate(size); err != nil {
		return 0, "", err
	}
	if beforeSync != nil {
		if err := beforeSync(); err != nil {
			return 0, "", err
		}
	}
	if err := out.Sync(); err != nil {
		return 0, "", err
	}
	return size, h.Sum(), nil
}
