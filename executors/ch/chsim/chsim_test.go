package chsim_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sbxlog/sbxlog/executors/ch"
	"github.com/sbxlog/sbxlog/executors/ch/chsim"
)

func TestBalloonConvergesWhileRunning(t *testing.T) {
	ctx := context.Background()
	clk := newFakeClock()
	opts := chsim.DefaultOptions()
	opts.Now = clk.Now
	opts.BalloonRate = 64 << 20 // per second
	dir := shortDir(t)
	c := inProc(t, dir, opts)
	cfg := vmConfig(t, dir, 256<<20)
	cfg.SetBalloonSize(64 << 20)
	boot(t, c, cfg)

	actual := func() int64 {
		t.Helper()
		info, err := c.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return info.MemoryActualSize
	}
	steps := []struct {
		do   func()
		want int64
	}{
		{func() {}, 256 << 20},
		{func() { clk.Advance(500 * time.Millisecond) }, 224 << 20},
		{func() { clk.Advance(10 * time.Second) }, 192 << 20}, // settled at size - balloon
		{func() {
			if err := c.Pause(ctx); err != nil {
				t.Fatal(err)
			}
			if err := c.Resize(ctx, ch.ResizeBalloon(0)); err != nil {
				t.Fatal(err)
			}
			clk.Advance(time.Hour) // a paused guest's balloon driver does nothing
		}, 192 << 20},
		{func() {
			if err := c.Resume(ctx); err != nil {
				t.Fatal(err)
			}
			clk.Advance(250 * time.Millisecond)
		}, 208 << 20},
		{func() { clk.Advance(time.Second) }, 256 << 20},
	}
	for i, s := range steps {
		s.do()
		if got := actual(); got != s.want {
			t.Fatalf("step %d: memory_actual_size = %d MiB, want %d MiB", i, got>>20, s.want>>20)
		}
	}
	info, _ := c.Info(ctx)
	if b, _ := info.Config.BalloonSize(); b != 0 {
		t.Errorf("config balloon after resize = %d", b)
	}
	var ae *ch.APIError
	if err := c.Resize(ctx, ch.ResizeBalloon(256<<20)); !errors.As(err, &ae) || ae.Status != 500 {
		t.Errorf("balloon as large as memory: %v, want 500", err)
	}
}

func TestSnapshotRestoreRoundTrip(t *testing.T) {
	ctx := context.Background()
	opts := chsim.DefaultOptions()
	opts.DirtyBytes = 1 << 20
	dir := shortDir(t)
	c := inProc(t, dir, opts)
	cfg := vmConfig(t, dir, 64<<20)
	cfg.SetBalloonSize(8 << 20)
	boot(t, c, cfg)
	beats := waitHeartbeats(t, c, 2)
	if err := c.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	snap, url := snapshotDir(t, dir, "snap")
	if err := c.Snapshot(ctx, url); err != nil {
		t.Fatal(err)
	}
	// The files as CH leaves them: memory-ranges is guest-sized and sparse.
	var st syscall.Stat_t
	if err := syscall.Stat(filepath.Join(snap, chsim.MemoryFile), &st); err != nil {
		t.Fatal(err)
	}
	if st.Size != 64<<20 {
		t.Errorf("memory-ranges is %d bytes, want the guest's 64 MiB", st.Size)
	}
	if alloc := st.Blocks * 512; alloc < 1<<20 || alloc > 2<<20 {
		t.Errorf("memory-ranges has %d bytes allocated, want about the 1 MiB of data", alloc)
	}
	saved, err := os.ReadFile(filepath.Join(snap, chsim.ConfigFile))
	if err != nil {
		t.Fatal(err)
	}
	sc, err := ch.ParseConfig(saved)
	if err != nil || sc.DiskPaths()[0] != cfg.DiskPaths()[0] {
		t.Fatalf("config.json = %s (%v)", saved, err)
	}
	if err := c.Delete(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Info(ctx); !ch.IsNotFound(err) {
		t.Fatalf("info after delete = %v", err)
	}

	// Copy restore: paused until resumed, the guest carries on from where it was.
	if err := c.Restore(ctx, ch.RestoreConfig{SourceURL: url, MemoryRestoreMode: ch.RestoreCopy}); err != nil {
		t.Fatal(err)
	}
	info, err := c.Info(ctx)
	if err != nil || info.State != ch.StatePaused {
		t.Fatalf("after restore: %+v %v", info, err)
	}
	if got := guestCounter(t, c, "heartbeats"); got < beats {
		t.Fatalf("restored guest has %d heartbeats, snapshot had at least %d", got, beats)
	}
	if err := c.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	waitHeartbeats(t, c, beats+2)
	if r := guestCounter(t, c, "resumes"); r != 1 {
		t.Errorf("resumes = %d, want 1", r)
	}
}

func TestRestoreRejectsBrokenSnapshots(t *testing.T) {
	ctx := context.Background()
	opts := chsim.DefaultOptions()
	opts.DirtyBytes = 256 << 10
	dir := shortDir(t)
	c := inProc(t, dir, opts)
	boot(t, c, vmConfig(t, dir, 32<<20))
	if err := c.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	snap, url := snapshotDir(t, dir, "snap")
	if err := c.Snapshot(ctx, url); err != nil {
		t.Fatal(err)
	}
	if err := c.Delete(ctx); err != nil {
		t.Fatal(err)
	}
	mem := filepath.Join(snap, chsim.MemoryFile)
	orig, err := os.ReadFile(mem)
	if err != nil {
		t.Fatal(err)
	}
	restoreFails := func(what, chainHas string, mode ch.MemoryRestoreMode) {
		t.Helper()
		err := c.Restore(ctx, ch.RestoreConfig{SourceURL: url, MemoryRestoreMode: mode})
		var ae *ch.APIError
		if !errors.As(err, &ae) || ae.Status != 500 || !ae.Contains(chainHas) {
			t.Errorf("%s: restore = %v, want 500 mentioning %q", what, err, chainHas)
		}
		if _, err := c.Info(ctx); !ch.IsNotFound(err) {
			t.Errorf("%s: a failed restore left a VM behind", what)
		}
	}
	corrupt := append([]byte(nil), orig...)
	corrupt[100] ^= 0xff
	if err := os.WriteFile(mem, corrupt, 0o600); err != nil {
		t.Fatal(err)
	}
	// Copy reads everything, so it notices at once (a mapped restore's guest
	// crashes later instead: TestCorruptMemoryCrashesMappedGuest).
	restoreFails("corrupt memory", "does not hold the memory", ch.RestoreCopy)
	if err := os.WriteFile(mem, orig[:len(orig)/2], 0o600); err != nil {
		t.Fatal(err)
	}
	restoreFails("short memory file", "the guest has", ch.RestoreCopyOnWrite)
	if err := os.WriteFile(mem, orig, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(snap, chsim.StateFile)); err != nil {
		t.Fatal(err)
	}
	restoreFails("no state.json", "No such file or directory (os error 2)", ch.RestoreCopyOnWrite)

	cfg := vmConfig(t, dir, 32<<20)
	if err := cfg.Set(true, "memory", "shared"); err != nil {
		t.Fatal(err)
	}
	if err := c.Create(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	if err := c.Boot(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	_, url2 := snapshotDir(t, dir, "shared")
	if err := c.Snapshot(ctx, url2); err != nil {
		t.Fatal(err)
	}
	if err := c.Delete(ctx); err != nil {
		t.Fatal(err)
	}
	url = url2 // restoreFails restores from url
	restoreFails("CopyOnWrite of shared memory", "CopyOnWrite restore needs private", ch.RestoreCopyOnWrite)
	if err := c.Restore(ctx, ch.RestoreConfig{SourceURL: url2, MemoryRestoreMode: ch.RestoreCopy, Resume: true}); err != nil {
		t.Fatalf("Copy restore of shared memory: %v", err)
	}
}

func TestDevicesOpenLikeCH(t *testing.T) {
	ctx := context.Background()
	dir := shortDir(t)
	a := inProc(t, dir, chsim.DefaultOptions())
	bdir := filepath.Join(dir, "b")
	if err := os.Mkdir(bdir, 0o755); err != nil {
		t.Fatal(err)
	}
	b := inProc(t, bdir, chsim.DefaultOptions())
	cfg := vmConfig(t, dir, 32<<20)
	cfg.SetSerialFile(filepath.Join(dir, "serial.log"))
	boot(t, a, cfg)

	bootFails := func(c *ch.Client, cfg *ch.VmConfig, chainHas string) {
		t.Helper()
		_ = c.Delete(ctx)
		if err := c.Create(ctx, cfg); err != nil {
			t.Fatal(err)
		}
		err := c.Boot(ctx)
		var ae *ch.APIError
		if !errors.As(err, &ae) || ae.Status != 500 || !ae.Contains(chainHas) {
			t.Fatalf("boot = %v, want 500 mentioning %q", err, chainHas)
		}
	}
	// Two VMs on one disk image: the second cannot take the lock.
	bootFails(b, cfg.Clone(), "Another instance likely holds a lock")
	// A missing disk or kernel.
	bad := cfg.Clone()
	if err := bad.SetDiskPath(0, filepath.Join(dir, "nope.raw")); err != nil {
		t.Fatal(err)
	}
	bootFails(b, bad, "Cannot open disk path")
	bad = cfg.Clone()
	bad.SetPayload(ch.Payload{Kernel: filepath.Join(dir, "no-kernel")})
	bootFails(b, bad, "Cannot open kernel file")
	// A vsock path that exists already (a clone whose path was not rewritten).
	stale := filepath.Join(dir, "stale.vsock")
	if err := os.WriteFile(stale, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	bad = cfg.Clone()
	if err := bad.SetDiskPath(0, filepath.Join(dir, "vmlinux")); err != nil {
		t.Fatal(err)
	}
	bad.SetVsock(3, stale)
	bootFails(b, bad, "Address already in use")

	// Once the first VM is gone, the disk is free.
	if err := a.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	_ = b.Delete(ctx)
	boot(t, b, cfg.Clone())
	serial, err := os.ReadFile(filepath.Join(dir, "serial.log"))
	if err != nil || !strings.Contains(string(serial), "Linux version") {
		t.Errorf("serial file = %q, %v", serial, err)
	}
}

func TestVsockHandshake(t *testing.T) {
	ctx := context.Background()
	clk := newFakeClock()
	opts := chsim.DefaultOptions()
	opts.Now = clk.Now
	opts.AgentDelay = time.Second
	opts.VsockPorts = []uint32{1024, 52}
	dir := shortDir(t)
	c := inProc(t, dir, opts)
	cfg := vmConfig(t, dir, 32<<20)
	sock := filepath.Join(dir, "v.sock")
	cfg.SetVsock(3, sock)
	if err := c.Create(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	if _, err := net.Dial("unix", sock); err == nil {
		t.Fatal("vsock socket exists before boot")
	}
	if err := c.Boot(ctx); err != nil {
		t.Fatal(err)
	}

	connect := func(port string) (net.Conn, *bufio.Reader) {
		t.Helper()
		conn, err := net.Dial("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		if _, err := io.WriteString(conn, "CONNECT "+port+"\n"); err != nil {
			t.Fatal(err)
		}
		return conn, bufio.NewReader(conn)
	}
	refused := func(what, port string) {
		t.Helper()
		conn, r := connect(port)
		_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		if line, err := r.ReadString('\n'); err != io.EOF {
			t.Errorf("%s: got %q, %v; want the connection closed", what, line, err)
		}
	}
	refused("agent not started yet", "1024")
	clk.Advance(2 * time.Second)
	refused("port nobody listens on", "2048")

	conn, r := connect("1024")
	line, err := r.ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "OK ") {
		t.Fatalf("handshake answer = %q, %v", line, err)
	}
	// Port 1024 is the guest's control agent (clock.go), other ports echo.
	if _, err := io.WriteString(conn, "#t ready\n"); err != nil {
		t.Fatal(err)
	}
	if answer, err := r.ReadString('\n'); err != nil || answer != "=t ready\n" {
		t.Fatalf("agent's answer = %q, %v", answer, err)
	}
	econn, er := connect("52")
	if line, err := er.ReadString('\n'); err != nil || !strings.HasPrefix(line, "OK ") {
		t.Fatalf("handshake answer on 52 = %q, %v", line, err)
	}
	if _, err := io.WriteString(econn, "hello guest\n"); err != nil {
		t.Fatal(err)
	}
	if echo, err := er.ReadString('\n'); err != nil || echo != "hello guest\n" {
		t.Fatalf("echo = %q, %v", echo, err)
	}

	// A paused guest does not answer until it runs again.
	if err := c.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	conn2, r2 := connect("1024")
	_ = conn2.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	if _, err := r2.ReadString('\n'); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("paused guest answered: %v", err)
	}
	_ = conn2.SetReadDeadline(time.Now().Add(5 * time.Second))
	if err := c.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	if line, err := r2.ReadString('\n'); err != nil || !strings.HasPrefix(line, "OK ") {
		t.Fatalf("after resume: %q, %v", line, err)
	}

	// Shutdown closes the device and removes its socket.
	if err := c.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(sock); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("vsock socket left after shutdown: %v", err)
	}
}

func TestFaultRules(t *testing.T) {
	ctx := context.Background()
	opts := chsim.DefaultOptions()
	rules, err := chsim.ParseFailRules("vm.pause:2:503, vm.info:2+:500,vm.counters:1:hang")
	if err != nil {
		t.Fatal(err)
	}
	opts.Fail = rules
	dir := shortDir(t)
	c := inProc(t, dir, opts)
	boot(t, c, vmConfig(t, dir, 32<<20))

	if err := c.Pause(ctx); err != nil {
		t.Fatalf("pause 1: %v", err)
	}
	err = c.Pause(ctx)
	var ae *ch.APIError
	if !errors.As(err, &ae) || ae.Status != 503 || !ae.Contains("vm.pause call 2") {
		t.Fatalf("pause 2 = %v, want injected 503", err)
	}
	if err := c.Pause(ctx); err != nil {
		t.Fatalf("pause 3 (already paused) = %v", err)
	}
	if _, err := c.Info(ctx); err != nil {
		t.Fatalf("info 1: %v", err)
	}
	for i := 2; i <= 4; i++ {
		if _, err := c.Info(ctx); !errors.As(err, &ae) || ae.Status != 500 {
			t.Fatalf("info %d = %v, want injected 500", i, err)
		}
	}
	hc := ch.New(c.SocketPath(), ch.WithTimeouts(ch.Timeouts{Call: 100 * time.Millisecond}))
	if _, err := hc.Counters(ctx); !errors.Is(err, ch.ErrTimeout) {
		t.Fatalf("hung counters = %v, want timeout", err)
	}
	if _, err := hc.Counters(ctx); err != nil {
		t.Fatalf("counters 2 = %v", err)
	}
}

func TestOptionsParsing(t *testing.T) {
	for in, want := range map[string]int64{"0": 0, "4096": 4096, "4K": 4 << 10, "4KiB": 4 << 10, "16m": 16 << 20, "2G": 2 << 30, "1GB": 1 << 30} {
		if got, err := chsim.ParseSize(in); err != nil || got != want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "x", "-1", "1.5M", "99999999999T"} {
		if _, err := chsim.ParseSize(bad); err == nil {
			t.Errorf("ParseSize(%q) accepted", bad)
		}
	}
	rules, err := chsim.ParseFailRules("vm.snapshot:1:exit,vm.restore:3+:hang,vmm.ping:2:404")
	want := []chsim.FailRule{
		{Op: "vm.snapshot", N: 1, Action: chsim.FailExit},
		{Op: "vm.restore", N: 3, From: true, Action: chsim.FailHang},
		{Op: "vmm.ping", N: 2, Action: chsim.FailStatus, Status: 404},
	}
	if err != nil || len(rules) != len(want) {
		t.Fatalf("ParseFailRules = %+v, %v", rules, err)
	}
	for i := range want {
		if rules[i] != want[i] {
			t.Errorf("rule %d = %+v, want %+v", i, rules[i], want[i])
		}
	}
	for _, bad := range []string{"vm.pause:1", "vm.nope:1:500", "vm.pause:0:500", "vm.pause:x:500", "vm.pause:1:200", "vm.pause:1:boom"} {
		if _, err := chsim.ParseFailRules(bad); err == nil {
			t.Errorf("ParseFailRules(%q) accepted", bad)
		}
	}
	env := map[string]string{
		chsim.EnvLatency: "3ms", chsim.EnvDirtyBytes: "8M", chsim.EnvBalloonRate: "0",
		chsim.EnvSnapshotExitAfter: "1K", chsim.EnvExitRandom: "1s", chsim.EnvFail: "vm.boot:1:500",
		chsim.EnvAgentDelay: "50ms", chsim.EnvVsockPorts: "52, 1024", chsim.EnvIgnoreSIGTERM: "1",
		chsim.EnvOpLatency: "vm.snapshot:500ms, vm.restore:1s", chsim.EnvNoClockVerb: "1",
	}
	o := chsim.DefaultOptions()
	if err := o.ApplyEnv(func(k string) string { return env[k] }); err != nil {
		t.Fatal(err)
	}
	if o.Latency != 3*time.Millisecond || o.DirtyBytes != 8<<20 || o.BalloonRate != 0 || o.SnapshotExitAfter != 1024 ||
		o.ExitRandom != time.Second || len(o.Fail) != 1 || o.AgentDelay != 50*time.Millisecond || len(o.VsockPorts) != 2 || !o.IgnoreSIGTERM || !o.NoClockVerb ||
		len(o.OpLatency) != 2 || o.OpLatency["vm.snapshot"] != 500*time.Millisecond || o.OpLatency["vm.restore"] != time.Second {
		t.Errorf("ApplyEnv = %+v", o)
	}
	for _, bad := range []string{"vm.snapshot", "vm.nope:1s", "vm.snapshot:soon", "vm.snapshot:-1s"} {
		if _, err := chsim.ParseOpLatency(bad); err == nil {
			t.Errorf("ParseOpLatency(%q) accepted", bad)
		}
	}
	env[chsim.EnvLatency] = "soon"
	env[chsim.EnvDirtyBytes] = "lots"
	err = o.ApplyEnv(func(k string) string { return env[k] })
	if err == nil || !strings.Contains(err.Error(), chsim.EnvLatency) || !strings.Contains(err.Error(), chsim.EnvDirtyBytes) {
		t.Errorf("ApplyEnv with bad values = %v", err)
	}
	for in, want := range map[string]string{"path=/run/a.sock": "/run/a.sock", "/run/b.sock": "/run/b.sock"} {
		if p, fd, err := chsim.ResolveSocketArg(in); err != nil || p != want || fd != -1 {
			t.Errorf("ResolveSocketArg(%q) = %q %d %v", in, p, fd, err)
		}
	}
	if _, fd, err := chsim.ResolveSocketArg("fd=3"); err != nil || fd != 3 {
		t.Errorf("fd=3 -> %d, %v", fd, err)
	}
	for _, bad := range []string{"", "fd=x", "size=3"} {
		if _, _, err := chsim.ResolveSocketArg(bad); err == nil {
			t.Errorf("ResolveSocketArg(%q) accepted", bad)
		}
	}
}

func TestVmInfoReportsConfig(t *testing.T) {
	ctx := context.Background()
	dir := shortDir(t)
	c := inProc(t, dir, chsim.DefaultOptions())
	cfg := vmConfig(t, dir, 32<<20)
	if err := cfg.Set(map[string]any{"future": []any{1, "x"}}, "x_unknown"); err != nil {
		t.Fatal(err)
	}
	boot(t, c, cfg)
	info, err := c.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := json.Marshal(info.Config)
	if !strings.Contains(string(got), `"x_unknown":{"future":[1,"x"]}`) {
		t.Errorf("vm.info config = %s", got)
	}
	if len(info.DeviceTree) == 0 || info.State != ch.StateRunning || info.MemoryActualSize != 32<<20 {
		t.Errorf("vm.info = %+v", info)
	}
}
