package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sbxlog/sbxlog/executors/guest/silkd"
	"github.com/sbxlog/sbxlog/projections/apiclient"
	"github.com/sbxlog/sbxlog/projections/relay"
)

// The commands that reach inside a sandbox: exec, cp and port-forward.
// They go through sandboxd's data plane as the old SDK does (the agent
// relay and the ports route, with their exact upgrade requests), so they
// use the sandbox's own token: --sandbox-token; else --token itself when it
// is a sandbox token (sbt_...); else, holding root, the one root reads with
// GET /v1/sandboxes/{id} (apiclient.WithSandboxLookup), so an operator
// needs no second credential; else $SBX_SANDBOX_TOKEN. A hibernated
// sandbox is woken by the call.

const envSandboxToken = "SBX_SANDBOX_TOKEN"

func init() {
	register("exec", command{summary: "run a command in a sandbox (-- ARGV; streams its output, exits with its code; -i: stdin; -t: on a terminal; --session: in a shell session)", examples: `sbxctl exec sb_0123456789abcdef -- uname -a
sbxctl exec -it sb_0123456789abcdef -- bash      # an interactive shell (-t alone: the same)
echo hi | sbxctl exec -i sb_0123456789abcdef -- cat`, run: remoteCommand(remoteSpec{
		name: "exec", args: []string{"ID"}, rest: "-- COMMAND [ARG...]", stream: true, noJSON: true, flags: execFlags})})
	register("cp", command{summary: "copy a file, or with -r a directory, to or from a sandbox (ID:/path on one side; - is stdin or stdout)", examples: `sbxctl cp ./main.py sb_0123456789abcdef:/tmp/    # into a directory: /tmp/main.py
sbxctl cp -r ./src sb_0123456789abcdef:/work/src
sbxctl cp sb_0123456789abcdef:/etc/os-release -  # to stdout`, run: remoteCommand(remoteSpec{
		name: "cp", args: []string{"SRC", "DST"}, stream: true, noJSON: true, flags: cpFlags})})
	register("port-forward", command{summary: "forward a local port to a sandbox's TCP port ([LOCAL:]PORT)", examples: `sbxctl port-forward sb_0123456789abcdef 8080:8000   # localhost:8080 -> guest port 8000`, run: remoteCommand(remoteSpec{
		name: "port-forward", args: []string{"ID", "[LOCAL:]PORT"}, stream: true, noJSON: true, flags: portForwardFlags})})
}

// sandboxTokenFlag adds --sandbox-token and returns what picks the
// sandbox's token, in the order the file's comment gives.
func sandboxTokenFlag(fs *flag.FlagSet) func(c *apiclient.Client) (*apiclient.Client, error) {
	tok := fs.String("sandbox-token", "", "the sandbox's own token, from its claim (default: the one root reads from sandboxd, else $"+envSandboxToken+")")
	return func(c *apiclient.Client) (*apiclient.Client, error) {
		env := os.Getenv(envSandboxToken)
		switch t := cmp.Or(fs.Lookup("token").Value.String(), os.Getenv(envToken)); {
		case *tok != "":
			return c.WithToken(*tok), nil
		case strings.HasPrefix(t, apiclient.SandboxTokenPrefix):
			return c.WithToken(t), nil
		case c.HasToken():
			return c.WithSandboxLookup(env), nil
		case env != "":
			return c.WithToken(env), nil
		}
		return nil, usagef("the sandbox's own token is needed (the TOKEN its claim printed): --sandbox-token or $%s, or the root token (which reads it)", envSandboxToken)
	}
}

func execFlags(fs *flag.FlagSet) remoteBody {
	interactive := fs.Bool("i", false, "pass standard input to the command")
	tty := fs.Bool("t", false, "run the command on a terminal of the guest (the local one raw, its size followed), as docker exec -it does")
	fs.Var(boolPair{interactive, tty}, "it", "-i and -t at once, as typed for docker exec -it")
	session := fs.String("session", "", "run the command in shell session SID (sbxctl sessions --new): cd and export carry over; eval runs shell text")
	cwd := fs.String("cwd", "", "working directory in the guest")
	var env kvFlag
	fs.Var(&env, "env", "environment variable key=value (repeatable)")
	sandbox := sandboxTokenFlag(fs)
	return func(ctx context.Context, c *apiclient.Client, cl *call) error {
		id, argv := cl.args[0], cl.args[1:]
		if len(argv) == 0 {
			return usagef("no command: sbxctl exec ID -- COMMAND [ARG...]")
		}
		if *tty && *session != "" {
			return usagef("-t and --session exclude each other (a session has no terminal)")
		}
		sc, err := sandbox(c)
		if err != nil {
			return err
		}
		if *tty {
			return execTerminal(ctx, sc, id, silkd.PtyOpen{Cwd: *cwd, Env: env.m}, argv, cl)
		}
		conn, err := sc.DialAgent(ctx, id)
		if err != nil {
			return err
		}
		defer conn.Close()
		sio := silkd.ExecIO{Stdout: cl.stdout, Stderr: cl.stderr}
		if *interactive {
			sio.Stdin = stdin
		}
		var pid uint32
		sio.Started = func(p uint32) { pid = p }
		res, err := silkd.NewConn(conn).Exec(ctx, silkd.Exec{Argv: argv, Cwd: *cwd, Env: env.m, Session: *session}, sio)
		if err != nil {
			if pid != 0 && ctx.Err() != nil {
				// Interrupted: the command must not outlive us.
				killGuest(sc, id, pid)
			}
			if pid == 0 {
				return notStarted(err, argv[0], cl.stderr)
			}
			return err
		}
		return exitOf(res.Code, cl.stderr)
	}
}

// boolPair is one boolean flag that sets two: "-it" is what a docker user
// types (the flag package has no combined short flags).
type boolPair [2]*bool

func (b boolPair) String() string {
	if b[0] == nil {
		return "false"
	}
	return strconv.FormatBool(*b[0] && *b[1])
}

func (b boolPair) Set(s string) error {
	v, err := strconv.ParseBool(s)
	if err != nil {
		return err
	}
	*b[0], *b[1] = v, v
	return nil
}

func (boolPair) IsBoolFlag() bool { return true }

// notStarted maps the agent's refusal to start argv0 (a bad_request before
// any pid) to what a shell answers: 127 for a command that is not there,
// 126 for one that cannot run, with a message of ours rather than the
// wire's ("silkd: bad_request: exec: ... $PATH"). Any other error is
// returned as it is.
func notStarted(err error, argv0 string, stderr io.Writer) error {
	var se *silkd.Error
	if !errors.As(err, &se) || se.Kind != silkd.KindBadRequest {
		return err
	}
	msg := strings.ToLower(se.Message)
	switch {
	case strings.Contains(msg, "cwd"):
		return errors.New(strings.TrimPrefix(se.Message, "exec: "))
	case strings.Contains(msg, "permission denied"), strings.Contains(msg, "exec format error"):
		fmt.Fprintf(stderr, "sbxctl exec: %s: cannot run it in the sandbox (permission denied or not executable)\n", argv0)
		return exitCode(126)
	case strings.Contains(msg, "not found"), strings.Contains(msg, "no such file"), strings.Contains(msg, "runs no commands"):
		fmt.Fprintf(stderr, "sbxctl exec: %s: command not found in the sandbox\n", argv0)
		return exitCode(127)
	}
	return err
}

// killGuest kills pid over a fresh relay, within 5 s.
func killGuest(c *apiclient.Client, id string, pid uint32) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := c.DialAgent(ctx, id)
	if err != nil {
		return
	}
	defer conn.Close()
	_ = silkd.NewConn(conn).Kill(ctx, pid, nil)
}

// guestPath splits "ID:/path"; ok is false for a local path.
func guestPath(arg string) (id, path string, ok bool) {
	id, path, ok = strings.Cut(arg, ":")
	if !ok || !strings.HasPrefix(id, "sb_") || path == "" {
		return "", "", false
	}
	return id, path, true
}

func cpFlags(fs *flag.FlagSet) remoteBody {
	recursive := fs.Bool("r", false, "copy a directory and everything under it")
	quiet := fs.Bool("q", false, "print no summary line")
	mode := fs.String("mode", "", "permission bits of a file copied in (octal; default: the local file's, or the replaced file's)")
	sandbox := sandboxTokenFlag(fs)
	return func(ctx context.Context, c *apiclient.Client, cl *call) error {
		src, dst := cl.args[0], cl.args[1]
		sid, spath, fromGuest := guestPath(src)
		did, dpath, toGuest := guestPath(dst)
		if fromGuest == toGuest {
			return usagef("exactly one of SRC and DST is in a sandbox (ID:/path)")
		}
		sc, err := sandbox(c)
		if err != nil {
			return err
		}
		id := cmp.Or(sid, did)
		nc, err := sc.DialAgent(ctx, id)
		if err != nil {
			return err
		}
		defer nc.Close()
		conn := silkd.NewConn(nc)
		t0 := time.Now()
		var n int64
		var to string
		if toGuest {
			n, to, err = copyIn(ctx, conn, src, dpath, *mode, *recursive)
			to = id + ":" + to
		} else {
			n, to, err = copyOut(ctx, conn, spath, dst, *recursive, cl)
		}
		if err == nil && !*quiet && to != "-" {
			fmt.Fprintf(cl.stderr, "copied %s to %s (%s in %s)\n", src, to, byteCount(n), time.Since(t0).Round(time.Millisecond))
		}
		return err
	}
}

// byteCount renders n bytes for people.
func byteCount(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

// intoDir says whether guest path p names a directory to copy into: it
// ends with "/" or is one.
func intoDir(ctx context.Context, conn *silkd.Conn, p string) bool {
	if strings.HasSuffix(p, "/") {
		return true
	}
	st, err := conn.Stat(ctx, p)
	return err == nil && st.Kind == silkd.FileDir
}

// copyIn copies local src (a file, stdin, or with recursive a directory)
// to guest path p and returns the bytes sent and the guest path written. A
// directory p (or one ending with "/") receives src under its base name,
// as cp does; a directory src otherwise becomes p. A file is written with
// fs_write, atomic in the guest; a directory as a tar stream (fs_push).
func copyIn(ctx context.Context, conn *silkd.Conn, src, p, mode string, recursive bool) (int64, string, error) {
	req := silkd.FsWrite{Path: p}
	if mode != "" {
		m, err := strconv.ParseUint(mode, 8, 32)
		if err != nil || m > 0o7777 {
			return 0, "", usagef("--mode %q: want octal permission bits", mode)
		}
		perm := uint32(m)
		req.Mode = &perm
	}
	if src == "-" {
		cr := &countingReader{r: stdin}
		return cr.n, p, conn.WriteFile(ctx, req, cr)
	}
	st, err := os.Stat(src)
	if err != nil {
		return 0, "", err
	}
	if intoDir(ctx, conn, p) {
		p = strings.TrimSuffix(p, "/") + "/" + filepath.Base(src)
		req.Path = p
	}
	if st.IsDir() {
		if !recursive {
			return 0, "", usagef("%s is a directory: cp -r copies directories", src)
		}
		n, err := pushTree(ctx, conn, src, p)
		return n, p, err
	}
	f, err := os.Open(src)
	if err != nil {
		return 0, "", err
	}
	defer f.Close()
	if req.Mode == nil {
		perm := uint32(st.Mode().Perm())
		req.Mode = &perm
	}
	cr := &countingReader{r: f}
	err = conn.WriteFile(ctx, req, cr)
	return cr.n, p, err
}

// copyTreeOut pulls guest directory p into an existing local directory
// dst under p's base name, or, when dst does not exist, as dst itself:
// the tar names entries by p's base name, so the tree is extracted into a
// temporary directory beside dst and its one entry renamed into place (an
// interrupted copy leaves no half tree under dst's name).
func copyTreeOut(ctx context.Context, conn *silkd.Conn, p, dst string) (int64, string, error) {
	base := path.Base(p)
	if st, err := os.Stat(dst); err == nil && st.IsDir() || base == "/" || base == "." {
		if err := os.MkdirAll(dst, 0o755); err != nil {
			return 0, "", err
		}
		n, err := pullTree(ctx, conn, p, dst)
		return n, filepath.Join(dst, base), err
	}
	tmp, err := os.MkdirTemp(dirOf(dst), ".sbxctl-cp-*")
	if err != nil {
		return 0, "", err
	}
	defer os.RemoveAll(tmp)
	n, err := pullTree(ctx, conn, p, tmp)
	if err != nil {
		return n, "", err
	}
	if err := os.Rename(filepath.Join(tmp, base), dst); err != nil {
		return n, "", err
	}
	return n, dst, nil
}

// countingReader counts what is read through it.
type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(b []byte) (int, error) {
	n, err := c.r.Read(b)
	c.n += int64(n)
	return n, err
}

// copyOut copies guest path p to local dst (stdout for "-") and returns
// the bytes received and the local path written. A guest directory (with
// recursive) or a file lands in an existing directory dst under its base
// name, else becomes dst, as cp does; either is written whole under a
// temporary name beside dst, then renamed.
func copyOut(ctx context.Context, conn *silkd.Conn, p, dst string, recursive bool, cl *call) (int64, string, error) {
	if dst == "-" {
		n, err := conn.ReadFile(ctx, p, cl.stdout)
		return n, dst, err
	}
	gst, err := conn.Stat(ctx, p)
	if err != nil {
		return 0, "", err
	}
	if gst.Kind == silkd.FileDir {
		if !recursive {
			return 0, "", usagef("%s is a directory in the sandbox: cp -r copies directories", p)
		}
		return copyTreeOut(ctx, conn, p, dst)
	}
	if st, err := os.Stat(dst); err == nil && st.IsDir() {
		dst = filepath.Join(dst, path.Base(p))
	}
	tmp, err := os.CreateTemp(dirOf(dst), ".sbxctl-cp-*")
	if err != nil {
		return 0, "", err
	}
	defer os.Remove(tmp.Name())
	n, err := conn.ReadFile(ctx, p, tmp)
	if err != nil {
		tmp.Close()
		return n, "", err
	}
	if err := tmp.Close(); err != nil {
		return n, "", err
	}
	if err := os.Chmod(tmp.Name(), fs.FileMode(gst.Mode)&fs.ModePerm); err != nil {
		return n, "", err
	}
	return n, dst, os.Rename(tmp.Name(), dst)
}

func dirOf(p string) string {
	if i := strings.LastIndexByte(p, '/'); i >= 0 {
		return p[:i+1]
	}
	return "."
}

func portForwardFlags(fs *flag.FlagSet) remoteBody {
	bind := fs.String("bind", "127.0.0.1", "local address to listen on")
	sandbox := sandboxTokenFlag(fs)
	return func(ctx context.Context, c *apiclient.Client, cl *call) error {
		id, spec := cl.args[0], cl.args[1]
		local, remote := "0", spec
		if l, r, ok := strings.Cut(spec, ":"); ok {
			local, remote = l, r
		}
		port, err := strconv.ParseUint(remote, 10, 16)
		if err != nil || port == 0 {
			return usagef("port %q: want [LOCAL:]PORT, ports 1-65535", spec)
		}
		sc, err := sandbox(c)
		if err != nil {
			return err
		}
		ln, err := net.Listen("tcp", net.JoinHostPort(*bind, local))
		if err != nil {
			return err
		}
		defer ln.Close()
		fmt.Fprintf(cl.stdout, "forwarding %s -> %s port %d (Ctrl-C to stop)\n", ln.Addr(), id, port)
		stop := context.AfterFunc(ctx, func() { ln.Close() })
		defer stop()
		var wg sync.WaitGroup
		defer wg.Wait()
		for {
			lc, err := ln.Accept()
			if err != nil {
				if ctx.Err() != nil {
					return nil
				}
				return err
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				forwardOne(ctx, sc, id, int(port), lc, cl.stderr)
			}()
		}
	}
}

// forwardOne relays one local connection to the sandbox's port through
// the ports route, until either side ends or ctx does.
func forwardOne(ctx context.Context, c *apiclient.Client, id string, port int, lc net.Conn, stderr io.Writer) {
	gc, err := c.DialPort(ctx, id, port)
	if err != nil {
		lc.Close()
		fmt.Fprintf(stderr, "sbxctl port-forward: %v\n", err)
		return
	}
	r := relay.Splice(lc, gc, relay.Options{})
	defer context.AfterFunc(ctx, func() { r.Stop("interrupted") })()
	if res := r.Run(nil); res.Reason != relay.ReasonClient && res.Reason != relay.ReasonGuest && !errors.Is(ctx.Err(), context.Canceled) {
		fmt.Fprintf(stderr, "sbxctl port-forward: connection ended: %s\n", res.Reason)
	}
}
