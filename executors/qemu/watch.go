package qemu

import (
	"errors"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/sbxlog/sbxlog/executors/layout"
)

// Exit reports a VM's QEMU that exited without this driver stopping it: the
// VM died on its own (a guest panic, which -no-reboot turns into an exit, an
// OOM kill, someone's kill -9).
type Exit struct {
	// VM is the VM id (the run dir's name).
	VM string
	// RunDir is the absolute run dir.
	RunDir string
	Pid    int
}

// watcher is one watched QEMU; closing stop ends the watch.
type watcher struct {
	pid  int
	stop *os.File
}

// OnExit sets fn to be told of every VM whose QEMU (started or adopted by a
// Clone, Wake, Restart or AdoptVM of this driver) exits while the driver
// watches it and is not stopping it itself (Hibernate, Destroy). Golden
// build VMs are not reported. fn runs on the watcher's goroutine and may
// block. Set it before the first recipe; exits before that are not reported.
func (d *Driver) OnExit(fn func(Exit)) {
	d.wmu.Lock()
	defer d.wmu.Unlock()
	d.onExit = fn
}

// isVMRunDir reports whether runDir is a VM's run dir of this instance (not
// a golden build's or a KVM probe's).
func (d *Driver) isVMRunDir(runDir string) bool {
	name := filepath.Base(runDir)
	return filepath.Dir(runDir) == filepath.Join(d.roots.Runs, d.instance) &&
		!strings.HasPrefix(name, layout.GoldenRunPrefix) && !strings.HasPrefix(name, ".")
}

// watch starts watching pid, the QEMU now serving runDir, through a pidfd
// (children and adopted processes alike). The caller got pid from a recipe or
// Adopt, both of which checked its cmdline.
func (d *Driver) watch(runDir string, pid int) {
	if pid <= 0 || !d.isVMRunDir(runDir) {
		return
	}
	d.wmu.Lock()
	defer d.wmu.Unlock()
	if w := d.watched[runDir]; w != nil {
		if w.pid == pid {
			return
		}
		w.stop.Close()
		delete(d.watched, runDir)
	}
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		// ESRCH: it exited already; the next operation on the VM finds out.
		d.log.Warn().Err(err).Int("pid", pid).Str("run_dir", runDir).Msg("cannot watch a QEMU for exit")
		return
	}
	r, w, err := os.Pipe()
	if err != nil {
		unix.Close(pidfd)
		d.log.Warn().Err(err).Str("run_dir", runDir).Msg("cannot watch a QEMU for exit")
		return
	}
	wt := &watcher{pid: pid, stop: w}
	if d.watched == nil {
		d.watched = map[string]*watcher{}
	}
	d.watched[runDir] = wt
	go d.wait(runDir, wt, pidfd, r)
}

// wait blocks until the process behind pidfd exits (reported, unless the
// watch was ended meanwhile) or the watch ends (r sees its writer closed).
func (d *Driver) wait(runDir string, wt *watcher, pidfd int, r *os.File) {
	defer unix.Close(pidfd)
	defer r.Close()
	fds := []unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}, {Fd: int32(r.Fd()), Events: unix.POLLIN}}
	for {
		_, err := unix.Poll(fds, -1)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil || fds[1].Revents != 0 {
			return
		}
		if fds[0].Revents != 0 {
			break
		}
	}
	d.wmu.Lock()
	current := d.watched[runDir] == wt
	if current {
		delete(d.watched, runDir)
		wt.stop.Close()
	}
	fn := d.onExit
	d.wmu.Unlock()
	if !current || fn == nil {
		return
	}
	d.log.Warn().Str("run_dir", runDir).Int("pid", wt.pid).Msg("QEMU exited on its own")
	fn(Exit{VM: filepath.Base(runDir), RunDir: runDir, Pid: wt.pid})
}

// unwatch ends the watch of runDir's QEMU: the driver is about to stop it, or
// lets it go.
func (d *Driver) unwatch(runDir string) {
	d.wmu.Lock()
	defer d.wmu.Unlock()
	if w := d.watched[runDir]; w != nil {
		w.stop.Close()
		delete(d.watched, runDir)
	}
}

// unwatchAll ends every watch (Close: the VMs outlive the daemon).
func (d *Driver) unwatchAll() {
	d.wmu.Lock()
	defer d.wmu.Unlock()
	for k, w := range d.watched {
		w.stop.Close()
		delete(d.watched, k)
	}
}
