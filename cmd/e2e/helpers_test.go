package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sbxlog/sbxlog/executors/guest/guesttest"
	"github.com/sbxlog/sbxlog/projections/api"
	"github.com/sbxlog/sbxlog/projections/apiclient"
	"github.com/sbxlog/sbxlog/projections/openapi/openapitest"
)

// binDir holds sandboxd, chsim and sbxctl, built once by TestMain.
var binDir string

func TestMain(m *testing.M) {
	if spec := os.Getenv(natsdEnv); spec != "" {
		// A NATS server process of the fleet test (fleet_test.go).
		os.Exit(runNatsd(spec))
	}
	os.Exit(buildAndRun(m))
}

func buildAndRun(m *testing.M) int {
	flag.Parse()
	dir, err := os.MkdirTemp("", "sbx-e2e-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	goBin := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(goBin); err != nil {
		goBin = "go"
	}
	root, err := moduleRoot(goBin)
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	start := time.Now()
	cmd := exec.Command(goBin, "build", "-o", dir+string(filepath.Separator), "./cmd/sandboxd", "./cmd/chsim", "./cmd/sbxctl")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "e2e: go build: %v\n%s", err, out)
		return 1
	}
	if testing.Verbose() {
		fmt.Fprintf(os.Stderr, "e2e: built sandboxd, chsim, sbxctl in %v\n", time.Since(start).Round(time.Millisecond))
	}
	binDir = dir
	return m.Run()
}

func moduleRoot(goBin string) (string, error) {
	out, err := exec.Command(goBin, "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	mod := strings.TrimSpace(string(out))
	if mod == "" || mod == os.DevNull {
		return "", errors.New("not inside the module")
	}
	return filepath.Dir(mod), nil
}

// freeAddr returns a loopback address with a port that was free a moment ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// lockedBuffer collects a process's output while it runs.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// daemon is a sandboxd process.
type daemon struct {
	addr   string
	cmd    *exec.Cmd
	stderr *lockedBuffer
	exited chan struct{}
	err    error // the process's exit, once exited is closed
}

// cleanEnv is the environment minus the variables that would configure
// sandboxd or sbxctl behind the test's back.
func cleanEnv() []string {
	var out []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch k {
		case "SBX_API_TOKEN", "SBX_API_TOKEN_FILE", "SBX_ADDR", "SBXLOG_DATA":
			continue
		}
		out = append(out, kv)
	}
	return out
}

// startDaemon runs sandboxd in dir (its working directory) with args, on
// addr, and waits until /healthz answers. At the end of the test it is
// stopped with SIGTERM (SIGKILL after 15 s) and every chsim process whose
// command line names killDir is killed.
func startDaemon(t *testing.T, dir, killDir, addr string, args ...string) *daemon {
	t.Helper()
	return startWrappedDaemon(t, dir, killDir, addr, nil, args...)
}

// startWrappedDaemon is startDaemon with sandboxd run by wrap (a command
// and its arguments that execs the sandboxd path and arguments given
// after them).
func startWrappedDaemon(t *testing.T, dir, killDir, addr string, wrap []string, args ...string) *daemon {
	t.Helper()
	return startDaemonVia(t, dir, killDir, addr, wrap, nil, args...)
}

// startDaemonVia is startWrappedDaemon with /healthz asked through hc (nil:
// the default client), for a daemon in another network namespace.
func startDaemonVia(t *testing.T, dir, killDir, addr string, wrap []string, hc *http.Client, args ...string) *daemon {
	t.Helper()
	d := &daemon{addr: addr, stderr: &lockedBuffer{}, exited: make(chan struct{})}
	argv := append(append(append([]string(nil), wrap...), filepath.Join(binDir, "sandboxd")), args...)
	d.cmd = exec.Command(argv[0], argv[1:]...)
	d.cmd.Dir = dir
	d.cmd.Env = cleanEnv()
	d.cmd.Stdout = d.stderr
	d.cmd.Stderr = d.stderr
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { d.err = d.cmd.Wait(); close(d.exited) }()
	t.Cleanup(func() {
		d.stop(t)
		killVMMs(t, killDir)
		if t.Failed() {
			t.Logf("sandboxd output:\n%s", tail(d.stderr.String(), 16<<10))
		}
	})
	c, err := apiclient.New(addr, "", hc)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := c.Healthz(ctx)
		cancel()
		if err == nil {
			return d
		}
		select {
		case <-d.exited:
			t.Fatalf("sandboxd exited during start-up (%v):\n%s", d.err, d.stderr.String())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandboxd not healthy after 30 s: %v\n%s", err, d.stderr.String())
		}
	}
}

// chsimNode is a sandboxd on chsim started by startChsimNode.
type chsimNode struct {
	*daemon
	dir, data string            // its working directory and data dir
	c         *apiclient.Client // a client with the root token
}

// startChsimNode starts sandboxd as node "e2e" on chsim with the root
// token root, no pools and no NATS, in a fresh temp dir; with wrap,
// sandboxd is run by it (see startWrappedDaemon).
func startChsimNode(t *testing.T, root string, wrap ...string) *chsimNode {
	t.Helper()
	return startChsimNodeWith(t, root, nil, wrap...)
}

// startChsimNodeWith is startChsimNode with extra config keys.
func startChsimNodeWith(t *testing.T, root string, extra map[string]any, wrap ...string) *chsimNode {
	t.Helper()
	n := &chsimNode{dir: t.TempDir()}
	n.data = filepath.Join(n.dir, "data")
	addr := freeAddr(t)
	cfg := filepath.Join(n.dir, "sandboxd.json")
	conf := map[string]any{
		"listen": addr, "data_dir": n.data, "node_id": "e2e", "api_token": root, "hypervisor": "chsim",
		"pools": []any{}, "nats": map[string]any{"disabled": true},
	}
	for k, v := range extra {
		conf[k] = v
	}
	writeJSON(t, cfg, conf)
	n.daemon = startWrappedDaemon(t, n.dir, n.data, addr, wrap, "-config", cfg)
	// Every exchange of the node's client is checked against the OpenAPI
	// document.
	c, err := apiclient.New(addr, root, openapitest.Client(t, nil))
	if err != nil {
		t.Fatal(err)
	}
	n.c = c
	return n
}

// shortTempDir makes a temp dir named from prefix, removed at the end of
// the test: short, unlike t.TempDir's, so the socket paths of the VMs run
// under it fit.
func shortTempDir(t *testing.T, prefix string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// qemuNode is a sandboxd on QEMU started by startQEMUNode.
type qemuNode struct {
	*daemon
	data string            // its data dir
	root *apiclient.Client // a client with the root token dpRoot
}

// startQEMUNode starts sandboxd in dir (shortTempDir's) as node "e2e" on
// the QEMU driver (TCG) with guest g (as the "default" template, with its
// disk when g is the Debian one), the root token dpRoot, one warm default
// pool and no NATS; extra's keys are added to the config (replacing the
// defaults'). Its QEMU processes, which outlive it by design, are killed
// once it has stopped.
func startQEMUNode(t *testing.T, dir string, g guesttest.Guest, extra map[string]any) *qemuNode {
	t.Helper()
	n := &qemuNode{data: filepath.Join(dir, "data")}
	addr := freeAddr(t)
	qemu := map[string]any{"accel": "tcg", "kernel": g.Kernel, "initrd": g.Initrd}
	if g.Disk != "" {
		qemu = map[string]any{"accel": "tcg", "templates": map[string]any{
			"default": map[string]any{"kernel": g.Kernel, "initrd": g.Initrd, "disk": g.Disk},
		}}
	}
	conf := map[string]any{
		"listen": addr, "data_dir": n.data, "node_id": "e2e", "api_token": dpRoot, "hypervisor": "qemu", "qemu": qemu,
		"pools": []any{map[string]any{"template": "default", "warm": 1}}, "nats": map[string]any{"disabled": true},
	}
	for k, v := range extra {
		conf[k] = v
	}
	cfg := filepath.Join(dir, "sandboxd.json")
	writeJSON(t, cfg, conf)
	t.Cleanup(func() { killQEMUs(t, dir) }) // after sandboxd's stop
	n.daemon = startDaemon(t, dir, n.data, addr, "-config", cfg)
	n.root, _ = apiclient.New(addr, dpRoot, nil)
	return n
}

// claim claims req, retried for up to 5 minutes while the golden is still
// being built (a claim before is refused), and logs how long the claim
// that succeeded took.
func (n *qemuNode) claim(t *testing.T, ctx context.Context, req api.ClaimRequest) *api.ClaimResponse {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Minute); ; {
		start := time.Now()
		cl, err := n.root.Claim(ctx, req)
		if err == nil {
			t.Logf("claim (tier %s): %v", cl.Tier, time.Since(start))
			return cl
		}
		if time.Now().After(deadline) {
			t.Fatal(err)
		}
		time.Sleep(time.Second) // the golden is still being built
	}
}

// killQEMUs kills the QEMU processes whose command line names dir: like
// chsim's, they outlive sandboxd by design.
func killQEMUs(t *testing.T, dir string) {
	killProcesses(t, dir, func(bin string) bool { return strings.HasPrefix(bin, "qemu-system") })
}

// stop sends SIGTERM and waits for the exit (SIGKILL after 15 s).
func (d *daemon) stop(t *testing.T) {
	select {
	case <-d.exited:
		return
	default:
	}
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.exited:
		if d.err != nil {
			t.Errorf("sandboxd exit after SIGTERM: %v", d.err)
		}
	case <-time.After(15 * time.Second):
		_ = d.cmd.Process.Kill()
		<-d.exited
		t.Errorf("sandboxd did not stop within 15 s of SIGTERM")
	}
}

// killVMMs kills the VMM processes (chsim) whose command line names dir:
// they outlive sandboxd by design.
func killVMMs(t *testing.T, dir string) {
	killProcesses(t, dir, func(bin string) bool { return bin == "chsim" })
}

// killProcesses kills the processes whose command line names dir and whose
// binary's base name is, by isVMM, a VMM.
func killProcesses(t *testing.T, dir string, isVMM func(bin string) bool) {
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		raw, err := os.ReadFile(p)
		if err != nil || !bytes.Contains(raw, []byte(dir)) {
			continue
		}
		args := strings.Split(string(bytes.TrimRight(raw, "\x00")), "\x00")
		if !isVMM(filepath.Base(args[0])) {
			continue
		}
		pid, err := strconv.Atoi(filepath.Base(filepath.Dir(p)))
		if err != nil || pid == os.Getpid() {
			continue
		}
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
			t.Logf("kill %s %d: %v", args[0], pid, err)
		}
	}
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "...\n" + s[len(s)-n:]
}

// sbxctl runs the built sbxctl in dir with a clean environment plus env;
// it fails the test if it does not finish within a minute.
func sbxctl(t *testing.T, dir string, env []string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, "sbxctl"), args...)
	cmd.Dir = dir
	cmd.Env = append(cleanEnv(), env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("sbxctl %s: no answer within a minute\n%s", strings.Join(args, " "), errb.String())
	}
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		code = ee.ExitCode()
	default:
		t.Fatalf("sbxctl %s: %v", strings.Join(args, " "), err)
	}
	return out.String(), errb.String(), code
}

// writeJSON writes v as a JSON file.
func writeJSON(t *testing.T, path string, v any) {
	t.Helper()
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}
