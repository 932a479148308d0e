// Package procstat reads a process's resource usage from Linux's /proc: the
// resident set (statm's second field, in pages) and the CPU time it used
// (stat's utime and stime, in clock ticks). Drivers use it to report what a
// VM's VMM process costs the host, the only usage signal available without
// a guest agent. Read never signals or changes the process.
package procstat

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// ErrNoProcess is returned (wrapped) when no process has the pid.
var ErrNoProcess = errors.New("procstat: no such process")

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat's CPU times. Linux
// fixes it at 100 on every architecture Go supports, whatever the kernel's
// internal HZ: the kernel converts before it reports.
const clockTicks = 100

// Usage is one process's resource usage at the moment it was read.
type Usage struct {
	Pid int
	// RSSBytes is the resident set: pages in RAM times the page size.
	RSSBytes int64
	// CPUSeconds is the user plus system CPU time the process used.
	CPUSeconds float64
}

// Read returns pid's usage. A pid with no process is ErrNoProcess; a
// /proc file it cannot parse is another error.
func Read(pid int) (Usage, error) {
	if pid <= 0 {
		return Usage{}, fmt.Errorf("%w: pid %d", ErrNoProcess, pid)
	}
	dir := filepath.Join("/proc", strconv.Itoa(pid))
	statm, err := os.ReadFile(filepath.Join(dir, "statm"))
	if err != nil {
		return Usage{}, notFound(pid, err)
	}
	stat, err := os.ReadFile(filepath.Join(dir, "stat"))
	if err != nil {
		return Usage{}, notFound(pid, err)
	}
	u := Usage{Pid: pid}
	if u.RSSBytes, err = residentBytes(statm); err != nil {
		return Usage{}, fmt.Errorf("procstat: pid %d statm: %w", pid, err)
	}
	if u.CPUSeconds, err = cpuSeconds(stat); err != nil {
		return Usage{}, fmt.Errorf("procstat: pid %d stat: %w", pid, err)
	}
	return u, nil
}

func notFound(pid int, err error) error {
	if errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("%w: pid %d", ErrNoProcess, pid)
	}
	return fmt.Errorf("procstat: pid %d: %w", pid, err)
}

// residentBytes parses statm ("size resident shared text lib data dt", in
// pages).
func residentBytes(statm []byte) (int64, error) {
	f := strings.Fields(string(statm))
	if len(f) < 2 {
		return 0, fmt.Errorf("%d fields, want at least 2", len(f))
	}
	pages, err := strconv.ParseInt(f[1], 10, 64)
	if err != nil || pages < 0 {
		return 0, fmt.Errorf("resident %q is not a page count", f[1])
	}
	return pages * int64(os.Getpagesize()), nil
}

// cpuSeconds parses stat's utime and stime (fields 14 and 15). The second
// field, the command name in parentheses, may itself hold spaces and
// parentheses, so fields are counted from the last ')'.
func cpuSeconds(stat []byte) (float64, error) {
	s := string(stat)
	end := strings.LastIndexByte(s, ')')
	if end < 0 {
		return 0, errors.New("no command name")
	}
	// After ") ": field 3 (state) onwards; utime is field 14, stime 15.
	f := strings.Fields(s[end+1:])
	const utime, stime = 14 - 3, 15 - 3
	if len(f) <= stime {
		return 0, fmt.Errorf("%d fields after the command name, want at least %d", len(f), stime+1)
	}
	var ticks uint64
	for _, i := range []int{utime, stime} {
		n, err := strconv.ParseUint(f[i], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("field %d %q is not a tick count", i+3, f[i])
		}
		ticks += n
	}
	return float64(ticks) / clockTicks, nil
}
