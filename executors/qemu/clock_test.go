package qemu

import (
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/sbxlog/sbxlog/executors/fsx"
	"github.com/sbxlog/sbxlog/executors/guest/agent"
)

// serveAgent serves srv on runDir's agent socket, as a guest's serial port
// does, until the test ends.
func serveAgent(t *testing.T, runDir string, srv *agent.Server) {
	t.Helper()
	l, err := net.Listen("unix", AgentSocket(runDir))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _ = srv.Serve(c, c) }()
		}
	}()
}

// lockedClock is the guest's wall clock, read and set by the agent's
// goroutine and checked by the test.
type lockedClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *lockedClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *lockedClock) Set(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = t
	return nil
}

// Every wait for the agent (boot, restore, resume) sets the guest's clock
// to the host's and records how far off it was; an agent without the verb
// is no failure.
func TestWaitAgentSetsGuestClock(t *testing.T) {
	host := time.Date(2026, 12, 2, 6, 0, 0, 0, time.UTC)
	q, err := NewRecipes(RecipesConfig{Accel: AccelTCG, FS: fsx.NewOS(zerolog.Nop()), Now: func() time.Time { return host }})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name       string
		clock      bool
		wantOffset time.Duration
	}{
		{"restored guest minutes behind", true, -(4*time.Minute + 30*time.Second)},
		{"agent without the clock verb", false, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			runDir := t.TempDir()
			guest := &lockedClock{now: host.Add(-(4*time.Minute + 30*time.Second))}
			srv := &agent.Server{DataPath: filepath.Join(runDir, "data"), BootID: "b", Uptime: func() (time.Duration, error) { return time.Second, nil }}
			if tc.clock {
				srv.Now, srv.SetClock = guest.Now, guest.Set
			}
			serveAgent(t, runDir, srv)
			var r RecipeResult
			if err := q.waitAgent(ctxT(t, 10*time.Second), runDir, 5*time.Second, &r); err != nil {
				t.Fatal(err)
			}
			if r.ClockOffset != tc.wantOffset {
				t.Fatalf("ClockOffset %v, want %v", r.ClockOffset, tc.wantOffset)
			}
			if tc.clock && !guest.Now().Equal(host) {
				t.Fatalf("guest clock %v after the wait, want the host's %v", guest.Now(), host)
			}
		})
	}
}
