package guesttest

import (
	"bytes"
	"compress/gzip"
	"context"
	"debug/elf"
	"encoding/binary"
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
	// executors/qemu boots template disks only with builds that say they can
	// (its GuestFeatureRootDisk).
	if !strings.Contains(string(manifest), "\nfeatures root-disk\n") {
		t.Fatalf("manifest does not say the initramfs boots root disks:\n%s", manifest)
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
	// The agent network's NIC driver, the template disk's and what they
	// need, in load order.
	load, err := os.ReadFile(filepath.Join(tmp, "lib", "modules", "load"))
	if err != nil {
		t.Fatal(err)
	}
	mods := strings.Fields(string(load))
	ring := slices.Index(mods, "virtio_ring")
	for _, m := range []string{"virtio_pci", "virtio_net", "virtio_blk"} {
		if i := slices.Index(mods, m); i < 0 || ring < 0 || i < ring {
			t.Fatalf("lib/modules/load = %q, want %s after its dependencies", mods, m)
		}
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

// The Debian template is what executors/qemu boots: an ext4 image with the
// promised packages, no docs or man pages, no SSH host keys (each VM makes
// its own), and an empty qcow2 overlay whose backing file is that image.
func TestBuiltTemplate(t *testing.T) {
	g := RequireDebian(t)
	dir := filepath.Dir(g.Disk)
	img := filepath.Join(dir, "rootfs.img")
	f, err := os.Open(img)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	magic := make([]byte, 2)
	if _, err := f.ReadAt(magic, 1024+0x38); err != nil || magic[0] != 0x53 || magic[1] != 0xef {
		t.Fatalf("%s has no ext4 superblock magic: %x, %v", img, magic, err)
	}
	if st, err := f.Stat(); err != nil || st.Mode().Perm()&0o222 != 0 {
		t.Fatalf("%s is writable: %v, %v", img, st.Mode(), err)
	}
	// The overlay names the image by absolute path (offset 8: the name's
	// offset, 16: its length).
	hdr, err := os.ReadFile(g.Disk)
	if err != nil || len(hdr) < 20 || string(hdr[:4]) != "QFI\xfb" {
		t.Fatalf("%s is not qcow2: %v", g.Disk, err)
	}
	off, n := binary.BigEndian.Uint64(hdr[8:]), binary.BigEndian.Uint32(hdr[16:])
	if off+uint64(n) > uint64(len(hdr)) || string(hdr[off:off+uint64(n)]) != img {
		t.Fatalf("%s: backing file is not %s", g.Disk, img)
	}
	pkgs, err := os.ReadFile(filepath.Join(dir, "packages"))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"bash", "coreutils", "python3", "python3-pip", "git", "ca-certificates", "curl", "netcat-openbsd", "dropbear-bin"} {
		if !strings.Contains("\n"+string(pkgs), "\n"+p+" ") {
			t.Errorf("package %s not installed:\n%s", p, pkgs)
		}
	}
	// debugfs reads the image without mounting it.
	debugfs := func(req string) string {
		out, err := exec.Command("debugfs", "-R", req, img).Output()
		if err != nil {
			t.Fatalf("debugfs -R %q: %v", req, err)
		}
		return string(out)
	}
	if got := strings.TrimSpace(debugfs("cat /etc/hostname")); got != "sandbox" {
		t.Errorf("/etc/hostname = %q", got)
	}
	if ls := debugfs("ls /etc/dropbear"); strings.Contains(ls, "host_key") {
		t.Errorf("the image has dropbear host keys: %s", ls)
	}
	if ls := debugfs("ls /usr/share/man"); strings.Contains(ls, "man1") {
		t.Errorf("the image has man pages: %s", ls)
	}
}
