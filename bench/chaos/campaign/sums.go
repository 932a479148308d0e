package campaign

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/sbxlog/sbxlog/executors/fsx"
)

// Files of a hibernate snapshot and a woken VM's run dir (chdriver's names).
const (
	memoryFile  = "memory-ranges"
	stateFile   = "state.json"
	diskFile    = "cow.raw"
	metaFile    = "meta.json"
	restoreDir  = "restore"
	markerAt    = 1 << 20 // where the campaign's "guest" writes into a disk
	markerBytes = 64
)

// Sums are the checksums of what a hibernate stored (or a woken VM
// restored from): the guest's memory, its device state and its disk.
type Sums struct {
	Memory, State, Disk string
	// Resumes is the simulated guest's resume counter in state.json: a VM
	// restored from this snapshot counts more.
	Resumes int64
}

// sumsOf digests memory, state and disk files (memDir holds the first two).
func sumsOf(memDir, disk string) (Sums, error) {
	var s Sums
	var err error
	if s.Memory, err = fsx.ContentSum(filepath.Join(memDir, memoryFile)); err != nil {
		return s, err
	}
	if s.State, err = fsx.ContentSum(filepath.Join(memDir, stateFile)); err != nil {
		return s, err
	}
	if s.Disk, err = fsx.ContentSum(disk); err != nil {
		return s, err
	}
	data, err := os.ReadFile(filepath.Join(memDir, stateFile))
	if err != nil {
		return s, err
	}
	var st struct {
		Resumes int64 `json:"resumes"`
	}
	if err := json.Unmarshal(data, &st); err != nil {
		return s, fmt.Errorf("%s: %w", stateFile, err)
	}
	s.Resumes = st.Resumes
	return s, nil
}

// latestSnapshot finds the newest complete hibernate snapshot of vm in the
// store (meta.json's created_ns decides).
func latestSnapshot(store, vm string) (string, error) {
	matches, _ := filepath.Glob(filepath.Join(store, "hibernate", vm+"-*"))
	best, bestAt := "", int64(-1)
	for _, m := range matches {
		data, err := os.ReadFile(filepath.Join(m, metaFile))
		if err != nil {
			continue
		}
		var meta struct {
			VM        string `json:"vm"`
			CreatedNS int64  `json:"created_ns"`
		}
		if json.Unmarshal(data, &meta) != nil || meta.VM != vm {
			continue
		}
		if meta.CreatedNS > bestAt {
			best, bestAt = m, meta.CreatedNS
		}
	}
	if best == "" {
		return "", fmt.Errorf("no complete hibernate snapshot of %s in %s", vm, store)
	}
	return best, nil
}

// writeMarker writes the campaign's "guest data" into a VM's disk, as its
// guest would: the marker padded to markerBytes at markerAt.
func writeMarker(disk, marker string) error {
	f, err := os.OpenFile(disk, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	buf := make([]byte, markerBytes)
	copy(buf, marker)
	_, err = f.WriteAt(buf, markerAt)
	return err
}

// readMarker reads back what writeMarker wrote ("" for nothing).
func readMarker(disk string) (string, error) {
	f, err := os.Open(disk)
	if err != nil {
		return "", err
	}
	defer f.Close()
	buf := make([]byte, markerBytes)
	if _, err := f.ReadAt(buf, markerAt); err != nil {
		return "", err
	}
	return strings.TrimRight(string(buf), "\x00"), nil
}
