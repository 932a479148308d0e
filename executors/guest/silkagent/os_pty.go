package silkagent

import (
	"io"
	"os"

	"github.com/creack/pty"
	"golang.org/x/sys/unix"

	"github.com/sbxlog/sbxlog/executors/guest/silkd"
)

// shellPath is the guest's shell: bash where the guest has it, else sh
// (a busybox guest).
func shellPath() string {
	if p, err := lookPath("bash", DefaultPath); err == nil {
		return p
	}
	return "sh"
}

// SpawnPty implements PtySpawner: the guest's shell, interactive, as the
// session leader of a new terminal, which is its controlling terminal.
// TERM is the request's, else the agent's, else xterm.
func (OSProcs) SpawnPty(req *silkd.PtyOpen) (Pty, error) {
	env := req.Env
	if _, ok := env["TERM"]; !ok && os.Getenv("TERM") == "" {
		env = map[string]string{"TERM": "xterm"}
		for k, v := range req.Env {
			env[k] = v
		}
	}
	argv := []string{shellPath(), "-i"}
	cmd, err := command(silkd.OpPtyOpen, argv, req.Cwd, env, req.User)
	if err != nil {
		return nil, err
	}
	master, tty, err := openPty()
	if err != nil {
		return nil, err
	}
	if err := setWinsize(master, req.Cols, req.Rows); err != nil {
		master.Close()
		tty.Close()
		return nil, err
	}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = tty, tty, tty
	cmd.SysProcAttr.Setsid = true
	cmd.SysProcAttr.Setctty = true // fd 0 of the child
	err = cmd.Start()
	tty.Close()
	if err != nil {
		master.Close()
		return nil, spawnError(err)
	}
	return &osPty{osChild: osChild{cmd}, master: master, argv: argv}, nil
}

type osPty struct {
	osChild
	master *os.File
	argv   []string
}

func (p *osPty) Argv() []string        { return p.argv }
func (p *osPty) Stdin() io.WriteCloser { return ptyInput{p.master} }
func (p *osPty) Stdout() io.Reader     { return p.master }
func (p *osPty) Stderr() io.Reader     { return eofReader{} }
func (p *osPty) CloseOutput()          { p.master.Close() }

func (p *osPty) Resize(cols, rows uint16) error { return setWinsize(p.master, cols, rows) }

// openPty opens a terminal pair whose master is in the runtime's poller,
// so that closing it ends a blocked Read or Write (pty.Open's master went
// through File.Fd, which leaves a file blocking).
func openPty() (master, tty *os.File, err error) {
	m, tty, err := pty.Open()
	if err != nil {
		return nil, nil, err
	}
	defer m.Close()
	fd, err := unix.Dup(int(m.Fd()))
	if err == nil {
		unix.CloseOnExec(fd)
		err = unix.SetNonblock(fd, true)
	}
	if err != nil {
		tty.Close()
		return nil, nil, err
	}
	return os.NewFile(uintptr(fd), m.Name()), tty, nil
}

// setWinsize sets a terminal's size without File.Fd (see openPty).
func setWinsize(f *os.File, cols, rows uint16) error {
	sc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var ierr error
	if err := sc.Control(func(fd uintptr) {
		ierr = unix.IoctlSetWinsize(int(fd), unix.TIOCSWINSZ, &unix.Winsize{Col: cols, Row: rows})
	}); err != nil {
		return err
	}
	return ierr
}

// ptyInput is a terminal's input: Close is not an EOF (the terminal stays).
type ptyInput struct{ f *os.File }

func (i ptyInput) Write(p []byte) (int, error) { return i.f.Write(p) }
func (ptyInput) Close() error                  { return nil }

type eofReader struct{}

func (eofReader) Read([]byte) (int, error) { return 0, io.EOF }
