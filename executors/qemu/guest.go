package qemu

import (
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// Guest is what a template boots: a kernel and initrd built by
// executors/guest/build.sh, and, for a template with a root disk, Disk: a
// qcow2 image (executors/guest/template.sh's disk.qcow2, an empty overlay over
// the template's read-only rootfs.img) that each VM's disk is cloned from. The
// initramfs switches into that disk's root (executors/guest/init, RootAppend).
type Guest struct {
	Dir    string // the build directory (CachedGuest), informational
	Kernel string
	Initrd string
	Disk   string // optional
}

// Template names with a meaning of their own.
const (
	// TemplateDefault is the template a claim without one gets, and the one
	// `make run` serves: the Debian template (executors/guest/template.sh
	// default).
	TemplateDefault = "default"
	// TemplateBusybox is the initramfs alone (busybox and the agent, no disk):
	// the fastest to boot, for tests.
	TemplateBusybox = "busybox"
)

// RootAppend is what the kernel command line of a VM with a disk carries:
// executors/guest/init's first stage mounts the disk and switches into it.
const RootAppend = "sbx.root=/dev/vda"

// cacheBase is ${SBX_CACHE:-$HOME/.cache/sbxlog}, where the build scripts cache.
func cacheBase() string {
	if base := os.Getenv("SBX_CACHE"); base != "" {
		return base
	}
	home, err := os.UserHomeDir()
	if err != nil || home == "" {
		home = "/root"
	}
	return filepath.Join(home, ".cache", "sbxlog")
}

// GuestCacheDir is where executors/guest/build.sh caches its builds:
// ${SBX_CACHE:-$HOME/.cache/sbxlog}/guest.
func GuestCacheDir() string { return filepath.Join(cacheBase(), "guest") }

// TemplateCacheDir is where executors/guest/template.sh caches its builds:
// ${SBX_CACHE:-$HOME/.cache/sbxlog}/template, one directory per template name.
func TemplateCacheDir() string { return filepath.Join(cacheBase(), "template") }

// CachedGuest returns the newest complete build in cacheDir (GuestCacheDir()
// when empty): a <hash> directory holding a non-empty vmlinuz, initrd.img and
// manifest, newest by the manifest's modification time. build.sh names builds
// by the hash of their inputs, so the newest is the one `make guest` made last.
func CachedGuest(cacheDir string) (Guest, bool) {
	if cacheDir == "" {
		cacheDir = GuestCacheDir()
	}
	return newestGuest(cacheDir, nil)
}

// newestGuest is CachedGuest among the builds accept takes (nil: all).
func newestGuest(cacheDir string, accept func(dir string) bool) (Guest, bool) {
	dir, ok := newestBuild(cacheDir, accept, "vmlinuz", "initrd.img", "manifest")
	if !ok {
		return Guest{}, false
	}
	return Guest{Dir: dir, Kernel: filepath.Join(dir, "vmlinuz"), Initrd: filepath.Join(dir, "initrd.img")}, true
}

// GuestFeatureRootDisk is the manifest line of a guest build whose initramfs
// can switch into a template's root disk (RootAppend).
const GuestFeatureRootDisk = "features root-disk"

// switchesRoot reports whether the guest build in dir says its initramfs
// can boot a template's root disk. An older build ignores sbx.root and would
// run its busybox userland with the disk unused: never pair one with a disk.
func switchesRoot(dir string) bool {
	b, err := os.ReadFile(filepath.Join(dir, "manifest"))
	if err != nil {
		return false
	}
	return slices.Contains(strings.Split(string(b), "\n"), GuestFeatureRootDisk)
}

// CachedTemplates is the template table the build scripts left in the cache
// (guestDir: GuestCacheDir() when empty; templateDir: TemplateCacheDir() when
// empty): TemplateBusybox is the newest guest build, and each template.sh
// build <templateDir>/<name>/<hash> (newest complete one per name: rootfs.img,
// disk.qcow2 and manifest) is name, booting the newest guest build that can
// switch into a root disk (GuestFeatureRootDisk) with its disk.qcow2.
// Without a guest build there is nothing to boot: the table is empty.
func CachedTemplates(guestDir, templateDir string) map[string]Guest {
	if guestDir == "" {
		guestDir = GuestCacheDir()
	}
	table := map[string]Guest{}
	if g, ok := CachedGuest(guestDir); ok {
		table[TemplateBusybox] = g
	}
	g, ok := newestGuest(guestDir, switchesRoot)
	if !ok {
		return table
	}
	if templateDir == "" {
		templateDir = TemplateCacheDir()
	}
	ents, _ := os.ReadDir(templateDir)
	for _, e := range ents {
		if !e.IsDir() || e.Name()[0] == '.' || e.Name() == TemplateBusybox {
			continue
		}
		dir, ok := newestBuild(filepath.Join(templateDir, e.Name()), nil, "rootfs.img", "disk.qcow2", "manifest")
		if !ok {
			continue
		}
		t := g
		t.Dir, t.Disk = dir, filepath.Join(dir, "disk.qcow2")
		table[e.Name()] = t
	}
	return table
}

// newestBuild returns the subdirectory of cacheDir that holds every one of
// files as a non-empty regular file and that accept (nil: any) takes, newest
// by the modification time of the last of files (written last by the build
// scripts). Their work dirs (hidden) never count.
func newestBuild(cacheDir string, accept func(dir string) bool, files ...string) (string, bool) {
	ents, err := os.ReadDir(cacheDir)
	if err != nil {
		return "", false
	}
	var best string
	var bestT time.Time
	for _, e := range ents {
		if !e.IsDir() || e.Name()[0] == '.' {
			continue
		}
		dir := filepath.Join(cacheDir, e.Name())
		var mt time.Time
		ok := true
		for _, f := range files {
			st, err := os.Stat(filepath.Join(dir, f))
			if err != nil || !st.Mode().IsRegular() || st.Size() == 0 {
				ok = false
				break
			}
			mt = st.ModTime()
		}
		if ok && (best == "" || mt.After(bestT)) && (accept == nil || accept(dir)) {
			best, bestT = dir, mt
		}
	}
	return best, best != ""
}

// qcow2Backing returns the backing file named in the header of the qcow2
// image at path ("" when it has none). A VM's disk is an overlay whose
// backing file, the template's rootfs.img, lives outside the run dir and the
// store; a snapshot is only usable while it exists.
func qcow2Backing(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	// Header: magic, version, backing_file_offset (u64), backing_file_size (u32), big-endian.
	var h [20]byte
	if _, err := io.ReadFull(f, h[:]); err != nil {
		return "", fmt.Errorf("%s: qcow2 header: %w", path, err)
	}
	if string(h[:4]) != "QFI\xfb" {
		return "", fmt.Errorf("%s is not a qcow2 image", path)
	}
	off, n := binary.BigEndian.Uint64(h[8:16]), binary.BigEndian.Uint32(h[16:20])
	if off == 0 {
		return "", nil
	}
	if n == 0 || n > 1023 {
		return "", fmt.Errorf("%s: qcow2 backing file name of %d bytes", path, n)
	}
	name := make([]byte, n)
	if _, err := f.ReadAt(name, int64(off)); err != nil {
		return "", fmt.Errorf("%s: qcow2 backing file name: %w", path, err)
	}
	return string(name), nil
}
