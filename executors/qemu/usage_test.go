package qemu

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/rs/zerolog"

	"github.com/sbxlog/sbxlog/executors/layout"
)

// TestVMMPidRefuses: VMMPid trusts a pid file only for this run dir's
// QEMU, and only reads (no pid file is written for a QEMU without one).
func TestVMMPidRefuses(t *testing.T) {
	roots := layout.RootsIn(t.TempDir())
	d, err := New(Config{Roots: roots, Instance: testInstance, Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	const vm = "vm-00000000000000e1"
	rel := testInstance + "/" + vm
	runDir := filepath.Join(roots.Runs, rel)
	if err := os.MkdirAll(runDir, 0o700); err != nil {
		t.Fatal(err)
	}
	sleeper := exec.Command("sleep", "60")
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sleeper.Process.Kill(); _ = sleeper.Wait() })

	if _, err := d.VMMPid(vm, rel); !errors.Is(err, ErrNotRunning) || !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("no pid file: %v, want ErrNotRunning", err)
	}
	if err := os.WriteFile(filepath.Join(runDir, FileVM), []byte("{}"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := d.VMMPid(vm, rel); !errors.Is(err, ErrNotRunning) {
		t.Fatalf("vm.json, no pid file: %v, want ErrNotRunning", err)
	}
	if _, err := os.Stat(filepath.Join(runDir, FilePID)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("VMMPid wrote a pid file: %v", err)
	}
	for _, content := range []string{strconv.Itoa(sleeper.Process.Pid), "garbage", "0"} {
		if err := os.WriteFile(filepath.Join(runDir, FilePID), []byte(content+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := d.VMMPid(vm, rel); !errors.Is(err, ErrNotRunning) {
			t.Fatalf("pid file %q: %v, want ErrNotRunning", content, err)
		}
	}
	for _, tc := range []struct{ vm, rel string }{{vm, "i-other/" + vm}, {"vm-00000000000000e2", rel}, {vm, testInstance + "/../x"}} {
		if _, err := d.VMMPid(tc.vm, tc.rel); err == nil || errors.Is(err, ErrNotRunning) {
			t.Errorf("VMMPid(%s, %s) = %v, want a refusal", tc.vm, tc.rel, err)
		}
	}
}
