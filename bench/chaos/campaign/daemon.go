package campaign

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/sbxlog/sbxlog/executors/vmm"
	"github.com/sbxlog/sbxlog/projections/api"
	"github.com/sbxlog/sbxlog/projections/apiclient"
)

// Binaries are the programs a campaign runs. chsim must sit next to
// sandboxd, where sandboxd looks for it.
type Binaries struct {
	Sandboxd string
	Chsim    string
}

// Build compiles sandboxd and chsim into dir (go build, with the go tool on
// PATH, from the module that contains this package).
func Build(ctx context.Context, dir string) (Binaries, error) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		return Binaries{}, fmt.Errorf("campaign: no go tool on PATH: %w", err)
	}
	cmd := exec.CommandContext(ctx, goBin, "build", "-o", dir+string(filepath.Separator),
		"github.com/sbxlog/sbxlog/cmd/sandboxd", "github.com/sbxlog/sbxlog/cmd/chsim")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return Binaries{}, fmt.Errorf("campaign: go build: %w\n%s", err, stderr.String())
	}
	return Binaries{Sandboxd: filepath.Join(dir, "sandboxd"), Chsim: filepath.Join(dir, "chsim")}, nil
}

// Token is the root API token of the daemons a campaign starts.
const Token = "chaos-root-token"

// PoolConf is one pool of a daemon's config (the sandboxd JSON shape).
type PoolConf struct {
	Template string `json:"template"`
	Net      string `json:"net"`
	Size     string `json:"size"`
	Warm     int    `json:"warm"`
	WarmMax  int    `json:"warm_max,omitempty"`
	// Egress is the pool's egress policy (net egress).
	Egress *api.PolicyJSON `json:"egress,omitempty"`
	// ArchiveAfterSeconds archives a hibernated claim that long after its
	// last activity (the daemon needs an archive_dir).
	ArchiveAfterSeconds int64 `json:"archive_after_seconds,omitempty"`
}

// Daemon supervises one sandboxd: its data dir, config, process and log.
type Daemon struct {
	Name    string
	Bin     string
	DataDir string
	Addr    string
	// Env is added to every start (chsim tuning for all incarnations).
	Env []string
	// Wrap, when set, is the command the daemon runs under (nsenter into
	// the egress lane's namespace), and Dial how clients reach it there.
	Wrap []string
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	Log  string // the daemon's stderr, all incarnations appended

	mu    sync.Mutex
	cmd   *exec.Cmd
	done  chan struct{}
	state *os.ProcessState
	// Incarnations counts starts.
	Incarnations int
}

// NewDaemon writes a config for a daemon on dataDir listening on a free
// loopback port, with pools applied at its first start.
func NewDaemon(name, bin, dataDir string, pools []PoolConf, nats bool) (*Daemon, error) {
	if err := os.MkdirAll(dataDir, 0o755); err != nil {
		return nil, err
	}
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	cfg := map[string]any{
		"listen": addr, "data_dir": dataDir, "node_id": name, "api_token": Token,
		"hypervisor": "chsim", "pools": pools, "log_level": "info",
		"nats": map[string]any{"disabled": !nats},
	}
	data, _ := json.MarshalIndent(cfg, "", "  ")
	if err := os.WriteFile(filepath.Join(dataDir, "..", name+".json"), data, 0o644); err != nil {
		return nil, err
	}
	return &Daemon{Name: name, Bin: bin, DataDir: dataDir, Addr: addr, Log: filepath.Join(dataDir, "..", name+".log")}, nil
}

func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// Configure sets top-level keys of the daemon's config file (before a
// start).
func (d *Daemon) Configure(kv map[string]any) error {
	data, err := os.ReadFile(d.ConfigPath())
	if err != nil {
		return err
	}
	cfg := map[string]any{}
	if err := json.Unmarshal(data, &cfg); err != nil {
		return err
	}
	maps.Copy(cfg, kv)
	data, _ = json.MarshalIndent(cfg, "", "  ")
	return os.WriteFile(d.ConfigPath(), data, 0o644)
}

// ConfigPath is the daemon's config file.
func (d *Daemon) ConfigPath() string { return filepath.Join(d.DataDir, "..", d.Name+".json") }

// Start runs a new incarnation with extra environment (faults, crash seam)
// and waits until it answers /v1/info, or it exits, or timeout.
func (d *Daemon) Start(ctx context.Context, extra []string, timeout time.Duration) (time.Duration, error) {
	d.mu.Lock()
	if d.cmd != nil && d.done != nil {
		select {
		case <-d.done:
		default:
			d.mu.Unlock()
			return 0, fmt.Errorf("%s: already running", d.Name)
		}
	}
	logf, err := os.OpenFile(d.Log, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		d.mu.Unlock()
		return 0, err
	}
	d.Incarnations++
	fmt.Fprintf(logf, "\n===== %s incarnation %d: %s =====\n", d.Name, d.Incarnations, strings.Join(extra, " "))
	args := append(slices.Clone(d.Wrap), d.Bin, "-config", d.ConfigPath())
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Env = append(append(os.Environ(), d.Env...), extra...)
	cmd.Stdout, cmd.Stderr = logf, logf
	// Its own process group: a signal meant for the campaign (^C) does not
	// reach it, and the campaign kills it only on purpose.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		logf.Close()
		d.mu.Unlock()
		return 0, err
	}
	done := make(chan struct{})
	d.cmd, d.done, d.state = cmd, done, nil
	d.mu.Unlock()
	go func() {
		_ = cmd.Wait()
		logf.Close()
		d.mu.Lock()
		d.state = cmd.ProcessState
		d.mu.Unlock()
		close(done)
	}()
	c := d.Client(2 * time.Second)
	deadline := time.Now().Add(timeout)
	for {
		select {
		case <-done:
			return 0, fmt.Errorf("%s exited during start-up (%v); see %s", d.Name, d.ExitState(), d.Log)
		case <-ctx.Done():
			return 0, ctx.Err()
		default:
		}
		if _, err := c.Info(ctx); err == nil {
			return time.Since(start), nil
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("%s did not answer within %s; see %s", d.Name, timeout, d.Log)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Pid is the running incarnation's pid (0 when none runs).
func (d *Daemon) Pid() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.cmd == nil || d.cmd.Process == nil || d.state != nil {
		return 0
	}
	return d.cmd.Process.Pid
}

// Done is closed when the current incarnation exits.
func (d *Daemon) Done() <-chan struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.done == nil {
		c := make(chan struct{})
		close(c)
		return c
	}
	return d.done
}

// exits reports whether the incarnation ends (or has ended) within d.
func (d *Daemon) exits(wait time.Duration) bool {
	select {
	case <-d.Done():
		return true
	case <-time.After(wait):
		return false
	}
}

// Running reports whether an incarnation runs.
func (d *Daemon) Running() bool {
	select {
	case <-d.Done():
		return false
	default:
		return true
	}
}

// ExitState describes how the last incarnation ended.
func (d *Daemon) ExitState() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.state == nil {
		return "running"
	}
	return d.state.String()
}

// Signal sends sig to the running incarnation and waits for it to exit.
func (d *Daemon) Signal(sig syscall.Signal, wait time.Duration) error {
	d.mu.Lock()
	cmd, done := d.cmd, d.done
	d.mu.Unlock()
	if cmd == nil || done == nil {
		return errors.New("not started")
	}
	select {
	case <-done:
		return nil
	default:
	}
	if err := cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	select {
	case <-done:
		return nil
	case <-time.After(wait):
		return fmt.Errorf("%s did not exit within %s of %s", d.Name, wait, sig)
	}
}

// Client is a root API client of the daemon.
func (d *Daemon) Client(timeout time.Duration) *apiclient.Client {
	c, err := apiclient.New("http://"+d.Addr, Token, &http.Client{Timeout: timeout, Transport: &http.Transport{DisableKeepAlives: true, DialContext: d.Dial}})
	if err != nil {
		panic(err) // the address is ours and well-formed
	}
	return c
}

// Instance returns the instance id of the daemon's run dirs (the one entry
// under <data>/run that is not planted by the campaign), "" before the
// first start made it.
func (d *Daemon) Instance(exclude ...string) string {
	ents, _ := os.ReadDir(filepath.Join(d.DataDir, "run"))
	for _, e := range ents {
		skip := false
		for _, x := range exclude {
			skip = skip || e.Name() == x
		}
		if !skip {
			return e.Name()
		}
	}
	return ""
}

// VMMProc is a live chsim process found in /proc.
type VMMProc struct {
	Pid    int
	Socket string
}

// VMMsUnder lists live chsim processes whose API socket lies under dir.
func VMMsUnder(dir string) []VMMProc {
	ents, _ := os.ReadDir("/proc")
	var out []VMMProc
	prefix := filepath.Clean(dir) + string(filepath.Separator)
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		data, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(strings.TrimRight(string(data), "\x00"), "\x00")
		if len(args) < 3 || filepath.Base(args[0]) != "chsim" {
			continue
		}
		for i := 1; i+1 < len(args); i++ {
			if args[i] == "--api-socket" {
				sock := strings.TrimPrefix(args[i+1], "path=")
				if strings.HasPrefix(sock, prefix) && alive(pid) {
					out = append(out, VMMProc{Pid: pid, Socket: sock})
				}
			}
		}
	}
	return out
}

// alive reports whether pid runs and is not a zombie.
func alive(pid int) bool { return vmm.ProcessLive("/proc", pid) }

// KillVMMsUnder SIGKILLs every chsim whose socket lies under dir (the
// campaign's own VMs, at the end) and returns how many it found.
func KillVMMsUnder(dir string) int {
	procs := VMMsUnder(dir)
	for _, p := range procs {
		_ = syscall.Kill(p.Pid, syscall.SIGKILL)
	}
	return len(procs)
}
