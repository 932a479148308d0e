package chsim_test

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sbxlog/sbxlog/executors/ch"
	"github.com/sbxlog/sbxlog/executors/ch/chsim"
	"github.com/sbxlog/sbxlog/executors/ch/chsimbin"
)

func fileSum(t *testing.T, path string) [32]byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	var out [32]byte
	copy(out[:], h.Sum(nil))
	return out
}

// mapping sums the smaps entries of one mapped file in a process, in kB.
type mapping struct {
	perms string
	// shared counts pages also mapped elsewhere (clean, or page cache not
	// yet written back); anon counts pages copied on write.
	rss, pss, shared, anon int64
}

func smapsOf(t *testing.T, pid int, path string) mapping {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/smaps", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var m mapping
	in := false
	found := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) == 0 {
			continue
		}
		if !strings.HasSuffix(fields[0], ":") { // a mapping header
			in = len(fields) >= 6 && fields[5] == path
			if in {
				m.perms = fields[1]
				found = true
			}
			continue
		}
		if !in || len(fields) < 2 {
			continue
		}
		n, _ := strconv.ParseInt(fields[1], 10, 64)
		switch fields[0] {
		case "Rss:":
			m.rss += n
		case "Pss:":
			m.pss += n
		case "Shared_Clean:", "Shared_Dirty:":
			m.shared += n
		case "Anonymous:":
			m.anon += n
		}
	}
	if !found {
		t.Fatalf("pid %d does not map %s", pid, path)
	}
	return m
}

func statusKB(t *testing.T, pid int, key string) int64 {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(l, key+":"); ok {
			n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return n
		}
	}
	t.Fatalf("no %s in /proc/%d/status", key, pid)
	return 0
}

func heartbeatAt(t *testing.T, memFile string) uint64 {
	t.Helper()
	f, err := os.Open(memFile)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var b [8]byte
	if _, err := f.ReadAt(b[:], 64); err != nil {
		t.Fatal(err)
	}
	return binary.LittleEndian.Uint64(b[:])
}

// cloneSnapshot prepares a clone's snapshot dir the way the executors'
// clone recipe does: memory-ranges hard-linked (same inode, same page cache),
// state.json copied, config.json copied with the disk path rewritten.
func cloneSnapshot(t *testing.T, golden, dir string) string {
	t.Helper()
	snap := filepath.Join(dir, "snap")
	if err := os.MkdirAll(snap, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(filepath.Join(golden, chsim.MemoryFile), filepath.Join(snap, chsim.MemoryFile)); err != nil {
		t.Fatal(err)
	}
	state, err := os.ReadFile(filepath.Join(golden, chsim.StateFile))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(snap, chsim.StateFile), state, 0o600); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(golden, chsim.ConfigFile))
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := ch.ParseConfig(data)
	if err != nil {
		t.Fatal(err)
	}
	disk := filepath.Join(dir, "cow.raw")
	if err := os.WriteFile(disk, make([]byte, 4096), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := cfg.SetDiskPath(0, disk); err != nil {
		t.Fatal(err)
	}
	data, _ = cfg.MarshalJSON()
	if err := os.WriteFile(filepath.Join(snap, chsim.ConfigFile), data, 0o600); err != nil {
		t.Fatal(err)
	}
	return snap
}

// restoreClone prepares a clone of golden in dir and restores it
// CopyOnWrite in a chsim process of its own.
func restoreClone(t *testing.T, golden, dir string, resume bool) (p *chsimbin.Process, snap string) {
	t.Helper()
	snap = cloneSnapshot(t, golden, dir)
	p = startProc(t, dir)
	url, _ := ch.FileURL(snap)
	if err := p.Client.Restore(context.Background(), ch.RestoreConfig{SourceURL: url, MemoryRestoreMode: ch.RestoreCopyOnWrite, Resume: resume}); err != nil {
		t.Fatalf("restore of a clone: %v", err)
	}
	return p, snap
}

// goldenSnapshot boots a VM in its own chsim process, snapshots it into
// dir/golden and stops that VMM.
func goldenSnapshot(t *testing.T, dir string, memSize int64, env ...string) string {
	t.Helper()
	ctx := context.Background()
	gdir := filepath.Join(dir, "g")
	if err := os.Mkdir(gdir, 0o755); err != nil {
		t.Fatal(err)
	}
	p := startProc(t, gdir, env...)
	boot(t, p.Client, vmConfig(t, gdir, memSize))
	waitHeartbeats(t, p.Client, 2)
	if err := p.Client.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	snap, url := snapshotDir(t, dir, "golden")
	if err := p.Client.Snapshot(ctx, url); err != nil {
		t.Fatal(err)
	}
	if err := p.Client.ShutdownVMM(ctx); err != nil {
		t.Fatal(err)
	}
	if err := p.WaitExit(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	return snap
}

// TestCopyOnWriteRestore restores two clones CopyOnWrite from one snapshot
// and shows that the mapping is private (the guests write into memory, the
// file on disk does not change) and that the file's pages come from the page
// cache (each clone's RSS is a fraction of its memory, and the clones share
// the file's pages).
func TestCopyOnWriteRestore(t *testing.T) {
	ctx := context.Background()
	const memSize = 256 << 20
	dir := shortDir(t)
	env := []string{chsim.EnvDirtyBytes + "=16M"}
	golden := goldenSnapshot(t, dir, memSize, env...)
	goldenMem := filepath.Join(golden, chsim.MemoryFile)
	sumBefore := fileSum(t, goldenMem)
	beatBefore := heartbeatAt(t, goldenMem)

	type clone struct {
		pid  int
		c    *ch.Client
		snap string
	}
	var clones []clone
	for i := range 2 {
		p, snap := restoreClone(t, golden, filepath.Join(dir, fmt.Sprintf("c%d", i)), true)
		clones = append(clones, clone{p.Pid(), p.Client, snap})
	}
	for _, c := range clones {
		waitHeartbeats(t, c.c, int64(beatBefore)+5)
	}

	// Private: the guests have written, the file is byte for byte the same.
	if fileSum(t, goldenMem) != sumBefore {
		t.Fatal("memory-ranges changed on disk while CopyOnWrite guests ran")
	}
	for i, c := range clones {
		m := smapsOf(t, c.pid, filepath.Join(c.snap, chsim.MemoryFile))
		if !strings.HasSuffix(m.perms, "p") {
			t.Errorf("clone %d maps memory-ranges %s, want a private mapping", i, m.perms)
		}
		// The heartbeat page was copied on write: anonymous, and only a few.
		if m.anon < 4 || m.anon > 1024 {
			t.Errorf("clone %d: %d kB of anonymous (copied) pages in the mapping, want a few", i, m.anon)
		}
		// The data pages are the page cache's, mapped by both clones.
		if m.shared < 8<<10 || m.pss > m.rss*3/4 {
			t.Errorf("clone %d: %d kB shared, Pss %d of Rss %d kB: want the snapshot's data shared", i, m.shared, m.pss, m.rss)
		}
		rss := statusKB(t, c.pid, "VmRSS")
		if rss*1024 > memSize/4 {
			t.Errorf("clone %d: VmRSS %d kB, want far below the guest's %d MiB", i, rss, memSize>>20)
		}
		t.Logf("clone %d: VmRSS %d kB; memory-ranges %s Rss %d kB Pss %d kB shared %d kB copied %d kB",
			i, rss, m.perms, m.rss, m.pss, m.shared, m.anon)
	}

	// The writes are real: a snapshot of a clone carries its newer heartbeat.
	c0 := clones[0]
	if err := c0.c.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	snap2, url2 := snapshotDir(t, dir, "c0-again")
	if err := c0.c.Snapshot(ctx, url2); err != nil {
		t.Fatal(err)
	}
	if got := heartbeatAt(t, filepath.Join(snap2, chsim.MemoryFile)); got <= beatBefore+4 {
		t.Errorf("clone's snapshot heartbeat %d, golden had %d", got, beatBefore)
	}
	if heartbeatAt(t, goldenMem) != beatBefore {
		t.Error("the golden's heartbeat changed on disk")
	}
}

// TestTruncatedMemoryFileKillsGuest: truncating memory-ranges under a running
// CopyOnWrite guest faults it, as on CH.
func TestTruncatedMemoryFileKillsGuest(t *testing.T) {
	dir := shortDir(t)
	golden := goldenSnapshot(t, dir, 64<<20, chsim.EnvDirtyBytes+"=1M")
	p, snap := restoreClone(t, golden, filepath.Join(dir, "c"), true)
	waitHeartbeats(t, p.Client, 1)
	if err := os.Truncate(filepath.Join(snap, chsim.MemoryFile), 0); err != nil {
		t.Fatal(err)
	}
	if err := p.WaitExit(10 * time.Second); err != nil {
		t.Fatal("guest survived the truncation of its memory file")
	}
	if !strings.Contains(p.Log(), "SIGBUS") {
		t.Errorf("exit was not a SIGBUS:\n%s", p.Log())
	}
}

// TestCorruptMemoryCrashesMappedGuest: a CopyOnWrite restore reads nothing,
// so it succeeds; the guest then finds its memory is not what it left and
// the VMM exits, as CH does when its guest dies.
func TestCorruptMemoryCrashesMappedGuest(t *testing.T) {
	ctx := context.Background()
	dir := shortDir(t)
	golden := goldenSnapshot(t, dir, 64<<20, chsim.EnvDirtyBytes+"=1M")
	f, err := os.OpenFile(filepath.Join(golden, chsim.MemoryFile), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("corrupt"), 4096+100); err != nil {
		t.Fatal(err)
	}
	f.Close()
	// The mapped restore of the corrupt snapshot succeeds: it reads nothing.
	p, _ := restoreClone(t, golden, filepath.Join(dir, "c"), false)
	if err := p.Client.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	if err := p.WaitExit(10 * time.Second); err != nil {
		t.Fatal("VMM kept running a guest with corrupt memory")
	}
	if !strings.Contains(p.Log(), "guest memory differs from the snapshot") {
		t.Errorf("log does not say why:\n%s", p.Log())
	}
}

func TestSnapshotExitAfter(t *testing.T) {
	ctx := context.Background()
	dir := shortDir(t)
	const k = 300 << 10
	p := startProc(t, dir, chsim.EnvSnapshotExitAfter+"="+strconv.Itoa(k), chsim.EnvDirtyBytes+"=2M")
	boot(t, p.Client, vmConfig(t, dir, 64<<20))
	if err := p.Client.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	snap, url := snapshotDir(t, dir, "snap")
	err := p.Client.Snapshot(ctx, url)
	if !errors.Is(err, ch.ErrConnectionLost) {
		t.Fatalf("snapshot = %v, want the connection lost", err)
	}
	var ee *exec.ExitError
	if err := p.ExitErr(); !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("exit = %v, want SIGKILL", err)
	}
	cfgInfo, err := os.Stat(filepath.Join(snap, chsim.ConfigFile))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(snap, chsim.StateFile)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("state.json exists after a crash mid-memory: %v", err)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(filepath.Join(snap, chsim.MemoryFile), &st); err != nil {
		t.Fatal(err)
	}
	written := int64(k) - cfgInfo.Size()
	if alloc := st.Blocks * 512; alloc < written || alloc > written+64<<10 {
		t.Errorf("memory-ranges holds %d bytes, want about the %d written before the crash", alloc, written)
	}
	// The crash leaves the API socket behind: the next client sees the VMM gone.
	if _, err := p.Client.Ping(ctx); !ch.IsVMMGone(err) {
		t.Errorf("ping after crash = %v, want ErrVMMGone", err)
	}
}

func TestProcessFaults(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name, env string
		min       time.Duration
	}{
		{"latency", chsim.EnvLatency + "=40ms", 40 * time.Millisecond},
		{"op latency", chsim.EnvOpLatency + "=vmm.ping:60ms", 60 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := startProc(t, shortDir(t), tc.env)
			start := time.Now()
			if _, err := p.Client.Ping(ctx); err != nil {
				t.Fatal(err)
			}
			if el := time.Since(start); el < tc.min {
				t.Errorf("ping took %s with %s", el, tc.env)
			}
		})
	}
	t.Run("fail exit", func(t *testing.T) {
		dir := shortDir(t)
		p := startProc(t, dir, chsim.EnvFail+"=vm.boot:1:exit")
		if err := p.Client.Create(ctx, vmConfig(t, dir, 32<<20)); err != nil {
			t.Fatal(err)
		}
		if err := p.Client.Boot(ctx); !errors.Is(err, ch.ErrConnectionLost) {
			t.Fatalf("boot = %v, want the connection lost", err)
		}
		if err := p.WaitExit(5 * time.Second); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("exit random", func(t *testing.T) {
		p := startProc(t, shortDir(t), chsim.EnvExitRandom+"=300ms")
		if err := p.WaitExit(5 * time.Second); err != nil {
			t.Fatal("chsim did not exit")
		}
		var ee *exec.ExitError
		if err := p.ExitErr(); !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
			t.Errorf("exit = %v, want SIGKILL", err)
		}
	})
}

func TestBinaryCommandLine(t *testing.T) {
	out, err := exec.Command(chsimBin, "--help").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "SIMULATOR") || !strings.Contains(string(out), chsim.EnvSnapshotExitAfter) {
		t.Errorf("--help: %v\n%s", err, out)
	}
	out, err = exec.Command(chsimBin, "--version").Output()
	if err != nil || !strings.Contains(string(out), chsim.Version) || !strings.Contains(string(out), "simulator") {
		t.Errorf("--version: %v %s", err, out)
	}
	for _, c := range []struct {
		args []string
		env  string
	}{
		{[]string{"--no-such-flag"}, ""},
		{nil, ""}, // no --api-socket
		{[]string{"--api-socket", "path=/tmp/x.sock", "extra"}, ""},
		{[]string{"--api-socket", "path=/tmp/x.sock"}, chsim.EnvFail + "=garbage"},
	} {
		cmd := exec.Command(chsimBin, c.args...)
		if c.env != "" {
			cmd.Env = append(os.Environ(), c.env)
		}
		out, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 2 {
			t.Errorf("%q %s: %v, want exit 2\n%s", c.args, c.env, err, out)
		}
	}
	// A second VMM on a socket in use refuses instead of stealing it.
	dir := shortDir(t)
	startProc(t, dir)
	out, err = exec.Command(chsimBin, "--api-socket", "path="+filepath.Join(dir, "api.sock")).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "in use") {
		t.Errorf("second VMM on a live socket: %v\n%s", err, out)
	}
}
