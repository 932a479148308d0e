package silkagent

import (
	"bytes"
	"fmt"
	"io"
	"io/fs"
	"path"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/sbxlog/sbxlog/executors/guest/silkd"
)

// MemFS is a file tree in memory (directories and regular files), for
// simulated guests and tests. Paths are cleaned and taken from the root.
// It is safe for concurrent use.
//
// Space: the tree holds at most Limit bytes (when set), counting every
// node's data, its path and NodeOverhead, plus the bytes of uploads not yet
// committed (an upload that replaces a file needs room for both until its
// commit, as a write through a temp file and a rename does). What would
// pass the limit fails with syscall.ENOSPC in an *fs.PathError, as a full
// tmpfs does, so the agent reports it like the real guest's ("no space
// left on device").
type MemFS struct {
	// Now stamps modification times (default time.Now).
	Now func() time.Time
	// Limit bounds the tree's bytes (see above); 0 is no bound.
	Limit int64

	mu      sync.Mutex
	nodes   map[string]*memNode
	used    int64 // the nodes' cost
	pending int64 // bytes of uploads not yet committed or aborted
	watches map[*memWatch]struct{}
}

// NodeOverhead is what a MemFS counts for each node besides its path and
// data, so that empty files and directories use space too.
const NodeOverhead = 256

type memNode struct {
	dir   bool
	mode  uint32
	mtime time.Time
	data  []byte
}

// MemFile is one node of a MemFS, as Files returns it and NewMemFS takes it.
type MemFile struct {
	Path  string `json:"path"`
	Dir   bool   `json:"dir,omitempty"`
	Mode  uint32 `json:"mode"`
	Mtime int64  `json:"mtime_unix_nano"`
	Data  []byte `json:"data,omitempty"`
}

// NewMemFS returns a tree holding files (and the root, always).
func NewMemFS(files []MemFile) *MemFS {
	m := &MemFS{nodes: map[string]*memNode{"/": {dir: true, mode: 0o755}}}
	for _, f := range files {
		p := clean(f.Path)
		if old, ok := m.nodes[p]; ok {
			m.used -= cost(p, old)
		}
		m.nodes[p] = &memNode{dir: f.Dir, mode: f.Mode, mtime: time.Unix(0, f.Mtime), data: bytes.Clone(f.Data)}
		m.used += cost(p, m.nodes[p])
	}
	return m
}

// Used returns the bytes the tree counts against Limit (uploads in flight
// included).
func (m *MemFS) Used() int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.used + m.pending
}

// cost is what node n at p counts against Limit.
func cost(p string, n *memNode) int64 {
	return int64(NodeOverhead + len(p) + len(n.data))
}

// room fails with ENOSPC unless n more bytes fit (under m.mu).
func (m *MemFS) room(op, p string, n int64) error {
	if m.Limit > 0 && n > 0 && m.used+m.pending+n > m.Limit {
		return &fs.PathError{Op: op, Path: p, Err: syscall.ENOSPC}
	}
	return nil
}

// Files returns every node but the root, sorted by path.
func (m *MemFS) Files() []MemFile {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]MemFile, 0, len(m.nodes))
	for p, n := range m.nodes {
		if p == "/" {
			continue
		}
		out = append(out, MemFile{Path: p, Dir: n.dir, Mode: n.mode, Mtime: n.mtime.UnixNano(), Data: bytes.Clone(n.data)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out
}

func clean(p string) string { return path.Clean("/" + p) }

func (m *MemFS) now() time.Time {
	if m.Now != nil {
		return m.Now()
	}
	return time.Now()
}

func notExist(op, p string) error {
	return &fs.PathError{Op: op, Path: p, Err: fs.ErrNotExist}
}

// parentDir checks that p's parent is a directory (under m.mu).
func (m *MemFS) parentDir(op, p string) error {
	parent, ok := m.nodes[path.Dir(p)]
	if !ok {
		return notExist(op, path.Dir(p))
	}
	if !parent.dir {
		return &fs.PathError{Op: op, Path: path.Dir(p), Err: fmt.Errorf("not a directory")}
	}
	return nil
}

func (n *memNode) kind() silkd.FileKind {
	if n.dir {
		return silkd.FileDir
	}
	return silkd.FileRegular
}

func (n *memNode) size() uint64 {
	if n.dir {
		return 4096
	}
	return uint64(len(n.data))
}

// Stat implements FS.
func (m *MemFS) Stat(p string) (silkd.StatInfo, error) {
	p = clean(p)
	m.mu.Lock()
	defer m.mu.Unlock()
	n, ok := m.nodes[p]
	if !ok {
		return silkd.StatInfo{}, notExist("stat", p)
	}
	return silkd.StatInfo{Kind: n.kind(), Size: n.size(), Mode: n.mode, MtimeEpochSecs: uint64(max(n.mtime.Unix(), 0))}, nil
}

// children returns the direct children of dir (under m.mu).
func (m *MemFS) children(dir string) []string {
	prefix := strings.TrimSuffix(dir, "/") + "/"
	var out []string
	for p := range m.nodes {
		if p != "/" && strings.HasPrefix(p, prefix) && !strings.Contains(p[len(prefix):], "/") {
			out = append(out, p)
		}
	}
	sort.Strings(out)
	return out
}

// ReadDir implements FS.
func (m *MemFS) ReadDir(p string) ([]silkd.Entry, error) {
	p = clean(p)
	m.mu.Lock()
	defer m.mu.Unlock()
	n, ok := m.nodes[p]
	if !ok {
		return nil, notExist("readdir", p)
	}
	if !n.dir {
		return nil, badRequest("fs_list: %s is not a directory", p)
	}
	out := []silkd.Entry{}
	for _, c := range m.children(p) {
		cn := m.nodes[c]
		out = append(out, silkd.Entry{Name: path.Base(c), Kind: cn.kind(), Size: cn.size()})
	}
	return out, nil
}

// Open implements FS. The reader sees the file as it was when opened.
func (m *MemFS) Open(p string) (io.ReadCloser, error) {
	p = clean(p)
	m.mu.Lock()
	defer m.mu.Unlock()
	n, ok := m.nodes[p]
	if !ok {
		return nil, notExist("open", p)
	}
	if n.dir {
		return nil, badRequest("fs_read: %s is a dir, not a regular file", p)
	}
	// Nodes are replaced, never written in place, so the slice is stable.
	return io.NopCloser(bytes.NewReader(n.data)), nil
}

// Create implements FS.
func (m *MemFS) Create(p string, mode *uint32) (Upload, error) {
	p = clean(p)
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.parentDir("create", p); err != nil {
		return nil, err
	}
	perm := uint32(0o644)
	if n, ok := m.nodes[p]; ok {
		if n.dir {
			return nil, badRequest("fs_write: %s is a directory", p)
		}
		perm = n.mode
	}
	if mode != nil {
		perm = *mode & 0o7777
	}
	node := int64(NodeOverhead + len(p))
	if err := m.room("create", p, node); err != nil {
		return nil, err
	}
	m.pending += node
	return &memUpload{m: m, path: p, mode: perm, reserved: node}, nil
}

type memUpload struct {
	m    *MemFS
	path string
	mode uint32
	buf  bytes.Buffer
	// reserved is what the upload counts in m.pending: from Create on,
	// the cost of the node it will add; then its bytes so far. Commit
	// and Abort give it back.
	reserved int64
}

// Write reserves room for p before it buffers it: a write past the limit
// fails with ENOSPC and buffers nothing.
func (u *memUpload) Write(p []byte) (int, error) {
	u.m.mu.Lock()
	defer u.m.mu.Unlock()
	if err := u.m.room("write", u.path, int64(len(p))); err != nil {
		return 0, err
	}
	u.m.pending += int64(len(p))
	u.reserved += int64(len(p))
	return u.buf.Write(p)
}

// Commit replaces the file; a failed commit ends the upload as Abort does.
func (u *memUpload) Commit() error {
	u.m.mu.Lock()
	defer u.m.mu.Unlock()
	u.m.pending -= u.reserved
	u.reserved = 0
	if err := u.m.parentDir("create", u.path); err != nil {
		u.buf = bytes.Buffer{}
		return err
	}
	n := &memNode{mode: u.mode, mtime: u.m.now(), data: u.buf.Bytes()}
	kind := "created"
	if old, ok := u.m.nodes[u.path]; ok {
		u.m.used -= cost(u.path, old)
		kind = "modified"
	}
	u.m.nodes[u.path] = n
	u.m.used += cost(u.path, n)
	u.m.notify(kind, u.path)
	return nil
}

func (u *memUpload) Abort() {
	u.m.mu.Lock()
	defer u.m.mu.Unlock()
	u.m.pending -= u.reserved
	u.reserved = 0
	u.buf = bytes.Buffer{}
}

// Mkdir implements FS.
func (m *MemFS) Mkdir(p string, parents bool) error {
	p = clean(p)
	m.mu.Lock()
	defer m.mu.Unlock()
	if n, ok := m.nodes[p]; ok {
		if parents && n.dir {
			return nil
		}
		return &fs.PathError{Op: "mkdir", Path: p, Err: fs.ErrExist}
	}
	if parents && p != "/" {
		var missing []string
		for d := p; ; d = path.Dir(d) {
			n, ok := m.nodes[d]
			if ok {
				if !n.dir {
					return &fs.PathError{Op: "mkdir", Path: d, Err: fmt.Errorf("not a directory")}
				}
				break
			}
			missing = append(missing, d)
		}
		need := int64(0)
		for _, d := range missing {
			need += int64(NodeOverhead + len(d))
		}
		if err := m.room("mkdir", p, need); err != nil {
			return err
		}
		for _, d := range missing {
			m.addDir(d)
		}
		return nil
	}
	if err := m.parentDir("mkdir", p); err != nil {
		return err
	}
	if err := m.room("mkdir", p, int64(NodeOverhead+len(p))); err != nil {
		return err
	}
	m.addDir(p)
	return nil
}

// addDir adds an empty directory at p (under m.mu).
func (m *MemFS) addDir(p string) {
	n := &memNode{dir: true, mode: 0o755, mtime: m.now()}
	m.nodes[p] = n
	m.used += cost(p, n)
	m.notify("created", p)
}

// drop removes the node at p (under m.mu).
func (m *MemFS) drop(p string) {
	if n, ok := m.nodes[p]; ok {
		m.used -= cost(p, n)
		delete(m.nodes, p)
	}
}

// Remove implements FS.
func (m *MemFS) Remove(p string, recursive bool) error {
	p = clean(p)
	m.mu.Lock()
	defer m.mu.Unlock()
	n, ok := m.nodes[p]
	if !ok {
		return notExist("remove", p)
	}
	if p == "/" {
		return &fs.PathError{Op: "remove", Path: p, Err: fs.ErrPermission}
	}
	if n.dir {
		sub := m.subtree(p)
		if len(sub) > 1 && !recursive {
			return &fs.PathError{Op: "remove", Path: p, Err: fmt.Errorf("directory not empty")}
		}
		for _, q := range sub {
			m.drop(q)
			m.notify("deleted", q)
		}
		return nil
	}
	m.drop(p)
	m.notify("deleted", p)
	return nil
}

// subtree returns p and everything under it (under m.mu).
func (m *MemFS) subtree(p string) []string {
	out := []string{p}
	prefix := p + "/"
	for q := range m.nodes {
		if strings.HasPrefix(q, prefix) {
			out = append(out, q)
		}
	}
	return out
}

// Rename implements FS.
func (m *MemFS) Rename(from, to string) error {
	from, to = clean(from), clean(to)
	m.mu.Lock()
	defer m.mu.Unlock()
	n, ok := m.nodes[from]
	if !ok {
		return notExist("rename", from)
	}
	if err := m.parentDir("rename", to); err != nil {
		return err
	}
	if from == to {
		return nil
	}
	if strings.HasPrefix(to, from+"/") {
		return &fs.PathError{Op: "rename", Path: to, Err: fmt.Errorf("inside the source")}
	}
	dst, replaced := m.nodes[to]
	if replaced {
		if dst.dir != n.dir || (dst.dir && len(m.subtree(to)) > 1) {
			return &fs.PathError{Op: "rename", Path: to, Err: fs.ErrExist}
		}
	}
	// Paths count, so a rename to a longer name needs room for the
	// difference in every node it moves (less what it replaces).
	sub := m.subtree(from)
	grow := int64(len(sub)) * int64(len(to)-len(from))
	if replaced {
		grow -= cost(to, dst)
	}
	if err := m.room("rename", to, grow); err != nil {
		return err
	}
	if replaced {
		m.drop(to)
	}
	moved := map[string]*memNode{}
	for _, q := range sub {
		moved[to+strings.TrimPrefix(q, from)] = m.nodes[q]
		m.drop(q)
	}
	for q, nn := range moved {
		m.nodes[q] = nn
		m.used += cost(q, nn)
	}
	m.notify("renamed", from)
	m.notify("renamed", to)
	return nil
}
