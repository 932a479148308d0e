package chdriver

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/sbxlog/sbxlog/eventlog/event"
	"github.com/sbxlog/sbxlog/fsm"
)

// Files of a snapshot dir (CH's three, the disk, and ours).
const (
	ConfigFile = "config.json"
	StateFile  = "state.json"
	MemoryFile = "memory-ranges"
	DiskFile   = "cow.raw"
	MetaFile   = "meta.json"
)

// Files of a run dir besides the VMM's own (package vmm) and the disk.
const (
	RestoreDir  = "restore"
	VsockFile   = "vsock.sock"
	ConsoleFile = "console.log"
	SerialFile  = "serial.log"
)

// Meta is a snapshot's meta.json. Its presence, naming the op, marks the
// snapshot complete: it is written after every other file is fsynced and
// before the directory is renamed into the store.
type Meta struct {
	Version int `json:"version"`
	// Kind is the intent kind that made the snapshot: fsm.KindGolden or
	// fsm.KindHibernate.
	Kind fsm.IntentKind `json:"kind"`
	Op   string         `json:"op"`
	// Instance is the sandboxd instance that made the snapshot: the
	// start-up sweep removes only its own instance's (layout.ReadOwner).
	Instance   string        `json:"instance,omitempty"`
	VM         string        `json:"vm,omitempty"`
	Key        event.PoolKey `json:"key"`
	CreatedNS  int64         `json:"created_ns"`
	CopyMode   string        `json:"copy_mode"`
	Hypervisor Hypervisor    `json:"hypervisor"`
	// Files lists the snapshot's files and their sizes, checked on read so
	// that a damaged snapshot is refused before a VMM is started on it.
	Files []MetaFileInfo `json:"files"`
}

// MetaFileInfo is one file of a snapshot.
type MetaFileInfo struct {
	Name string `json:"name"`
	Size int64  `json:"size"`
}

// snapshotFiles are the files every snapshot holds.
var snapshotFiles = []string{ConfigFile, StateFile, MemoryFile, DiskFile}

// ErrNoSnapshot: the directory holds no complete snapshot.
var ErrNoSnapshot = errors.New("chdriver: no complete snapshot")

// ReadMeta reads and checks a snapshot dir's meta.json: every file it lists
// must exist with its recorded size.
func ReadMeta(dir string) (*Meta, error) {
	data, err := os.ReadFile(filepath.Join(dir, MetaFile))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("%w in %s", ErrNoSnapshot, dir)
		}
		return nil, fmt.Errorf("chdriver: %w", err)
	}
	var m Meta
	if err := json.Unmarshal(data, &m); err != nil || m.Version != 1 {
		return nil, fmt.Errorf("%w in %s: unreadable %s", ErrNoSnapshot, dir, MetaFile)
	}
	for _, f := range m.Files {
		st, err := os.Stat(filepath.Join(dir, f.Name))
		if err != nil {
			return nil, fmt.Errorf("%w in %s: %v", ErrNoSnapshot, dir, err)
		}
		if st.Size() != f.Size {
			return nil, fmt.Errorf("%w in %s: %s is %d bytes, meta says %d", ErrNoSnapshot, dir, f.Name, st.Size(), f.Size)
		}
	}
	return &m, nil
}

// buildMeta describes the snapshot files in dir.
func buildMeta(dir string, m Meta) ([]byte, error) {
	m.Version = 1
	m.Files = m.Files[:0]
	for _, name := range snapshotFiles {
		st, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			return nil, fmt.Errorf("snapshot incomplete: %w", err)
		}
		m.Files = append(m.Files, MetaFileInfo{Name: name, Size: st.Size()})
	}
	data, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(data, '\n'), nil
}
