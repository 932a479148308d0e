// Package guesttest gives tests (and benchmarks) the project's test guest: it runs
// executors/guest/build.sh, which builds the kernel and initramfs once per content hash and
// caches them, and returns their paths.
//
// When a tool the guest needs is missing (qemu-system-x86_64, busybox-static, cpio),
// tests are skipped with the reason, unless CI=true or SBX_REQUIRE_QEMU=1, which turn
// the skip into a failure so that CI cannot pass by not running the VM tests. A
// build that fails with every tool present is always a failure.
package guesttest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// RequireEnv turns skips into failures when set to 1 (CI=true does the same).
const RequireEnv = "SBX_REQUIRE_QEMU"

// QEMU is the emulator binary the guest is meant for.
const QEMU = "qemu-system-x86_64"

// Guest is a built guest.
type Guest struct {
	Dir    string // the cache directory holding both files
	Kernel string // vmlinuz
	Initrd string // initrd.img
}

// ErrMissingTool is wrapped by Build's error when a required tool is not installed.
var ErrMissingTool = errors.New("guesttest: missing tool")

// Required reports whether missing tools must fail rather than skip tests.
func Required() bool {
	return os.Getenv(RequireEnv) == "1" || os.Getenv("CI") == "true"
}

// Require returns the guest, building it if needed. It skips t (or fails it, see
// Required) when qemu or a build tool is missing.
func Require(t testing.TB) Guest {
	t.Helper()
	g, err := build()
	if errors.Is(err, ErrMissingTool) {
		if Required() {
			t.Fatalf("%v (required: CI=true or %s=1)", err, RequireEnv)
		}
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	return g
}

var (
	once   sync.Mutex
	cached *Guest
)

func build() (Guest, error) {
	once.Lock()
	defer once.Unlock()
	if cached != nil {
		return *cached, nil
	}
	g, err := Build(context.Background())
	if err == nil {
		cached = &g
	}
	return g, err
}

// Build checks the tools and runs executors/guest/build.sh, without a testing.TB (for
// benchmarks). Missing tools give an error wrapping ErrMissingTool.
func Build(ctx context.Context) (Guest, error) {
	if err := CheckTools(); err != nil {
		return Guest{}, err
	}
	root, err := repoRoot()
	if err != nil {
		return Guest{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", filepath.Join(root, "executors", "guest", "build.sh"))
	cmd.Dir = root
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return Guest{}, fmt.Errorf("guesttest: executors/guest/build.sh: %v: %s", err, strings.TrimSpace(stderr.String()))
	}
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	dir := lines[len(lines)-1]
	g := Guest{Dir: dir, Kernel: filepath.Join(dir, "vmlinuz"), Initrd: filepath.Join(dir, "initrd.img")}
	for _, p := range []string{g.Kernel, g.Initrd} {
		if st, err := os.Stat(p); err != nil || st.Size() == 0 {
			return Guest{}, fmt.Errorf("guesttest: executors/guest/build.sh printed %q but %s is missing or empty", dir, p)
		}
	}
	return g, nil
}

// CheckTools reports the first missing tool the guest needs to be built and run.
func CheckTools() error {
	for _, tool := range []struct{ bin, pkg string }{
		{QEMU, "qemu-system-x86"},
		{"cpio", "cpio"},
		{"dpkg-deb", "dpkg"},
	} {
		if _, err := exec.LookPath(tool.bin); err != nil {
			return fmt.Errorf("%w: %s not found (apt-get install %s)", ErrMissingTool, tool.bin, tool.pkg)
		}
	}
	// busybox-static, not busybox: the initramfs has no libc for a dynamic busybox.
	out, err := exec.Command("dpkg-query", "-W", "-f=${Status}", "busybox-static").Output()
	if err != nil || !strings.HasPrefix(string(out), "install ok installed") {
		return fmt.Errorf("%w: busybox-static is not installed (apt-get install busybox-static)", ErrMissingTool)
	}
	if _, err := exec.LookPath("go"); err != nil {
		if _, err := os.Stat(filepath.Join(os.Getenv("GOROOT"), "bin", "go")); err != nil {
			return fmt.Errorf("%w: go not on PATH (needed to build sbx-agent)", ErrMissingTool)
		}
	}
	return nil
}

// repoRoot finds the module root from the working directory (a test runs in its
// package's directory).
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "executors", "guest", "build.sh")); err == nil {
			if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
				return dir, nil
			}
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("guesttest: executors/guest/build.sh not found above the working directory")
		}
		dir = parent
	}
}
