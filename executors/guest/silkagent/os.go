package silkagent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/sbxlog/sbxlog/executors/guest/silkd"
)

// DefaultPath is exec's PATH unless env sets one.
const DefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// inheritedEnv are the variables of the agent's own environment a child
// gets (besides PATH): the terminal type and the lane's proxies.
var inheritedEnv = []string{"TERM", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "no_proxy", "all_proxy",
	"SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "PIP_CERT", "CURL_CA_BUNDLE"}

// OSProcs spawns real processes of the machine the agent runs on.
type OSProcs struct{}

// Spawn implements Spawner.
func (OSProcs) Spawn(req *silkd.Exec) (Process, error) {
	cmd, err := command("exec", req.Argv, req.Cwd, req.Env, req.User)
	if err != nil {
		return nil, err
	}
	var parent, child [3]*os.File
	closeAll := func(fs []*os.File) {
		for _, f := range fs {
			if f != nil {
				f.Close()
			}
		}
	}
	for i := range 3 {
		r, w, err := os.Pipe()
		if err != nil {
			closeAll(parent[:])
			closeAll(child[:])
			return nil, fmt.Errorf("exec: pipe: %w", err)
		}
		if i == 0 {
			child[i], parent[i] = r, w
		} else {
			parent[i], child[i] = r, w
		}
	}
	// *os.File streams: the child gets the pipes themselves, with no copying
	// goroutines of os/exec in between.
	cmd.Stdin, cmd.Stdout, cmd.Stderr = child[0], child[1], child[2]
	err = cmd.Start()
	closeAll(child[:])
	if err != nil {
		closeAll(parent[:])
		return nil, spawnError(err)
	}
	return &osProc{osChild: osChild{cmd}, stdin: parent[0], stdout: parent[1], stderr: parent[2]}, nil
}

// command prepares argv as op (exec, pty_open, session_create) runs it: the environment (see the package
// doc), the user, and cwd, checked here because a failed chdir in the
// child reads as a missing argv[0].
func command(op string, argv []string, cwd string, reqEnv map[string]string, userName string) (*exec.Cmd, error) {
	env := map[string]string{"PATH": DefaultPath}
	for _, k := range inheritedEnv {
		if v, ok := os.LookupEnv(k); ok {
			env[k] = v
		}
	}
	var cred *syscall.Credential
	if userName != "" {
		u, err := user.Lookup(userName)
		if err != nil {
			return nil, badRequest("%s: user %q: %v", op, userName, err)
		}
		uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
		gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
		if err1 != nil || err2 != nil {
			return nil, badRequest("%s: user %q has no numeric uid/gid", op, userName)
		}
		cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), NoSetGroups: true}
		env["HOME"], env["USER"] = u.HomeDir, u.Username
	}
	for k, v := range reqEnv {
		env[k] = v
	}
	if cwd != "" {
		if st, err := os.Stat(cwd); err != nil {
			return nil, badRequest("%s: cwd: %v", op, err)
		} else if !st.IsDir() {
			return nil, badRequest("%s: cwd %s is not a directory", op, cwd)
		}
	}
	path, err := lookPath(argv[0], env["PATH"])
	if err != nil {
		return nil, badRequest("%s: %s: %v", op, argv[0], err)
	}
	cmd := &exec.Cmd{Path: path, Args: argv, Dir: cwd}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	return cmd, nil
}

// spawnError classifies a failed start: the argv or cwd the guest cannot
// use is the client's mistake.
func spawnError(err error) error {
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) || errors.Is(err, fs.ErrPermission) || errors.Is(err, syscall.ENOEXEC) {
		return badRequest("exec: %v", err)
	}
	return fmt.Errorf("spawn: %w", err)
}

// lookPath finds name in the child's PATH (not the agent's).
func lookPath(name, path string) (string, error) {
	if strings.Contains(name, "/") {
		return name, nil
	}
	for _, dir := range filepath.SplitList(path) {
		if dir == "" {
			dir = "."
		}
		p := filepath.Join(dir, name)
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", exec.ErrNotFound
}

// osChild is a started child: what a Process of exec and of pty_open
// share.
type osChild struct{ cmd *exec.Cmd }

func (c osChild) Pid() uint32 { return uint32(c.cmd.Process.Pid) }

func (c osChild) Wait() int32 {
	_ = c.cmd.Wait()
	return int32(c.cmd.ProcessState.ExitCode())
}

func (c osChild) Signal(sig syscall.Signal) error {
	err := c.cmd.Process.Signal(sig)
	if errors.Is(err, os.ErrProcessDone) {
		return nil
	}
	return err
}

type osProc struct {
	osChild
	stdin, stdout, stderr *os.File
}

func (p *osProc) Stdin() io.WriteCloser { return p.stdin }
func (p *osProc) Stdout() io.Reader     { return p.stdout }
func (p *osProc) Stderr() io.Reader     { return p.stderr }

func (p *osProc) CloseOutput() {
	p.stdout.Close()
	p.stderr.Close()
}

// OSFS is the machine's own file tree.
type OSFS struct{}

func fileKind(m fs.FileMode) silkd.FileKind {
	switch {
	case m.IsRegular():
		return silkd.FileRegular
	case m.IsDir():
		return silkd.FileDir
	case m&fs.ModeSymlink != 0:
		return silkd.FileSymlink
	}
	return silkd.FileOther
}

// permBits is the permission part of a mode as the wire has it (with
// setuid, setgid and sticky in their Unix places).
func permBits(m fs.FileMode) uint32 {
	b := uint32(m.Perm())
	if m&fs.ModeSetuid != 0 {
		b |= 0o4000
	}
	if m&fs.ModeSetgid != 0 {
		b |= 0o2000
	}
	if m&fs.ModeSticky != 0 {
		b |= 0o1000
	}
	return b
}

// Stat implements FS.
func (OSFS) Stat(path string) (silkd.StatInfo, error) {
	return statInfo(os.Stat(path))
}

// statInfo is the wire's description of st.
func statInfo(st fs.FileInfo, err error) (silkd.StatInfo, error) {
	if err != nil {
		return silkd.StatInfo{}, err
	}
	return silkd.StatInfo{Kind: fileKind(st.Mode()), Size: uint64(st.Size()), Mode: permBits(st.Mode()),
		MtimeEpochSecs: uint64(max(st.ModTime().Unix(), 0))}, nil
}

// ReadDir implements FS.
func (OSFS) ReadDir(path string) ([]silkd.Entry, error) {
	des, err := os.ReadDir(path)
	if err != nil {
		return nil, err
	}
	out := make([]silkd.Entry, 0, len(des))
	for _, d := range des {
		e := silkd.Entry{Name: d.Name(), Kind: fileKind(d.Type())}
		if info, err := d.Info(); err == nil {
			e.Size = uint64(info.Size())
		}
		out = append(out, e)
	}
	return out, nil
}

// Open implements FS.
func (OSFS) Open(path string) (io.ReadCloser, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	if !st.Mode().IsRegular() {
		f.Close()
		return nil, badRequest("fs_read: %s is a %s, not a regular file", path, fileKind(st.Mode()))
	}
	return f, nil
}

// Create implements FS.
func (OSFS) Create(path string, mode *uint32) (Upload, error) {
	perm := fs.FileMode(0o644)
	if mode != nil {
		perm = fs.FileMode(*mode & 0o7777)
	} else if st, err := os.Stat(path); err == nil {
		perm = st.Mode() & (fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky)
	}
	if st, err := os.Stat(path); err == nil && st.IsDir() {
		return nil, badRequest("fs_write: %s is a directory", path)
	}
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".sbx-upload-")
	if err != nil {
		return nil, err
	}
	if err := f.Chmod(perm); err != nil {
		f.Close()
		os.Remove(f.Name())
		return nil, err
	}
	return &osUpload{f: f, path: path}, nil
}

type osUpload struct {
	f    *os.File
	path string
}

func (u *osUpload) Write(p []byte) (int, error) { return u.f.Write(p) }

func (u *osUpload) Commit() error {
	err := u.f.Sync()
	if cerr := u.f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(u.f.Name(), u.path)
	}
	if err != nil {
		os.Remove(u.f.Name())
	}
	return err
}

func (u *osUpload) Abort() {
	u.f.Close()
	os.Remove(u.f.Name())
}

// Mkdir implements FS.
func (OSFS) Mkdir(path string, parents bool) error {
	if parents {
		return os.MkdirAll(path, 0o755)
	}
	return os.Mkdir(path, 0o755)
}

// Remove implements FS.
func (OSFS) Remove(path string, recursive bool) error {
	if _, err := os.Lstat(path); err != nil {
		return err
	}
	if recursive {
		return os.RemoveAll(path)
	}
	return os.Remove(path)
}

// Rename implements FS.
func (OSFS) Rename(from, to string) error { return os.Rename(from, to) }

// DialTCP connects port_forward to 127.0.0.1:port of the machine the agent
// runs on.
func DialTCP(ctx context.Context, port uint16) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, "tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(int(port))))
}
