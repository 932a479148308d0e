package chdriver

import (
	"path/filepath"
	"strings"

	"github.com/sbxlog/sbxlog/executors/layout"
	"github.com/sbxlog/sbxlog/executors/vmm"
)

// Exit reports a VM's VMM that exited without this driver stopping it: the
// VM died on its own (a crash, an OOM kill, someone's kill -9).
type Exit struct {
	// VM is the VM id (the run dir's name).
	VM string
	// RunDir is the absolute run dir.
	RunDir string
	Pid    int
}

// exitWatch is the driver's bookkeeping of watched VMMs, guarded by
// Driver.mu.
type exitWatch struct {
	fn func(Exit)
	// watched maps each process the driver holds to the channel that
	// ends its watcher (the driver let it go).
	watched map[*vmm.Process]chan struct{}
	// stopping marks processes the driver is terminating itself.
	stopping map[*vmm.Process]bool
}

// OnExit sets fn to be told of every VM whose VMM (launched or adopted by
// this driver) exits while the driver still holds it and is not stopping it
// itself. Golden build VMs are not reported. fn runs on its own goroutine
// and may block. Set it before Prepare's caller adopts VMs; exits before
// that are not reported.
func (d *Driver) OnExit(fn func(Exit)) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.exits.fn = fn
}

// watchLocked starts watching p, the VMM now serving runDir. d.mu held.
func (d *Driver) watchLocked(runDir string, p *vmm.Process) {
	if d.exits.watched == nil {
		d.exits.watched = map[*vmm.Process]chan struct{}{}
		d.exits.stopping = map[*vmm.Process]bool{}
	}
	if _, ok := d.exits.watched[p]; ok {
		return
	}
	done := make(chan struct{})
	d.exits.watched[p] = done
	go func() {
		select {
		case <-p.Exited():
		case <-done:
			return
		}
		d.mu.Lock()
		current := d.procs[runDir] == p
		expected := d.exits.stopping[p]
		fn := d.exits.fn
		delete(d.exits.watched, p)
		delete(d.exits.stopping, p)
		d.mu.Unlock()
		if !current || expected || fn == nil || !d.isVMRunDir(runDir) {
			return
		}
		d.log.Warn().Str("run_dir", runDir).Int("pid", p.Pid()).Msg("VMM exited on its own")
		fn(Exit{VM: filepath.Base(runDir), RunDir: runDir, Pid: p.Pid()})
	}()
}

// unwatchLocked ends p's watcher: the driver no longer holds p. d.mu held.
func (d *Driver) unwatchLocked(p *vmm.Process) {
	if done, ok := d.exits.watched[p]; ok {
		close(done)
		delete(d.exits.watched, p)
		delete(d.exits.stopping, p)
	}
}

// expectExit marks p as being stopped by the driver, so its exit is not
// reported.
func (d *Driver) expectExit(p *vmm.Process) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, ok := d.exits.watched[p]; ok {
		d.exits.stopping[p] = true
	}
}

// isVMRunDir reports whether runDir is a VM's run dir of this instance (not
// a golden build's).
func (d *Driver) isVMRunDir(runDir string) bool {
	return filepath.Dir(runDir) == filepath.Join(d.roots.Runs, d.instance) && !strings.HasPrefix(filepath.Base(runDir), layout.GoldenRunPrefix)
}
