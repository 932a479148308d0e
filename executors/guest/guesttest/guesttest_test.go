package guesttest

import (
	"bytes"
	"compress/gzip"
	"context"
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// The built guest is what the driver expects: a bzImage, and an initramfs whose
// /init is the project's script and whose programs are static (there is no libc).
func TestBuiltGuest(t *testing.T) {
	g := Require(t)
	k, err := os.ReadFile(g.Kernel)
	if err != nil {
		t.Fatal(err)
	}
	if len(k) < 0x206 || string(k[0x202:0x206]) != "HdrS" {
		t.Fatalf("%s is not a bzImage (no HdrS at 0x202)", g.Kernel)
	}
	manifest, err := os.ReadFile(filepath.Join(g.Dir, "manifest"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(manifest), "\nkernel linux-image-") || !strings.Contains(string(manifest), "-cloud-amd64 ") {
		t.Fatalf("manifest names no cloud kernel:\n%s", manifest)
	}

	tmp := t.TempDir()
	f, err := os.Open(g.Initrd)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatalf("initrd is not gzip: %v", err)
	}
	cpio := exec.Command("cpio", "-i", "-d", "--quiet", "--no-absolute-filenames")
	cpio.Dir = tmp
	cpio.Stdin = zr
	if out, err := cpio.CombinedOutput(); err != nil {
		t.Fatalf("cpio -i: %v: %s", err, out)
	}
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile(filepath.Join(root, "executors", "guest", "init"))
	if err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(filepath.Join(tmp, "init")); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("/init differs from executors/guest/init (%v)", err)
	}
	if target, err := os.Readlink(filepath.Join(tmp, "bin", "sh")); err != nil || target != "busybox" {
		t.Fatalf("/bin/sh -> %q, %v", target, err)
	}
	// The agent network's NIC driver and what it needs, in load order.
	load, err := os.ReadFile(filepath.Join(tmp, "lib", "modules", "load"))
	if err != nil {
		t.Fatal(err)
	}
	mods := strings.Fields(string(load))
	if len(mods) == 0 || mods[len(mods)-1] != "virtio_net" || !slices.Contains(mods, "virtio_pci") ||
		slices.Index(mods, "virtio_ring") > slices.Index(mods, "virtio_net") {
		t.Fatalf("lib/modules/load = %q, want virtio_pci and virtio_net after their dependencies", mods)
	}
	for _, m := range mods {
		ef, err := elf.Open(filepath.Join(tmp, "lib", "modules", m+".ko"))
		if err != nil {
			t.Fatalf("module %s: %v", m, err)
		}
		ef.Close()
	}
	for _, bin := range []string{"bin/busybox", "sbin/sbx-agent"} {
		ef, err := elf.Open(filepath.Join(tmp, bin))
		if err != nil {
			t.Fatalf("%s: %v", bin, err)
		}
		for _, p := range ef.Progs {
			if p.Type == elf.PT_INTERP {
				t.Errorf("%s is dynamically linked", bin)
			}
		}
		ef.Close()
	}
}

// A second build with the same inputs reuses the cached directory untouched.
func TestBuildIsCached(t *testing.T) {
	g := Require(t)
	before, err := os.Stat(g.Initrd)
	if err != nil {
		t.Fatal(err)
	}
	again, err := Build(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	after, err := os.Stat(again.Initrd)
	if err != nil {
		t.Fatal(err)
	}
	if again != g || !after.ModTime().Equal(before.ModTime()) {
		t.Fatalf("second build %+v (mtime %v), first %+v (mtime %v)", again, after.ModTime(), g, before.ModTime())
	}
}
