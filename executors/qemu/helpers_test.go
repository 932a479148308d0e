package qemu

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sbxlog/sbxlog/executors/fsx"
	"github.com/sbxlog/sbxlog/executors/guest/agent"
	"github.com/sbxlog/sbxlog/executors/guest/guesttest"
	"github.com/sbxlog/sbxlog/executors/qemu/qmp"
)

// qemuPIDs returns the live QEMU processes whose command line mentions path
// (a run dir or a data dir). Zombies have an empty cmdline and do not count.
func qemuPIDs(path string) []int {
	ents, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || len(b) == 0 {
			continue
		}
		args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		if filepath.Base(args[0]) == "qemu-system-x86_64" && strings.Contains(string(b), path+"/") {
			pids = append(pids, pid)
		}
	}
	return pids
}

// eventually calls cond every interval until it holds (true) or timeout has
// passed (false).
func eventually(timeout, interval time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(interval)
	}
	return true
}

// killQEMUsOnCleanup makes sure no QEMU under path outlives the test (nor keeps
// its filesystem busy): register it after the mount, so it runs before the
// unmount.
func killQEMUsOnCleanup(t testing.TB, path string) {
	t.Cleanup(func() {
		if !eventually(10*time.Second, 20*time.Millisecond, func() bool {
			pids := qemuPIDs(path)
			for _, pid := range pids {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
			return len(pids) == 0
		}) {
			t.Errorf("QEMU processes %v under %s survive SIGKILL", qemuPIDs(path), path)
		}
	})
}

// waitNoQEMU waits until no QEMU mentions path.
func waitNoQEMU(t testing.TB, path string, timeout time.Duration) {
	t.Helper()
	if !eventually(timeout, 20*time.Millisecond, func() bool { return len(qemuPIDs(path)) == 0 }) {
		t.Fatalf("QEMU %v of %s still running after %v", qemuPIDs(path), path, timeout)
	}
}

func noEntry(t testing.TB, path string) {
	t.Helper()
	if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("%s exists (%v)", path, err)
	}
}

// tempDirs lists the temp dirs of recipes in dir.
func tempDirs(t testing.TB, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), fsx.TempPrefix) {
			out = append(out, e.Name())
		}
	}
	return out
}

// guestDo runs f on a fresh agent connection to the VM in runDir (the agent
// socket takes one client at a time, so the connection is closed after).
func guestDo[T any](t testing.TB, ctx context.Context, runDir string, f func(a *agent.Client) (T, error)) T {
	t.Helper()
	a, err := agent.Dial(ctx, AgentSocket(runDir))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	v, err := f(a)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// crashAfterMigrate does what a hibernate does up to the end of the migration,
// into a temp dir of store, and stops there as a killed daemon would: QEMU is
// left in postmigrate with the temp dir in the store.
func crashAfterMigrate(t testing.TB, ctx context.Context, runDir, store string) {
	t.Helper()
	c := qmpStop(t, ctx, runDir)
	defer c.Close()
	tmp, err := fsx.MkTempDir(store, "crashed")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.SetMigrationCapabilities(ctx, "x-ignore-shared", "events"); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(filepath.Join(tmp, FileState), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	err = c.GetFD(ctx, "crash-state", int(f.Fd()))
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Execute(ctx, "migrate", map[string]any{"uri": "fd:crash-state"}, nil); err != nil {
		t.Fatal(err)
	}
	for {
		st, err := c.QueryStatus(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if st.Status == "postmigrate" {
			return
		}
		if mi, err := c.QueryMigrate(ctx); err != nil || mi.Status == "failed" {
			t.Fatalf("migration: %+v, %v", mi, err)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// qmpStop pauses the VM in runDir, as a hibernate's first step, and returns
// the QMP connection.
func qmpStop(t testing.TB, ctx context.Context, runDir string) *qmp.Client {
	t.Helper()
	c, err := qmp.Dial(ctx, QMPSocket(runDir))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Execute(ctx, "stop", nil, nil); err != nil {
		c.Close()
		t.Fatal(err)
	}
	return c
}

// qcow2Overlay makes an empty qcow2 overlay over the raw image base, next to
// it, as executors/guest/template.sh does; without qemu-img the test is
// skipped (failed where QEMU is required).
func qcow2Overlay(t testing.TB, base string) string {
	t.Helper()
	if _, err := exec.LookPath("qemu-img"); err != nil {
		if guesttest.Required() {
			t.Fatalf("qemu-img not found (apt-get install qemu-utils); required: %s=1 or CI=true", guesttest.RequireEnv)
		}
		t.Skip("qemu-img not found (apt-get install qemu-utils)")
	}
	overlay := base + ".qcow2"
	if out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", "-F", "raw", "-b", base, overlay).CombinedOutput(); err != nil {
		t.Fatalf("qemu-img create: %v: %s", err, out)
	}
	return overlay
}
