package qemu

import (
	"os"
	"path/filepath"
	"time"
)

// Guest is a kernel and initrd built by executors/guest/build.sh (`make guest`).
type Guest struct {
	Dir    string
	Kernel string
	Initrd string
}

// GuestCacheDir is where executors/guest/build.sh caches its builds:
// ${SBX_CACHE:-$HOME/.cache/sbxlog}/guest.
func GuestCacheDir() string {
	base := os.Getenv("SBX_CACHE")
	if base == "" {
		home, err := os.UserHomeDir()
		if err != nil || home == "" {
			home = "/root"
		}
		base = filepath.Join(home, ".cache", "sbxlog")
	}
	return filepath.Join(base, "guest")
}

// CachedGuest returns the newest complete build in cacheDir (GuestCacheDir()
// when empty): a <hash> directory holding a non-empty vmlinuz, initrd.img and
// manifest, newest by the manifest's modification time. build.sh names builds
// by the hash of their inputs, so the newest is the one `make guest` made last.
func CachedGuest(cacheDir string) (Guest, bool) {
	if cacheDir == "" {
		cacheDir = GuestCacheDir()
	}
	ents, err := os.ReadDir(cacheDir)
	if err != nil {
		return Guest{}, false
	}
	var best Guest
	var bestT time.Time
	for _, e := range ents {
		if !e.IsDir() || e.Name()[0] == '.' {
			continue // build.sh's work dirs are hidden
		}
		dir := filepath.Join(cacheDir, e.Name())
		g := Guest{Dir: dir, Kernel: filepath.Join(dir, "vmlinuz"), Initrd: filepath.Join(dir, "initrd.img")}
		var mt time.Time
		ok := true
		for _, p := range []string{g.Kernel, g.Initrd, filepath.Join(dir, "manifest")} {
			st, err := os.Stat(p)
			if err != nil || !st.Mode().IsRegular() || st.Size() == 0 {
				ok = false
				break
			}
			mt = st.ModTime()
		}
		if ok && (best.Dir == "" || mt.After(bestT)) {
			best, bestT = g, mt
		}
	}
	return best, best.Dir != ""
}
