package main

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sbxlog/sbxlog/executors/guest/agent"
)

// How long a mount waits for its hot-plugged disk: the kernel publishes
// the disk in sysfs before devtmpfs makes its node, and an emulated (TCG)
// guest takes its time over both.
const (
	volumeWait = 30 * time.Second
	volumePoll = 20 * time.Millisecond
)

var volumeMu sync.Mutex

// mountVolume mounts the disk whose serial is m.Serial at m.Path.
func mountVolume(m agent.VolumeMount) error {
	volumeMu.Lock()
	defer volumeMu.Unlock()
	dev, err := waitDisk(m.Serial, volumeWait)
	if err != nil {
		return err
	}
	var st unix.Stat_t
	if err := unix.Stat(dev, &st); err != nil {
		return fmt.Errorf("volume %s: %w", m.Serial, err)
	}
	if mounted, err := mountedAt(m.Path); err != nil {
		return err
	} else if mounted != "" {
		if mounted == fmt.Sprintf("%d:%d", unix.Major(st.Rdev), unix.Minor(st.Rdev)) {
			return nil // a re-run: already there
		}
		return fmt.Errorf("volume %s: %s already has another filesystem mounted", m.Serial, m.Path)
	}
	if err := os.MkdirAll(m.Path, 0o755); err != nil {
		return fmt.Errorf("volume %s: %w", m.Serial, err)
	}
	flags := uintptr(unix.MS_NOSUID | unix.MS_NODEV)
	if !m.RW {
		flags |= unix.MS_RDONLY
	}
	var errs []error
	for _, fs := range blockFilesystems() {
		err := unix.Mount(dev, m.Path, fs, flags, "")
		if err == nil {
			return nil
		}
		errs = append(errs, fmt.Errorf("%s: %w", fs, err))
	}
	return fmt.Errorf("volume %s: mount %s at %s: %w", m.Serial, dev, m.Path, errors.Join(errs...))
}

// unmountVolume unmounts m.Path; never lazily, so open files fail it.
func unmountVolume(m agent.VolumeMount) error {
	volumeMu.Lock()
	defer volumeMu.Unlock()
	mounted, err := mountedAt(m.Path)
	if err != nil || mounted == "" {
		return err
	}
	if err := unix.Unmount(m.Path, 0); err != nil {
		return fmt.Errorf("volume %s: unmount %s: %w", m.Serial, m.Path, err)
	}
	return nil
}

// waitDisk returns the /dev node of the disk whose serial is serial, once
// both its sysfs entry and its node exist.
func waitDisk(serial string, wait time.Duration) (string, error) {
	deadline := time.Now().Add(wait)
	for {
		if dev := diskBySerial(serial); dev != "" {
			if _, err := os.Stat(dev); err == nil {
				return dev, nil
			}
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("volume %s: no disk with that serial after %s", serial, wait)
		}
		time.Sleep(volumePoll)
	}
}

func diskBySerial(serial string) string {
	ents, _ := os.ReadDir("/sys/block")
	for _, e := range ents {
		for _, f := range []string{"serial", "device/serial"} {
			b, err := os.ReadFile(filepath.Join("/sys/block", e.Name(), f))
			if err == nil && strings.TrimSpace(string(b)) == serial {
				return "/dev/" + e.Name()
			}
		}
	}
	return ""
}

// mountedAt returns the major:minor of what is mounted at path ("" for
// nothing), from the mount table.
func mountedAt(path string) (string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return "", err
	}
	defer f.Close()
	var dev string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 4 && unescapeMount(fields[4]) == path {
			dev = fields[2] // the last mount on a path is the one seen
		}
	}
	return dev, sc.Err()
}

func unescapeMount(s string) string {
	return strings.NewReplacer(`\040`, " ", `\011`, "\t", `\012`, "\n", `\134`, `\`).Replace(s)
}

// blockFilesystems lists the kernel's filesystems that need a device, ext4
// first (what volumes usually hold).
func blockFilesystems() []string {
	out := []string{"ext4"}
	b, err := os.ReadFile("/proc/filesystems")
	if err != nil {
		return out
	}
	for _, line := range strings.Split(string(b), "\n") {
		if fs := strings.TrimSpace(line); fs != "" && !strings.HasPrefix(line, "nodev") && fs != "ext4" {
			out = append(out, fs)
		}
	}
	return out
}
