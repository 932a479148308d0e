package chdriver

import (
	"fmt"

	"github.com/sbxlog/sbxlog/executors/vmm"
)

// VMMPid returns the pid of the VMM serving VM vm in run dir rel (relative
// to the runs root, as the state records it): the one the driver launched
// or adopted, else the one the run dir's pid file names, checked to be this
// VM's. No VMM is an error wrapping vmm.ErrNoProcess. It only reads: a VMM
// found by its pid file is neither adopted nor watched.
func (d *Driver) VMMPid(vm, rel string) (int, error) {
	runDir, err := d.roots.VMRunDir(d.instance, vm, rel)
	if err != nil {
		return 0, err
	}
	d.mu.Lock()
	p := d.procs[runDir]
	d.mu.Unlock()
	if p != nil && p.Alive() {
		return p.Pid(), nil
	}
	pid, err := vmm.Pid(d.vmmConfig(runDir, vm))
	if err != nil {
		return 0, fmt.Errorf("chdriver: VM %s: %w", vm, err)
	}
	return pid, nil
}
