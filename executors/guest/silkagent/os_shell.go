package silkagent

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/sbxlog/sbxlog/executors/guest/silkd"
)

// InterruptGrace is how long an interrupted session command has to end
// (its processes are killed) before its shell is given up and closed (a
// builtin loop cannot be killed without it).
const InterruptGrace = 2 * time.Second

// maxStatusLine bounds what is read after a command's marker looking for
// the end of its status line (a background writer may flood without a
// newline).
const maxStatusLine = 64 << 10

// StartShell implements ShellSpawner: bash where the guest has it, else
// sh, reading commands from a pipe, in a process group of its own (so
// Close kills what it started too), stdout and stderr on one pipe.
func (OSProcs) StartShell(cwd string, env map[string]string) (Shell, error) {
	cmd, err := command(silkd.OpSessionCreate, []string{shellPath()}, cwd, env, "")
	if err != nil {
		return nil, err
	}
	inR, inW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		inR.Close()
		inW.Close()
		return nil, err
	}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = inR, outW, outW
	cmd.SysProcAttr.Setpgid = true
	err = cmd.Start()
	inR.Close()
	outW.Close()
	if err != nil {
		inW.Close()
		outR.Close()
		return nil, spawnError(err)
	}
	sh := &osShell{cmd: cmd, in: inW, out: outR, exited: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(sh.exited)
	}()
	return sh, nil
}

type osShell struct {
	cmd       *exec.Cmd
	in, out   *os.File
	exited    chan struct{}
	rest      []byte // read past the last status line: output of a background job
	closeOnce sync.Once
}

// Run implements Shell. The command line is followed by a printf of a
// marker with a random nonce and the command's status: its output is what
// comes before the marker. The command runs in a { } group, so it acts on
// the shell, with its stdin from /dev/null, so it cannot read the marker's
// printf.
func (sh *osShell) Run(argv []string, out func([]byte), interrupt <-chan struct{}) (int32, error) {
	nonce := make([]byte, 16)
	if _, err := rand.Read(nonce); err != nil {
		return 0, err
	}
	marker := "__SBX_" + hex.EncodeToString(nonce) + "__"
	script := "{ " + silkd.ShellLine(argv) + "\n} </dev/null\nprintf '%s %d\\n' " + marker + " \"$?\"\n"
	if _, err := sh.in.Write([]byte(script)); err != nil {
		return 0, errors.New("the shell is gone")
	}

	done := make(chan struct{})
	defer close(done)
	go func() {
		select {
		case <-interrupt:
		case <-done:
			return
		}
		// Again and again: the command may not have started yet.
		grace := time.NewTimer(InterruptGrace)
		defer grace.Stop()
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			sh.killCommands()
			select {
			case <-grace.C:
				sh.Close()
				return
			case <-done:
				return
			case <-tick.C:
			}
		}
	}()

	m := []byte(marker)
	acc := sh.rest
	sh.rest = nil
	buf := make([]byte, 32<<10)
	for {
		if i := bytes.Index(acc, m); i >= 0 {
			out(acc[:i])
			line := acc[i+len(m):]
			for bytes.IndexByte(line, '\n') < 0 && len(line) < maxStatusLine {
				n, err := sh.out.Read(buf)
				line = append(line, buf[:n]...)
				if err != nil {
					return 0, errors.New("the shell exited")
				}
			}
			status, after, _ := bytes.Cut(line, []byte{'\n'})
			sh.rest = bytes.Clone(after)
			code, err := strconv.Atoi(strings.TrimSpace(string(status)))
			if err != nil {
				return -1, nil
			}
			return int32(code), nil
		}
		// Send it all but an end that could be the marker's start.
		if keep := partialMarker(acc, m); keep < len(acc) {
			out(acc[:len(acc)-keep])
			acc = append(acc[:0], acc[len(acc)-keep:]...)
		}
		n, err := sh.out.Read(buf)
		acc = append(acc, buf[:n]...)
		if err != nil && n == 0 {
			out(acc)
			select {
			case <-sh.exited:
				return 0, fmt.Errorf("the shell exited (%s)", sh.cmd.ProcessState)
			case <-time.After(time.Second):
				return 0, errors.New("the shell is gone")
			}
		}
	}
}

// partialMarker is the length of the longest end of b that begins m.
func partialMarker(b, m []byte) int {
	for k := min(len(b), len(m)-1); k > 0; k-- {
		if bytes.HasSuffix(b, m[:k]) {
			return k
		}
	}
	return 0
}

// killCommands kills the processes of the shell's group but the shell:
// the command it runs (and any job it left in the background).
func (sh *osShell) killCommands() {
	pgid := sh.cmd.Process.Pid
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == pgid {
			continue
		}
		if g, err := syscall.Getpgid(pid); err == nil && g == pgid {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// Close implements Shell.
func (sh *osShell) Close() {
	sh.closeOnce.Do(func() {
		_ = syscall.Kill(-sh.cmd.Process.Pid, syscall.SIGKILL)
		sh.in.Close()
		sh.out.Close()
	})
}
