// Package eventlogtest holds test support for code that runs on the op
// log: SyncGateFS, a filesystem whose WAL syncs can be held, to look at a
// node while its appends are applied but not yet durable, and to take crash
// images of that moment (with pebble's crashable MemFS underneath).
package eventlogtest

import (
	"strings"
	"sync"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// SyncGateFS wraps a filesystem so that, while armed, syncs of WAL files
// block until released. Data written before the sync stays unsynced, which
// is exactly the window a power cut or a SIGKILL can take back.
type SyncGateFS struct {
	vfs.FS
	mu      sync.Mutex
	armed   bool
	release chan struct{}
	// Blocked receives once per sync that blocks on the gate.
	Blocked chan struct{}
}

// NewSyncGateFS wraps fs; the gate starts open.
func NewSyncGateFS(fs vfs.FS) *SyncGateFS {
	return &SyncGateFS{FS: fs, Blocked: make(chan struct{}, 1024)}
}

// Arm makes WAL syncs block until the returned release func is called
// (idempotent).
func (g *SyncGateFS) Arm() (release func()) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.armed, g.release = true, make(chan struct{})
	ch := g.release
	var once sync.Once
	return func() {
		once.Do(func() {
			g.mu.Lock()
			g.armed = false
			g.mu.Unlock()
			close(ch)
		})
	}
}

func (g *SyncGateFS) wait() {
	g.mu.Lock()
	armed, ch := g.armed, g.release
	g.mu.Unlock()
	if armed {
		select {
		case g.Blocked <- struct{}{}:
		default:
		}
		<-ch
	}
}

func (g *SyncGateFS) wrap(name string, f vfs.File, err error) (vfs.File, error) {
	if err != nil || !strings.HasSuffix(name, ".log") {
		return f, err
	}
	return &gatedFile{File: f, g: g}, nil
}

// Create implements vfs.FS.
func (g *SyncGateFS) Create(name string, c vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := g.FS.Create(name, c)
	return g.wrap(name, f, err)
}

// ReuseForWrite implements vfs.FS.
func (g *SyncGateFS) ReuseForWrite(oldname, newname string, c vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := g.FS.ReuseForWrite(oldname, newname, c)
	return g.wrap(newname, f, err)
}

// OpenReadWrite implements vfs.FS.
func (g *SyncGateFS) OpenReadWrite(name string, c vfs.DiskWriteCategory, opts ...vfs.OpenOption) (vfs.File, error) {
	f, err := g.FS.OpenReadWrite(name, c, opts...)
	return g.wrap(name, f, err)
}

type gatedFile struct {
	vfs.File
	g *SyncGateFS
}

func (f *gatedFile) Sync() error     { f.g.wait(); return f.File.Sync() }
func (f *gatedFile) SyncData() error { f.g.wait(); return f.File.SyncData() }
func (f *gatedFile) SyncTo(n int64) (bool, error) {
	f.g.wait()
	return f.File.SyncTo(n)
}
