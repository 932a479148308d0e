package vmm

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"
)

// DefaultSliceName is the slice DefaultCgroupSlice puts VM scopes under.
const DefaultSliceName = "sbxlog.slice"

// DefaultCgroupSlice is <cgroup v2 mount>/sbxlog.slice, or "" on a host
// without a cgroup v2 hierarchy. On hybrid hosts the v2 mount is the
// "unified" one.
func DefaultCgroupSlice() string {
	m := cgroup2Mount()
	if m == "" {
		return ""
	}
	return filepath.Join(m, DefaultSliceName)
}

// cgroup2Mount finds the cgroup2 mount point in /proc/self/mountinfo.
func cgroup2Mount() string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// "<id> <parent> <maj:min> <root> <mount point> <options> ... - <fstype> <source> <super options>"
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok {
			continue
		}
		if fs := strings.Fields(post); len(fs) > 0 && fs[0] == "cgroup2" {
			if f := strings.Fields(pre); len(f) >= 5 {
				return f[4]
			}
		}
	}
	return ""
}

// isCgroup2 reports whether dir, or its nearest existing ancestor, is on a
// cgroup v2 filesystem.
func isCgroup2(dir string) bool {
	for d := filepath.Clean(dir); ; d = filepath.Dir(d) {
		var st unix.Statfs_t
		if err := unix.Statfs(d, &st); err == nil {
			return st.Type == unix.CGROUP2_SUPER_MAGIC
		} else if !errors.Is(err, unix.ENOENT) || d == "/" {
			return false
		}
	}
}

// prepareScope creates cfg's scope and opens it for CLONE_INTO_CGROUP. It
// returns fd -1, after logging once per slice, when that is not possible.
func prepareScope(cfg *Config) (scope string, fd int) {
	if cfg.CgroupSlice == "" {
		return "", -1
	}
	if !isCgroup2(cfg.CgroupSlice) {
		logOnce(cfg.Log, "fs:"+cfg.CgroupSlice, "cgroup slice is not on a cgroup v2 filesystem; VMMs run in the daemon's cgroup", nil, cfg.CgroupSlice)
		return "", -1
	}
	scope = filepath.Join(cfg.CgroupSlice, "vm-"+cfg.ID+".scope")
	if err := os.MkdirAll(scope, 0o755); err != nil {
		logOnce(cfg.Log, "mkdir:"+cfg.CgroupSlice, "cgroup tree not writable; VMMs run in the daemon's cgroup", err, cfg.CgroupSlice)
		return "", -1
	}
	fd, err := unix.Open(scope, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		logOnce(cfg.Log, "open:"+cfg.CgroupSlice, "cgroup scope cannot be opened; VMMs run in the daemon's cgroup", err, cfg.CgroupSlice)
		_ = unix.Rmdir(scope)
		return "", -1
	}
	return scope, fd
}

// scopeOf is the scope directory of an adopted process, if it runs in the
// one cfg would have given it.
func scopeOf(pid int, cfg Config) string {
	if cfg.CgroupSlice == "" {
		return ""
	}
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return ""
	}
	for _, l := range strings.Split(string(data), "\n") {
		if rel, ok := strings.CutPrefix(l, "0::"); ok {
			want := filepath.Join(cfg.CgroupSlice, "vm-"+cfg.ID+".scope")
			if m := cgroup2Mount(); m != "" && filepath.Join(m, rel) == want {
				return want
			}
		}
	}
	return ""
}

// removeScope removes an emptied scope; the kernel may take a moment to
// notice the last process left.
func removeScope(dir string) {
	deadline := time.Now().Add(2 * time.Second)
	for {
		err := unix.Rmdir(dir)
		if err == nil || errors.Is(err, unix.ENOENT) || !errors.Is(err, unix.EBUSY) || time.Now().After(deadline) {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

var logged sync.Map

// logOnce logs a warning the first time key is seen in this process.
func logOnce(log zerolog.Logger, key, msg string, err error, slice string) {
	if _, seen := logged.LoadOrStore(key, true); seen {
		return
	}
	ev := log.Warn().Str("cgroup_slice", slice)
	if err != nil {
		ev = ev.Err(err)
	}
	ev.Msg(msg)
}
