package chsim_test

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/sbxlog/sbxlog/executors/ch"
	"github.com/sbxlog/sbxlog/executors/ch/chsim"
	"github.com/sbxlog/sbxlog/executors/ch/chsimbin"
)

var chsimBin string

func TestMain(m *testing.M) { os.Exit(chsimbin.RunTests(m, &chsimBin)) }

func shortDir(t *testing.T) string { return chsimbin.ShortTempDir(t) }

// fakeClock is an injected clock for the time-driven parts (the balloon,
// the agent delay).
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{now: time.Unix(1_800_000_000, 0)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// inProc runs a simulator inside the test process (so -race sees it) on a
// socket in dir.
func inProc(t *testing.T, dir string, opts chsim.Options) *ch.Client {
	t.Helper()
	opts.Socket = filepath.Join(dir, "api.sock")
	opts.GuestTick = testTick
	logs := &chsimbin.SyncBuffer{}
	opts.Log = logs
	if opts.Crash == nil {
		opts.Crash = func(reason string) { t.Errorf("unexpected crash: %s", reason) }
	}
	s, err := chsim.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Listen(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
		if t.Failed() {
			t.Logf("chsim log:\n%s", logs.String())
		}
	})
	return ch.New(opts.Socket)
}

// testTick makes simulated guests tick fast, so waiting for heartbeats is
// quick.
const testTick = 10 * time.Millisecond

// startProc runs the chsim binary on a socket in dir.
func startProc(t *testing.T, dir string, env ...string) *chsimbin.Process {
	env = append([]string{chsim.EnvGuestTick + "=" + testTick.String()}, env...)
	return chsimbin.StartT(t, chsimBin, filepath.Join(dir, "api.sock"), env...)
}

// vmConfig is a config whose kernel and disk exist in dir.
func vmConfig(t *testing.T, dir string, memBytes int64) *ch.VmConfig {
	t.Helper()
	kernel, disk := filepath.Join(dir, "vmlinux"), filepath.Join(dir, "disk.raw")
	if err := os.WriteFile(kernel, []byte("kernel"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(disk, make([]byte, 4096), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := ch.NewConfig(ch.Payload{Kernel: kernel, Cmdline: "console=ttyS0"}, 1, memBytes)
	cfg.AddDisk(disk)
	return cfg
}

func boot(t *testing.T, c *ch.Client, cfg *ch.VmConfig) {
	t.Helper()
	ctx := context.Background()
	if err := c.Create(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	if err := c.Boot(ctx); err != nil {
		t.Fatal(err)
	}
}

// guestCounter reads one of the simulated guest's counters.
func guestCounter(t *testing.T, c *ch.Client, name string) int64 {
	t.Helper()
	cs, err := c.Counters(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return cs["chsim-guest"][name]
}

// waitHeartbeats polls until the guest has written at least n heartbeats.
func waitHeartbeats(t *testing.T, c *ch.Client, n int64) int64 {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if h := guestCounter(t, c, "heartbeats"); h >= n {
			return h
		}
		if time.Now().After(deadline) {
			t.Fatalf("guest did not reach %d heartbeats", n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func snapshotDir(t *testing.T, parent, name string) (string, string) {
	t.Helper()
	d := filepath.Join(parent, name)
	if err := os.Mkdir(d, 0o755); err != nil {
		t.Fatal(err)
	}
	u, err := ch.FileURL(d)
	if err != nil {
		t.Fatal(err)
	}
	return d, u
}
