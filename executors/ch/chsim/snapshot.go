package chsim

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/sbxlog/sbxlog/executors/ch"
	"github.com/sbxlog/sbxlog/executors/guest/silkagent"
)

// Snapshot file names, as CH writes them.
const (
	ConfigFile = "config.json"
	StateFile  = "state.json"
	MemoryFile = "memory-ranges"
)

// snapState is chsim's state.json. CH's own holds device state; this holds
// what the simulator needs to bring the same guest back.
type snapState struct {
	Simulator     string        `json:"simulator"`
	Version       int           `json:"version"`
	MemorySize    int64         `json:"memory_size"`
	MemoryRanges  []memoryRange `json:"memory_ranges"`
	DataExtents   []extent      `json:"data_extents"`
	Checksum      uint32        `json:"memory_crc32c"`
	BalloonActual int64         `json:"balloon_actual"`
	Heartbeats    int64         `json:"heartbeats"`
	Resumes       int64         `json:"resumes"`
	BootID        uint64        `json:"boot_id"`
	// GuestClockNS is the guest's wall clock at the snapshot (Unix ns),
	// where a restore brings it back (clock.go); 0 in snapshots made
	// before chsim simulated it, whose guests restore with the host's.
	GuestClockNS int64 `json:"guest_clock_ns,omitempty"`
	// GuestFiles is the simulated guest's file tree (its tmpfs, which a
	// real guest keeps in the memory snapshotted above).
	GuestFiles []silkagent.MemFile `json:"guest_files,omitempty"`
	// GuestSessions are the simulated guest's shell sessions (a real
	// guest's are in its memory).
	GuestSessions []silkagent.SimSession `json:"guest_sessions,omitempty"`
}

type memoryRange struct {
	GPA    int64 `json:"gpa"`
	Length int64 `json:"length"`
}

var errCrashed = errors.New("chsim crashed")

// budget counts snapshot bytes for SBX_CHSIM_SNAPSHOT_EXIT_AFTER.
type budget struct {
	s    *Server
	left int64 // < 0: no limit
	done int64
}

func (b *budget) writeAt(f *os.File, data []byte, off int64) error {
	if b.left >= 0 && int64(len(data)) > b.left {
		n := b.left
		if n > 0 {
			if _, err := f.WriteAt(data[:n], off); err != nil {
				return err
			}
		}
		b.done += n
		b.s.crash(fmt.Sprintf("snapshot exit after %d bytes (in %s)", b.done, filepath.Base(f.Name())))
		return errCrashed
	}
	if _, err := f.WriteAt(data, off); err != nil {
		return err
	}
	if b.left >= 0 {
		b.left -= int64(len(data))
	}
	b.done += int64(len(data))
	return nil
}

func (s *Server) snapshot(body []byte) (any, *apiError) {
	const action = "The VM could not be snapshotted"
	var req struct {
		DestinationURL string `json:"destination_url"`
		SnapshotType   string `json:"snapshot_type"`
	}
	if e := decodeBody(body, &req, "destination_url"); e != nil {
		return nil, e
	}
	if req.SnapshotType != "" && req.SnapshotType != "full" && req.SnapshotType != "diff" {
		return nil, deserializeErr(fmt.Sprintf("unknown variant `%s`, expected `full` or `diff`", req.SnapshotType))
	}
	v := s.vm
	if v == nil || !v.booted() {
		return nil, vmmErr(http.StatusInternalServerError, action, "VM is not running")
	}
	if v.state != ch.StatePaused {
		return nil, vmmErr(http.StatusInternalServerError, action, "Cannot snapshot VM",
			"Failed to snapshot migratable component", "Trying to snapshot while VM is running")
	}
	if req.SnapshotType == "diff" {
		return nil, vmmErr(http.StatusInternalServerError, action, "chsim does not simulate diff snapshots")
	}
	sendErr := func(msg string) *apiError {
		return vmmErr(http.StatusInternalServerError, action, "Cannot send VM snapshot",
			"Failed to send migratable component snapshot", msg)
	}
	dir, err := ch.URLPath(req.DestinationURL)
	if err != nil {
		return nil, sendErr("Could not extract path from URL: " + req.DestinationURL)
	}
	b := &budget{s: s, left: s.opts.SnapshotExitAfter}

	cfgData, _ := json.Marshal(v.cfg)
	if err := writeNew(b, filepath.Join(dir, ConfigFile), cfgData); err != nil {
		if errors.Is(err, errCrashed) {
			return nil, errCrashedAPI
		}
		return nil, sendErr(err.Error())
	}

	mf, err := os.OpenFile(filepath.Join(dir, MemoryFile), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, sendErr(osErrText(err))
	}
	defer mf.Close()
	// The file has the guest's full size; only data extents are written,
	// the rest stays a hole.
	if err := mf.Truncate(v.memSize); err != nil {
		return nil, sendErr(osErrText(err))
	}
	const chunk = 1 << 20
	for _, e := range v.mem.extents {
		for off := e.Off; off < e.Off+e.Len; off += chunk {
			end := min(off+chunk, e.Off+e.Len)
			if err := b.writeAt(mf, v.mem.data[off:end], off); err != nil {
				if errors.Is(err, errCrashed) {
					return nil, errCrashedAPI
				}
				return nil, sendErr(osErrText(err))
			}
		}
	}

	st := snapState{
		Simulator:     "chsim",
		Version:       1,
		MemorySize:    v.memSize,
		MemoryRanges:  []memoryRange{{0, v.memSize}},
		DataExtents:   v.mem.extents,
		Checksum:      v.mem.checksum(),
		BalloonActual: v.balloonActual,
		Heartbeats:    v.heartbeats,
		Resumes:       v.resumes,
		BootID:        v.bootID,
		GuestClockNS:  v.clock.read(s.now()).UnixNano(),
	}
	if v.guest != nil {
		st.GuestFiles = v.guest.files.Files()
		st.GuestSessions = v.guest.agent.SimSessions()
	}
	stData, _ := json.Marshal(st)
	if err := writeNew(b, filepath.Join(dir, StateFile), stData); err != nil {
		if errors.Is(err, errCrashed) {
			return nil, errCrashedAPI
		}
		return nil, sendErr(err.Error())
	}
	s.log.Printf("snapshot of %d bytes of data (%d bytes of memory) written to %s", v.mem.dataBytes(), v.memSize, dir)
	return nil, nil
}

// writeNew creates path exclusively, as CH does, and writes data into it.
func writeNew(b *budget, path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return errors.New(osErrText(err))
	}
	defer f.Close()
	if err := b.writeAt(f, data, 0); err != nil {
		if errors.Is(err, errCrashed) {
			return err
		}
		return errors.New(osErrText(err))
	}
	return nil
}

func (s *Server) restore(body []byte) (any, *apiError) {
	const action = "The VM could not be restored"
	var req struct {
		SourceURL         string `json:"source_url"`
		MemoryRestoreMode string `json:"memory_restore_mode"`
		Resume            bool   `json:"resume"`
		Prefault          bool   `json:"prefault"`
	}
	if e := decodeBody(body, &req, "source_url"); e != nil {
		return nil, e
	}
	mode := req.MemoryRestoreMode
	switch mode {
	case "":
		mode = string(ch.RestoreCopy)
	case string(ch.RestoreCopy), string(ch.RestoreOnDemand), string(ch.RestoreCopyOnWrite):
	default:
		return nil, deserializeErr(fmt.Sprintf("unknown variant `%s`, expected one of `Copy`, `OnDemand`, `CopyOnWrite`", mode))
	}
	if s.vm != nil {
		return nil, vmmErr(http.StatusInternalServerError, action, "VM is already created")
	}
	dir, err := ch.URLPath(req.SourceURL)
	if err != nil {
		return nil, vmmErr(http.StatusInternalServerError, action, "Invalid restore source URL")
	}
	restoreErr := func(msg string) *apiError {
		return vmmErr(http.StatusInternalServerError, action, "Cannot restore VM", "Failed to restore migratable component", msg)
	}
	cfgData, err := os.ReadFile(filepath.Join(dir, ConfigFile))
	if err != nil {
		return nil, restoreErr("Cannot read " + ConfigFile + ": " + osErrText(err))
	}
	cfg, err := ch.ParseConfig(cfgData)
	if err != nil {
		return nil, restoreErr("Cannot parse " + ConfigFile + ": " + err.Error())
	}
	stData, err := os.ReadFile(filepath.Join(dir, StateFile))
	if err != nil {
		return nil, restoreErr("Cannot read " + StateFile + ": " + osErrText(err))
	}
	var st snapState
	if err := json.Unmarshal(stData, &st); err != nil || st.Simulator != "chsim" {
		return nil, restoreErr("Cannot parse " + StateFile + ": not a chsim snapshot")
	}
	if mode == string(ch.RestoreCopyOnWrite) && (cfg.MemoryShared() || cfg.MemoryHugepages()) {
		return nil, restoreErr("CopyOnWrite restore needs private, non-hugepage guest memory")
	}
	mf, err := os.Open(filepath.Join(dir, MemoryFile))
	if err != nil {
		return nil, restoreErr("Cannot open " + MemoryFile + ": " + osErrText(err))
	}
	fi, err := mf.Stat()
	if err != nil {
		mf.Close()
		return nil, restoreErr(osErrText(err))
	}
	if fi.Size() != st.MemorySize {
		mf.Close()
		return nil, restoreErr(fmt.Sprintf("%s is %d bytes, the guest has %d", MemoryFile, fi.Size(), st.MemorySize))
	}
	var mem *guestMemory
	if mode == string(ch.RestoreCopy) {
		mem, err = newAnonMemory(st.MemorySize)
		if err == nil {
			mem.mode = mode
			for _, e := range st.DataExtents {
				if _, rerr := mf.ReadAt(mem.data[e.Off:e.Off+e.Len], e.Off); rerr != nil {
					err = rerr
					break
				}
			}
		}
		mf.Close()
	} else {
		// OnDemand is simulated like CopyOnWrite: pages come from the file
		// as the guest touches them, and the file must stay in place.
		mem, err = mapPrivate(mf, st.MemorySize, mode)
		if err != nil {
			mf.Close()
		}
	}
	if err != nil {
		if mem != nil {
			mem.close()
		}
		return nil, restoreErr(osErrText(err))
	}
	mem.extents = mergeExtents(append([]extent(nil), st.DataExtents...))
	if mode == string(ch.RestoreCopy) {
		// Copy has read every byte already: a mismatch fails the restore.
		if sum := mem.checksum(); sum != st.Checksum {
			mem.close()
			return nil, restoreErr(fmt.Sprintf("%s does not hold the memory %s describes (crc32c %08x, want %08x)", MemoryFile, StateFile, sum, st.Checksum))
		}
	} else {
		// A mapped restore reads nothing now (it is O(1) in memory size, as
		// on CH); the guest touches its memory once it runs, and crashes
		// then if the memory is not what it left.
		sum := st.Checksum
		mem.expect = &sum
	}
	devs, e := s.openDevices(cfg, action)
	if e != nil {
		mem.close()
		return nil, e
	}
	s.assignIDs(cfg)
	v := newInstance(cfg, ch.StatePaused, s.now())
	v.mem, v.devs = mem, devs
	v.memSize = st.MemorySize
	v.balloonActual = st.BalloonActual
	v.heartbeats, v.resumes, v.bootID = st.Heartbeats, st.Resumes, st.BootID
	now := s.now()
	v.clock = pausedClock(now, now)
	if st.GuestClockNS > 0 {
		v.clock = pausedClock(time.Unix(0, st.GuestClockNS), now)
	}
	v.guest = s.newSimGuest(v, st.GuestFiles)
	v.guest.agent.RestoreSimSessions(st.GuestSessions)
	s.vm = v
	s.startGuestLocked(v)
	s.log.Printf("restored from %s (%s, %d bytes of data)", dir, mode, mem.dataBytes())
	if req.Resume {
		v.state = ch.StateRunning
		v.resumes++
		v.clock.resume(now)
	}
	return nil, nil
}
