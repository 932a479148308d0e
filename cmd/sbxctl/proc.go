package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sbxlog/sbxlog/executors/guest/silkd"
	"github.com/sbxlog/sbxlog/projections/apiclient"
)

// The commands on a sandbox's processes and shell sessions (the agent's
// ps, logs, attach and session ops), and exec's terminal (-t: pty_open).
// Like exec, they need the sandbox's own token.

func init() {
	register("ps", command{summary: "list the processes a sandbox's agent started (execs, detached ones, terminals)", examples: `sbxctl ps sb_0123456789abcdef`, run: remoteCommand(remoteSpec{
		name: "ps", args: []string{"ID"}, flags: psFlags})})
	register("logs", command{summary: "print a process's kept output (-f: then follow it to its exit)", examples: `sbxctl logs sb_0123456789abcdef 42              # what pid 42 printed
sbxctl logs -f sb_0123456789abcdef 42`, run: remoteCommand(remoteSpec{
		name: "logs", args: []string{"ID", "PID"}, stream: true, flags: logsFlags})})
	register("sessions", command{summary: "list a sandbox's shell sessions (--new starts one, --rm SID ends one)", examples: `sbxctl sessions --new sb_0123456789abcdef        # prints the new session's id
sbxctl exec --session s1 sb_0123456789abcdef -- cd /tmp`, run: remoteCommand(remoteSpec{
		name: "sessions", args: []string{"ID"}, flags: sessionsFlags})})
}

// sandboxAgent opens a connection to sandbox id's agent with the token
// sandbox picks.
func sandboxAgent(ctx context.Context, c *apiclient.Client, sandbox func(*apiclient.Client) (*apiclient.Client, error), id string) (*silkd.Conn, error) {
	sc, err := sandbox(c)
	if err != nil {
		return nil, err
	}
	return agentConn(ctx, sc, id)
}

// agentConn opens a connection to sandbox id's agent with sc's token.
func agentConn(ctx context.Context, sc *apiclient.Client, id string) (*silkd.Conn, error) {
	nc, err := sc.DialAgent(ctx, id)
	if err != nil {
		return nil, err
	}
	return silkd.NewConn(nc), nil
}

func psFlags(fs *flag.FlagSet) remoteBody {
	sandbox := sandboxTokenFlag(fs)
	return func(ctx context.Context, c *apiclient.Client, cl *call) error {
		conn, err := sandboxAgent(ctx, c, sandbox, cl.args[0])
		if err != nil {
			return err
		}
		defer conn.Close()
		procs, err := conn.Ps(ctx)
		if err != nil {
			return err
		}
		return printTable(cl, procs, "PID\tSTATE\tEXIT\tDETACHED\tSTARTED\tCOMMAND", func(tw io.Writer) {
			for _, p := range procs {
				exit := "-"
				if p.ExitCode != nil {
					exit = strconv.Itoa(int(*p.ExitCode))
				}
				started := time.Unix(int64(p.StartedAtEpochSecs), 0).UTC().Format(time.RFC3339)
				fmt.Fprintf(tw, "%d\t%s\t%s\t%t\t%s\t%s\n", p.Pid, p.State, exit, p.Detached, started, strings.Join(p.Argv, " "))
			}
		})
	}
}

func logsFlags(fs *flag.FlagSet) remoteBody {
	follow := fs.Bool("f", false, "follow the output until the process exits, then exit with its code")
	sandbox := sandboxTokenFlag(fs)
	return func(ctx context.Context, c *apiclient.Client, cl *call) error {
		pid, err := strconv.ParseUint(cl.args[1], 10, 32)
		if err != nil {
			return usagef("PID %q: want a process id (sbxctl ps lists them)", cl.args[1])
		}
		conn, err := sandboxAgent(ctx, c, sandbox, cl.args[0])
		if err != nil {
			return err
		}
		defer conn.Close()
		if !*follow {
			_, err := conn.Logs(ctx, uint32(pid), cl.stdout, cl.stderr)
			return err
		}
		res, err := conn.Attach(ctx, uint32(pid), cl.stdout, cl.stderr)
		if err != nil || !res.Exited {
			return err
		}
		return exitOf(res.Code, cl.stderr)
	}
}

// exitOf is sbxctl's exit for a guest command's code: the code, or 255
// with a word when a signal ended it.
func exitOf(code int32, stderr io.Writer) error {
	if code < 0 {
		fmt.Fprintf(stderr, "sbxctl: the command was killed\n")
		return exitCode(255)
	}
	return exitCode(code & 0xff)
}

func sessionsFlags(fs *flag.FlagSet) remoteBody {
	create := fs.Bool("new", false, "start a session and print its id")
	sid := fs.String("id", "", "with --new: the session's id (default: one the agent picks)")
	cwd := fs.String("cwd", "", "with --new: the shell's working directory")
	var env kvFlag
	fs.Var(&env, "env", "with --new: environment variable key=value (repeatable)")
	rm := fs.String("rm", "", "end session SID (its shell and what it runs are killed)")
	sandbox := sandboxTokenFlag(fs)
	return func(ctx context.Context, c *apiclient.Client, cl *call) error {
		if *create && *rm != "" {
			return usagef("--new and --rm exclude each other")
		}
		conn, err := sandboxAgent(ctx, c, sandbox, cl.args[0])
		if err != nil {
			return err
		}
		defer conn.Close()
		switch {
		case *create:
			id, err := conn.CreateSession(ctx, silkd.SessionCreate{ID: *sid, Cwd: *cwd, Env: env.m})
			if err != nil {
				return err
			}
			fmt.Fprintln(cl.stdout, id)
			return nil
		case *rm != "":
			return conn.RemoveSession(ctx, *rm)
		}
		ids, err := conn.Sessions(ctx)
		if err != nil {
			return err
		}
		if cl.json {
			return printJSON(cl.stdout, ids)
		}
		for _, id := range ids {
			fmt.Fprintln(cl.stdout, id)
		}
		return nil
	}
}

// execTerminal runs argv on a terminal of sandbox id (req's cwd and env), like docker exec
// -it: the guest's shell on a pty (pty_open) replaced by argv (typed as
// an exec, so the terminal shows that line), the local terminal raw while
// it runs and its size passed on at each SIGWINCH. It exits with the
// command's code.
func execTerminal(ctx context.Context, sc *apiclient.Client, id string, req silkd.PtyOpen, argv []string, cl *call) error {
	cols, rows := uint16(80), uint16(24)
	in, isTerm := stdin.(*os.File)
	isTerm = isTerm && isTerminal(int(in.Fd()))
	if isTerm {
		if ws, err := unix.IoctlGetWinsize(int(in.Fd()), unix.TIOCGWINSZ); err == nil && ws.Col > 0 {
			cols, rows = ws.Col, ws.Row
		}
	}
	conn, err := agentConn(ctx, sc, id)
	if err != nil {
		return err
	}
	defer conn.Close()
	req.Cols, req.Rows = cols, rows
	if term := os.Getenv("TERM"); term != "" && req.Env["TERM"] == "" {
		req.Env = maps.Clone(req.Env)
		if req.Env == nil {
			req.Env = map[string]string{}
		}
		req.Env["TERM"] = term
	}
	p, err := conn.OpenPty(ctx, req)
	if err != nil {
		return err
	}
	defer p.Close()
	if isTerm {
		restore, err := makeRaw(int(in.Fd()))
		if err != nil {
			return err
		}
		defer restore()
		winch := make(chan os.Signal, 1)
		signal.Notify(winch, syscall.SIGWINCH)
		defer signal.Stop(winch)
		go passResizes(ctx, sc, id, p.Pid, int(in.Fd()), winch)
	}
	if _, err := p.Write([]byte("exec " + silkd.ShellLine(argv) + "\n")); err != nil {
		return err
	}
	// The terminal outlives its input's end; the copy takes the reader now,
	// as it may outlive this command too.
	src := stdin
	go func() { _, _ = io.Copy(p, src) }()
	if _, err := io.Copy(cl.stdout, p); err != nil {
		return err
	}
	return exitOf(p.ExitCode(), cl.stderr)
}

// passResizes sends the local terminal's size to the guest's at each
// SIGWINCH, over a connection of its own (the terminal's is busy).
func passResizes(ctx context.Context, sc *apiclient.Client, id string, pid uint32, fd int, winch <-chan os.Signal) {
	var conn *silkd.Conn
	defer func() {
		if conn != nil {
			conn.Close()
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return
		case <-winch:
		}
		ws, err := unix.IoctlGetWinsize(fd, unix.TIOCGWINSZ)
		if err != nil {
			continue
		}
		if conn == nil {
			if conn, err = agentConn(ctx, sc, id); err != nil {
				conn = nil
				continue
			}
		}
		if err := conn.ResizePty(ctx, pid, ws.Col, ws.Row); err != nil {
			conn.Close()
			conn = nil
		}
	}
}

func isTerminal(fd int) bool {
	_, err := unix.IoctlGetTermios(fd, unix.TCGETS)
	return err == nil
}

// makeRaw puts the local terminal in raw mode (keys, Ctrl-C included, go
// to the guest's terminal) and returns what restores it.
func makeRaw(fd int) (func(), error) {
	old, err := unix.IoctlGetTermios(fd, unix.TCGETS)
	if err != nil {
		return nil, err
	}
	t := *old
	t.Iflag &^= unix.IGNBRK | unix.BRKINT | unix.PARMRK | unix.ISTRIP | unix.INLCR | unix.IGNCR | unix.ICRNL | unix.IXON
	t.Oflag &^= unix.OPOST
	t.Lflag &^= unix.ECHO | unix.ECHONL | unix.ICANON | unix.ISIG | unix.IEXTEN
	t.Cflag &^= unix.CSIZE | unix.PARENB
	t.Cflag |= unix.CS8
	t.Cc[unix.VMIN], t.Cc[unix.VTIME] = 1, 0
	if err := unix.IoctlSetTermios(fd, unix.TCSETS, &t); err != nil {
		return nil, err
	}
	return func() { _ = unix.IoctlSetTermios(fd, unix.TCSETS, old) }, nil
}
