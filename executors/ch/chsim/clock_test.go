package chsim_test

import (
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/sbxlog/sbxlog/executors/ch"
	"github.com/sbxlog/sbxlog/executors/ch/chsim"
	"github.com/sbxlog/sbxlog/executors/guest/agent"
)

// clockVM boots an in-process VM on clk and returns its API client, its dir
// and a dialer for its control agent (vsock port agent.VsockPort).
func clockVM(t *testing.T, clk *fakeClock, noClock bool) (*ch.Client, string, func() *agent.Client) {
	t.Helper()
	opts := chsim.DefaultOptions()
	opts.Now = clk.Now
	opts.NoClockVerb = noClock
	c, dir, _ := simVMWith(t, opts, 32<<20)
	sock := filepath.Join(dir, "v.sock")
	return c, dir, func() *agent.Client { return agent.NewClient(dialVsock(t, sock, agent.VsockPort)) }
}

// The simulated guest's clock: the host's at boot, set by the clock verb
// (and only the simulated one: the host's is not touched), stopped while
// paused, carried by a snapshot and brought back by a restore, so a
// restored guest is behind by the time since its snapshot.
func TestSimulatedGuestClock(t *testing.T) {
	clk := newFakeClock()
	c, dir, dial := clockVM(t, clk, false)
	ctx := gctx(t)
	a := dial()
	read := func(what string, want time.Time) {
		t.Helper()
		got, err := a.Clock(ctx)
		if err != nil || !got.Equal(want) {
			t.Fatalf("%s: guest clock %v, %v; want %v", what, got, err, want)
		}
	}
	read("after boot", clk.Now())

	// A set answers the time it replaced; the guest runs on from the new one.
	told := clk.Now().Add(90 * time.Second)
	set, err := a.SetClock(ctx, told)
	if err != nil || !set.Was.Equal(clk.Now()) || set.Offset() != -90*time.Second {
		t.Fatalf("SetClock = %+v (offset %v), %v", set, set.Offset(), err)
	}
	clk.Advance(time.Second)
	read("a second after the set", told.Add(time.Second))
	if n, to, was := guestCounter(t, c, "clock_sets"), guestCounter(t, c, "clock_told_ns"), guestCounter(t, c, "clock_was_ns"); n != 1 || to != told.UnixNano() || was != set.Was.UnixNano() {
		t.Fatalf("counters: clock_sets %d, clock_told_ns %d, clock_was_ns %d; want 1, %d, %d", n, to, was, told.UnixNano(), set.Was.UnixNano())
	}

	// Paused, the guest's clock stands still (CH saves and sets back the
	// KVM clock around a pause).
	if err := c.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	clk.Advance(10 * time.Second)
	if err := c.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	behind := told.Add(time.Second)
	read("after a 10 s pause", behind)

	// Snapshot, an hour passes, restore: the guest resumes at the
	// snapshot's moment.
	url := hibernate(t, ctx, c, dir)
	clk.Advance(time.Hour)
	if err := c.Restore(ctx, ch.RestoreConfig{SourceURL: url, MemoryRestoreMode: ch.RestoreCopy}); err != nil {
		t.Fatal(err)
	}
	clk.Advance(time.Minute) // restored paused: still the snapshot's moment
	if err := c.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	a = dial()
	read("after the restore", behind)
	if n := guestCounter(t, c, "clock_sets"); n != 0 {
		t.Fatalf("clock_sets %d after the restore, want 0 (counted per VMM)", n)
	}
	set, err = a.SetClock(ctx, clk.Now())
	if err != nil || set.Offset() != behind.Sub(clk.Now()) {
		t.Fatalf("SetClock after the restore = offset %v, %v; want %v", set.Offset(), err, behind.Sub(clk.Now()))
	}
	read("after the sync", clk.Now())
}

// An agent that predates the clock verb (NoClockVerb) refuses it, reads
// included, with an error answer and leaves the guest's clock alone.
func TestSimulatedGuestClockRefused(t *testing.T) {
	clk := newFakeClock()
	c, _, dial := clockVM(t, clk, true)
	ctx := gctx(t)
	a := dial()
	var re *agent.RemoteError
	if _, err := a.SetClock(ctx, clk.Now().Add(time.Hour)); !errors.As(err, &re) {
		t.Fatalf("SetClock: %v, want a RemoteError", err)
	}
	if _, err := a.Clock(ctx); !errors.As(err, &re) {
		t.Fatalf("Clock: %v, want a RemoteError", err)
	}
	if err := a.Ready(ctx); err != nil {
		t.Fatalf("ready: %v", err)
	}
	if n := guestCounter(t, c, "clock_sets"); n != 0 {
		t.Fatalf("clock_sets %d, want 0", n)
	}
}
