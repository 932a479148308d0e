package chsim

import (
	"net/http"
	"os"
	"strconv"

	"github.com/sbxlog/sbxlog/executors/ch"
	"golang.org/x/sys/unix"
)

// devices are the host-side resources a booted VM holds, opened the way CH
// opens them so that misconfigured paths fail the same way: disk images
// opened and locked (OFD locks, as CH does), the vsock socket bound, the
// serial and console files created.
type devices struct {
	disks   map[string]*os.File
	vsock   *vsockServer
	console []*os.File
}

func (s *Server) openDevices(cfg *ch.VmConfig, action string) (*devices, *apiError) {
	d := &devices{disks: map[string]*os.File{}}
	fail := func(causes ...string) (*devices, *apiError) {
		d.close()
		return nil, vmmErr(http.StatusInternalServerError, action, causes...)
	}
	for i, path := range cfg.DiskPaths() {
		idx := strconv.Itoa(i)
		ro := false
		if v, _ := cfg.Get("disks", idx, "readonly"); v == true {
			ro = true
		}
		if path == "" {
			return fail("Error from device manager", "Disk path missing")
		}
		f, causes := openDisk(path, ro)
		if causes != nil {
			return fail(causes...)
		}
		id, _ := cfg.Get("disks", idx, "id")
		ids, _ := id.(string)
		if ids == "" {
			ids = "_disk" + idx
		}
		d.disks[ids] = f
	}
	if sock := cfg.VsockSocket(); sock != "" {
		v, err := s.listenVsock(sock)
		if err != nil {
			return fail("Error from device manager", "Cannot create virtio-vsock device", osErrText(err))
		}
		d.vsock = v
	}
	for _, dev := range []string{"serial", "console"} {
		mode, _ := cfg.Get(dev, "mode")
		file, _ := cfg.Get(dev, "file")
		if mode != "File" {
			continue
		}
		p, _ := file.(string)
		if p == "" {
			return fail("Error creating console devices", "No file path given for "+dev)
		}
		f, err := os.Create(p)
		if err != nil {
			return fail("Error creating console devices", osErrText(err))
		}
		d.console = append(d.console, f)
	}
	return d, nil
}

func (d *devices) writeConsole(line string) {
	for _, f := range d.console {
		_, _ = f.WriteString(line)
	}
}

func (d *devices) closeDisk(id string) {
	if f, ok := d.disks[id]; ok {
		f.Close()
		delete(d.disks, id)
	}
}

func (d *devices) close() {
	for id := range d.disks {
		d.closeDisk(id)
	}
	if d.vsock != nil {
		d.vsock.close()
		d.vsock = nil
	}
	for _, f := range d.console {
		f.Close()
	}
	d.console = nil
}

// openDisk opens a disk image as CH does: read-only with a shared lock, or
// read-write with an exclusive one (an OFD lock, which another process
// holding the image conflicts with). The causes name a failure in CH's
// words.
func openDisk(path string, ro bool) (*os.File, []string) {
	flag, lockType := os.O_RDWR, int16(unix.F_WRLCK)
	if ro {
		flag, lockType = os.O_RDONLY, unix.F_RDLCK
	}
	f, err := os.OpenFile(path, flag, 0)
	if err != nil {
		return nil, []string{"Error from device manager", "Cannot open disk path", osErrText(err)}
	}
	lk := unix.Flock_t{Type: lockType, Whence: 0, Start: 0, Len: 0}
	if err := unix.FcntlFlock(f.Fd(), unix.F_OFD_SETLK, &lk); err != nil {
		f.Close()
		return nil, []string{"Error locking disk images: Another instance likely holds a lock", osErrText(err)}
	}
	return f, nil
}
