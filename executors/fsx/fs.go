package fsx

import (
	"io/fs"
	"os"
	"strings"
	"sync"

	"github.com/rs/zerolog"
)

// FS is every side-effecting filesystem step a recipe takes. Recipes take an FS
// rather than calling the package functions, so tests can wrap OS in a Recorder.
type FS interface {
	Clone(dst, src string, opts ...CloneOption) (CloneResult, error)
	Link(dst, src string) error
	WriteFileAtomic(path string, data []byte, perm fs.FileMode) error
	SyncTree(dir string) error
	MkdirAll(path string, perm fs.FileMode) error
	MkTempDir(storeDir, prefix string) (string, error)
	RenameDir(oldpath, newpath string) error
	RemoveAll(path string) error
}

// OS is the real FS. Its Cloner (and so the per-filesystem reflink cache) is shared
// by every recipe that uses the same OS value.
type OS struct {
	*Cloner
}

var (
	_ FS = (*OS)(nil)
	_ FS = (*Recorder)(nil)
)

// NewOS returns the real FS, logging the copy fallback on log.
func NewOS(log zerolog.Logger) *OS { return &OS{Cloner: NewCloner(log)} }

func (*OS) Link(dst, src string) error { return Link(dst, src) }
func (*OS) WriteFileAtomic(path string, data []byte, perm fs.FileMode) error {
	return WriteFileAtomic(path, data, perm)
}
func (*OS) SyncTree(dir string) error                         { return SyncTree(dir) }
func (*OS) MkdirAll(path string, perm fs.FileMode) error      { return os.MkdirAll(path, perm) }
func (*OS) MkTempDir(storeDir, prefix string) (string, error) { return MkTempDir(storeDir, prefix) }
func (*OS) RenameDir(oldpath, newpath string) error           { return RenameDir(oldpath, newpath) }
func (*OS) RemoveAll(path string) error                       { return os.RemoveAll(path) }

// Step operation names, as recorded by Recorder.
const (
	OpClone     = "clone"     // Paths: dst, src
	OpLink      = "link"      // Paths: dst, src
	OpWrite     = "write"     // Paths: path
	OpSyncTree  = "synctree"  // Paths: dir
	OpMkdirAll  = "mkdirall"  // Paths: path
	OpMkTempDir = "mktempdir" // Paths: storeDir, prefix, and the created dir once done
	OpRename    = "rename"    // Paths: oldpath, newpath
	OpRemoveAll = "removeall" // Paths: path
)

// Step is one FS call seen by a Recorder.
type Step struct {
	Op    string
	Paths []string
	// Err is what the call returned (or what Before returned to abort it).
	Err error
}

// String renders the step as "op path...", the form order tests compare.
func (s Step) String() string {
	return strings.TrimSpace(s.Op + " " + strings.Join(s.Paths, " "))
}

// Recorder wraps an FS and records every call in order. It is safe for concurrent
// use.
type Recorder struct {
	FS FS
	// Before, if set, runs before each call with the step about to happen. A non-nil
	// error aborts the call: the inner FS is not touched and the error is returned
	// (and recorded). Crash tests use it to stop a recipe at a chosen step.
	Before func(Step) error
	// Sink, if set, also receives every recorded step, e.g. to merge this log with
	// a recording CH client's into one ordered list.
	Sink func(Step)

	mu    sync.Mutex
	steps []Step
}

// NewRecorder wraps inner.
func NewRecorder(inner FS) *Recorder { return &Recorder{FS: inner} }

// Steps returns a copy of the steps recorded so far.
func (r *Recorder) Steps() []Step {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Step(nil), r.steps...)
}

// do runs call unless Before aborts it, and records the step with its outcome.
// call may add to the step (MkTempDir records the dir it made).
func (r *Recorder) do(st Step, call func(*Step) error) error {
	if r.Before != nil {
		if err := r.Before(st); err != nil {
			st.Err = err
			r.record(st)
			return err
		}
	}
	st.Err = call(&st)
	r.record(st)
	return st.Err
}

func (r *Recorder) record(st Step) {
	r.mu.Lock()
	r.steps = append(r.steps, st)
	r.mu.Unlock()
	if r.Sink != nil {
		r.Sink(st)
	}
}

func (r *Recorder) Clone(dst, src string, opts ...CloneOption) (res CloneResult, err error) {
	err = r.do(Step{Op: OpClone, Paths: []string{dst, src}}, func(*Step) error {
		res, err = r.FS.Clone(dst, src, opts...)
		return err
	})
	return res, err
}

func (r *Recorder) Link(dst, src string) error {
	return r.do(Step{Op: OpLink, Paths: []string{dst, src}}, func(*Step) error { return r.FS.Link(dst, src) })
}

func (r *Recorder) WriteFileAtomic(path string, data []byte, perm fs.FileMode) error {
	return r.do(Step{Op: OpWrite, Paths: []string{path}}, func(*Step) error {
		return r.FS.WriteFileAtomic(path, data, perm)
	})
}

func (r *Recorder) SyncTree(dir string) error {
	return r.do(Step{Op: OpSyncTree, Paths: []string{dir}}, func(*Step) error { return r.FS.SyncTree(dir) })
}

func (r *Recorder) MkdirAll(path string, perm fs.FileMode) error {
	return r.do(Step{Op: OpMkdirAll, Paths: []string{path}}, func(*Step) error { return r.FS.MkdirAll(path, perm) })
}

func (r *Recorder) MkTempDir(storeDir, prefix string) (dir string, err error) {
	err = r.do(Step{Op: OpMkTempDir, Paths: []string{storeDir, prefix}}, func(st *Step) error {
		if dir, err = r.FS.MkTempDir(storeDir, prefix); err == nil {
			st.Paths = append(st.Paths, dir)
		}
		return err
	})
	return dir, err
}

func (r *Recorder) RenameDir(oldpath, newpath string) error {
	return r.do(Step{Op: OpRename, Paths: []string{oldpath, newpath}}, func(*Step) error {
		return r.FS.RenameDir(oldpath, newpath)
	})
}

func (r *Recorder) RemoveAll(path string) error {
	return r.do(Step{Op: OpRemoveAll, Paths: []string{path}}, func(*Step) error { return r.FS.RemoveAll(path) })
}

// ClonerOf returns the Cloner behind fs (through any Recorders), so a
// driver's start-up detection primes the same per-filesystem cache its
// recipes use and the copy fallback is logged once, not twice; an FS with
// no Cloner behind it gets a new one.
func ClonerOf(fs FS, log zerolog.Logger) *Cloner {
	for {
		switch f := fs.(type) {
		case *OS:
			return f.Cloner
		case *Recorder:
			fs = f.FS
			continue
		}
		return NewCloner(log)
	}
}
