// Package guesttest gives tests (and benchmarks) the project's guests: Require runs
// executors/guest/build.sh, which builds the kernel and initramfs once per content hash and
// caches them, and returns their paths (the busybox guest); RequireDebian adds
// executors/guest/template.sh's default template, the Debian root disk.
//
// Tests that boot a guest are the real-guest suite: under TCG they take longer
// than `make test`'s budget allows, so they run only with SBX_E2E=1, which
// `make e2e` sets (and CI runs `make e2e` after `make test`); without it Require
// and RequireDebian skip, saying so.
//
// When a tool a guest needs is missing (qemu-system-x86_64, busybox-static, cpio;
// for the Debian template also root, mmdebstrap, mkfs.ext4 and qemu-img),
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

// E2EEnv set to 1 runs the real-guest suite (`make e2e`); Require and
// RequireDebian skip without it.
const E2EEnv = "SBX_E2E"

// RequireEnv turns skips into failures when set to 1 (CI=true does the same).
const RequireEnv = "SBX_REQUIRE_QEMU"

// QEMU is the emulator binary the guest is meant for.
const QEMU = "qemu-system-x86_64"

// Guest is a built guest.
type Guest struct {
	Dir    string // the cache directory holding both files
	Kernel string // vmlinuz
	Initrd string // initrd.img
	// Disk is the Debian template's disk.qcow2 (RequireDebian); empty for the
	// busybox guest.
	Disk string
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
	if os.Getenv(E2EEnv) != "1" {
		t.Skipf("boots a real guest: part of the real-guest suite, run by `make e2e` (%s=1)", E2EEnv)
	}
	g, err := build()
	check(t, err)
	return g
}

// check skips t for a missing tool (fails it when Required) and fails it for
// any other error.
func check(t testing.TB, err error) {
	t.Helper()
	if errors.Is(err, ErrMissingTool) {
		if Required() {
			t.Fatalf("%v (required: CI=true or %s=1)", err, RequireEnv)
		}
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
}

var (
	once         sync.Mutex
	cached       *Guest
	cachedDebian *Guest
)

// RequireDebian returns the guest with the Debian template's disk
// (executors/guest/template.sh default), building both if needed: the template
// takes minutes, once per content hash. It skips t (or fails it, see Required)
// when a tool is missing or the test does not run as root.
func RequireDebian(t testing.TB) Guest {
	t.Helper()
	g := Require(t)
	once.Lock()
	defer once.Unlock()
	if cachedDebian != nil {
		return *cachedDebian
	}
	dir, err := buildTemplate(context.Background())
	check(t, err)
	g.Disk = filepath.Join(dir, "disk.qcow2")
	cachedDebian = &g
	return g
}

// buildTemplate runs executors/guest/template.sh for the default template and
// returns its directory.
func buildTemplate(ctx context.Context) (string, error) {
	if os.Geteuid() != 0 {
		return "", fmt.Errorf("%w: building the Debian template needs root (mmdebstrap's chroot)", ErrMissingTool)
	}
	for _, tool := range []struct{ bin, pkg string }{
		{"mmdebstrap", "mmdebstrap"}, {"mkfs.ext4", "e2fsprogs"}, {"qemu-img", "qemu-utils"},
	} {
		if _, err := exec.LookPath(tool.bin); err != nil {
			return "", fmt.Errorf("%w: %s not found (apt-get install %s)", ErrMissingTool, tool.bin, tool.pkg)
		}
	}
	// mmdebstrap downloads and installs a few hundred MB on a first build.
	out, err := runScript(ctx, 30*time.Minute, "template.sh")
	if err != nil {
		return "", err
	}
	for _, f := range []string{"rootfs.img", "disk.qcow2"} {
		if st, err := os.Stat(filepath.Join(out, f)); err != nil || st.Size() == 0 {
			return "", fmt.Errorf("guesttest: executors/guest/template.sh printed %q but its %s is missing or empty", out, f)
		}
	}
	return out, nil
}

// runScript runs executors/guest/<script> from the module root and returns
// the last line it printed (the build's directory).
func runScript(ctx context.Context, timeout time.Duration, script string) (string, error) {
	root, err := repoRoot()
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", filepath.Join(root, "executors", "guest", script))
	cmd.Dir = root
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("guesttest: executors/guest/%s: %v: %s", script, err, strings.TrimSpace(stderr.String()))
	}
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	return lines[len(lines)-1], nil
}

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
	dir, err := runScript(ctx, 10*time.Minute, "build.sh")
	if err != nil {
		return Guest{}, err
	}
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
