package vmm

// Pid returns the pid of the VMM that serves cfg.RunDir, read from its pid
// file and trusted only if the process's command line names cfg.Binary and
// this run dir's socket (a reused pid is ErrNotOurs). No pid file, or a
// process that exited, is ErrNoProcess. Unlike Adopt it opens nothing and
// pings nothing: it is for reading a VMM's usage, not for taking it over.
func Pid(cfg Config) (int, error) {
	if err := cfg.validate(); err != nil {
		return 0, err
	}
	pid, err := readPid(cfg.RunDir)
	if err != nil {
		return 0, err
	}
	if err := checkOurs(pid, cfg.Binary, cfg.SocketPath()); err != nil {
		return 0, err
	}
	return pid, nil
}
