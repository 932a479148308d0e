package qemu

// VMMPid returns the pid of the QEMU serving VM vm in run dir rel (relative
// to the runs root, as the state records it), read from the run dir's pid
// file and checked against the process's command line. No QEMU is an error
// wrapping ErrNotRunning. It only reads: unlike Recipes.Adopt it never
// scans /proc for a QEMU without a pid file, nor writes one.
func (d *Driver) VMMPid(vm, rel string) (int, error) {
	runDir, err := d.roots.VMRunDir(d.instance, vm, rel)
	if err != nil {
		return 0, err
	}
	return d.q.pid(runDir)
}
