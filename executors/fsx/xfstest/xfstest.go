// Package xfstest gives tests a real filesystem of a chosen kind: a loop-mounted XFS
// image with reflink, or a filesystem without reflink (tmpfs, or an ext4 image) for
// the copy-fallback paths. Each mount lives in t.TempDir() and is unmounted, and its
// loop device detached, in t.Cleanup.
//
// Mounting needs root and the mkfs tool. When either is missing the test is
// skipped with the reason, unless SBX_REQUIRE_XFS=1 (set by CI), which turns the skip
// into a failure so CI can never pass by silently not running the XFS tests.
package xfstest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// MinXFSSize is the smallest image mkfs.xfs accepts (xfsprogs >= 5.19 refuses
// smaller ones); Mount raises smaller sizes to it. Images are sparse, so a large
// size costs no disk until written.
const MinXFSSize = 300 << 20

// RequireEnv is the variable that turns skips into failures.
const RequireEnv = "SBX_REQUIRE_XFS"

// Unavailable skips t with the reason, or fails it when SBX_REQUIRE_XFS=1.
func Unavailable(t testing.TB, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if os.Getenv(RequireEnv) == "1" {
		t.Fatalf("%s (required: %s=1)", msg, RequireEnv)
	}
	t.Skip(msg)
}

// RequireRoot skips (or, with SBX_REQUIRE_XFS=1, fails) t unless it runs as root.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		Unavailable(t, "xfstest: needs root to mount filesystems (euid %d)", os.Geteuid())
	}
}

func requireTool(t testing.TB, name, pkg string) {
	t.Helper()
	if _, err := exec.LookPath(name); err != nil {
		Unavailable(t, "xfstest: %s not found (apt-get install %s)", name, pkg)
	}
}

// Mount creates a sizeBytes XFS image with reflink=1 in t.TempDir(), loop-mounts it
// and returns the mount point.
func Mount(t testing.TB, sizeBytes int64) string {
	t.Helper()
	RequireRoot(t)
	requireTool(t, "mkfs.xfs", "xfsprogs")
	return mountImage(t, max(sizeBytes, MinXFSSize), "mkfs.xfs", "-q", "-m", "reflink=1")
}

// NoReflink names a filesystem without reflink support.
type NoReflink string

const (
	Tmpfs NoReflink = "tmpfs"
	Ext4  NoReflink = "ext4"
)

// MountNoReflink mounts a filesystem of the given kind, sizeBytes large, where
// FICLONE fails, and returns its mount point.
func MountNoReflink(t testing.TB, sizeBytes int64, kind NoReflink) string {
	t.Helper()
	RequireRoot(t)
	switch kind {
	case Tmpfs:
		mnt := filepath.Join(t.TempDir(), "mnt")
		if err := os.Mkdir(mnt, 0o755); err != nil {
			t.Fatal(err)
		}
		if out, err := run("mount", "-t", "tmpfs", "-o", fmt.Sprintf("size=%d", sizeBytes), "sbxtest", mnt); err != nil {
			Unavailable(t, "xfstest: mount tmpfs: %v: %s", err, out)
		}
		t.Cleanup(func() { unmount(t, mnt, "") })
		return mnt
	case Ext4:
		requireTool(t, "mkfs.ext4", "e2fsprogs")
		return mountImage(t, sizeBytes, "mkfs.ext4", "-q", "-F")
	}
	t.Fatalf("xfstest: unknown filesystem kind %q", kind)
	return ""
}

func mountImage(t testing.TB, size int64, mkfs ...string) string {
	t.Helper()
	dir := t.TempDir()
	img := filepath.Join(dir, "fs.img")
	mnt := filepath.Join(dir, "mnt")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(img)
	if err != nil {
		t.Fatal(err)
	}
	err = f.Truncate(size)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatalf("xfstest: image: %v", err)
	}
	if out, err := run(mkfs[0], append(mkfs[1:], img)...); err != nil {
		t.Fatalf("xfstest: %s: %v: %s", mkfs[0], err, out)
	}
	if out, err := run("mount", "-o", "loop", img, mnt); err != nil {
		detach(t, img)
		Unavailable(t, "xfstest: loop mount: %v: %s", err, out)
	}
	// Registered after t.TempDir's own cleanup, so it runs before the dir is removed.
	t.Cleanup(func() { unmount(t, mnt, img) })
	return mnt
}

// unmount unmounts mnt, falling back to a lazy unmount when it stays busy, then
// detaches any loop device still backed by img.
func unmount(t testing.TB, mnt, img string) {
	t.Helper()
	var out []byte
	var err error
	deadline := time.Now().Add(5 * time.Second)
	for {
		if out, err = run("umount", mnt); err == nil {
			break
		}
		if !strings.Contains(string(out), "busy") || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond) // an fd closing in a just-ended goroutine
	}
	if err != nil {
		if lout, lerr := run("umount", "-l", mnt); lerr != nil {
			t.Errorf("xfstest: umount %s: %v: %s; lazy: %v: %s", mnt, err, out, lerr, lout)
		} else {
			t.Logf("xfstest: umount %s failed (%v: %s); lazily unmounted", mnt, err, out)
		}
	}
	if img != "" {
		detach(t, img)
	}
}

// detach removes every loop device backed by img. mount -o loop sets autoclear, so
// normally there is none left; this covers a failed mount and a lazy unmount.
func detach(t testing.TB, img string) {
	t.Helper()
	out, err := run("losetup", "-j", img)
	if err != nil {
		t.Errorf("xfstest: losetup -j %s: %v: %s", img, err, out)
		return
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		dev, _, ok := strings.Cut(line, ":")
		if !ok || dev == "" {
			continue
		}
		if dout, err := run("losetup", "-d", dev); err != nil {
			t.Errorf("xfstest: losetup -d %s: %v: %s", dev, err, dout)
		}
	}
}

func run(name string, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	return exec.CommandContext(ctx, name, args...).CombinedOutput()
}
