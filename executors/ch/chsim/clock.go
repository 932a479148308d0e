package chsim

import (
	"fmt"
	"time"

	"github.com/sbxlog/sbxlog/executors/guest/agent"
)

// The simulated guest's wall clock and its control agent.
//
// chsim runs on the host, so its guest's clock is simulated and never the
// host's: the agent below answers the clock verb by moving guestClock, and
// nothing in chsim ever sets the host's time.
//
// guestClock follows what a KVM guest's clock does under Cloud Hypervisor:
//   - a booted (or rebooted) guest reads the host's time (its RTC);
//   - it runs with the host's time while the VM runs, and stands still
//     while it is paused: CH saves the KVM clock at vm.pause and sets it
//     back at vm.resume, so the guest does not see the paused time pass;
//   - a snapshot carries it (state.json's guest_clock_ns) and a restore
//     brings it back paused at that moment, so a clone of a golden or a
//     woken VM starts where its snapshot was taken, behind the host by the
//     time since: what the host's clock sync (executors.SyncGuestClock)
//     corrects.

// guestClock is the guest's CLOCK_REALTIME as an offset from the host's.
type guestClock struct {
	offset   time.Duration // guest time minus host time, while running
	pausedAt time.Time     // host time of the pause; zero while running
}

// pausedClock is a clock standing at guest, paused at host time now (a
// restored VM's, before its resume).
func pausedClock(guest, now time.Time) guestClock {
	return guestClock{offset: guest.Sub(now), pausedAt: now}
}

func (c *guestClock) read(now time.Time) time.Time {
	if !c.pausedAt.IsZero() {
		now = c.pausedAt
	}
	return now.Add(c.offset)
}

func (c *guestClock) pause(now time.Time) {
	if c.pausedAt.IsZero() {
		c.pausedAt = now
	}
}

func (c *guestClock) resume(now time.Time) {
	if !c.pausedAt.IsZero() {
		c.offset -= now.Sub(c.pausedAt)
		c.pausedAt = time.Time{}
	}
}

func (c *guestClock) set(guest, now time.Time) {
	if !c.pausedAt.IsZero() {
		now = c.pausedAt
	}
	c.offset = guest.Sub(now)
}

// clockSet is the last clock verb that set the guest's clock, for tests
// (vm.counters' chsim-guest entry): since this VMM's boot or restore, not
// kept in snapshots.
type clockSet struct {
	n   int64     // sets so far
	to  time.Time // the time the host gave
	was time.Time // the guest's clock just before
}

// newLineAgent is the simulated guest's control agent, the protocol of
// package executors/guest/agent on vsock port agent.VsockPort, where a CH
// guest's agent serves it (sbx-agent serves it on a QEMU guest's serial
// line; it has no vsock listener, since no real CH guest runs here). It is
// the real protocol engine over simulated state:
//   - ready and key answer as a real agent does (the key is kept in
//     memory);
//   - clock reads and sets guestClock (unless Options.NoClockVerb, which
//     simulates an agent that predates the verb and refuses it);
//   - write, sha and uptime (which act on a data file and the guest's boot
//     time), net, mount and umount are refused as unknown: a simulated
//     guest has no file on the host to write, no NIC and no block device.
func (s *Server) newLineAgent(v *vmInstance) *agent.Server {
	a := &agent.Server{BootID: fmt.Sprintf("%x", v.bootID)}
	if s.opts.NoClockVerb {
		return a
	}
	a.Now = func() time.Time {
		s.mu.Lock()
		defer s.mu.Unlock()
		return v.clock.read(s.now())
	}
	a.SetClock = func(t time.Time) error {
		s.mu.Lock()
		defer s.mu.Unlock()
		now := s.now()
		was := v.clock.read(now)
		v.clock.set(t, now)
		v.clockSet = clockSet{n: v.clockSet.n + 1, to: t, was: was}
		s.log.Printf("guest clock set to %s (it was %s, off by %s)", t.UTC().Format(time.RFC3339Nano), was.UTC().Format(time.RFC3339Nano), was.Sub(t))
		return nil
	}
	return a
}

// unixNano is t in Unix nanoseconds, 0 for the zero time.
func unixNano(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}
