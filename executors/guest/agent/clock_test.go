package agent

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// guestClock is a settable wall clock, as the guest's CLOCK_REALTIME.
type guestClock struct {
	now  time.Time
	fail error
}

func (c *guestClock) Now() time.Time { return c.now }
func (c *guestClock) Set(t time.Time) error {
	if c.fail != nil {
		return c.fail
	}
	c.now = t
	return nil
}

func TestHandleClock(t *testing.T) {
	behind := time.Unix(1_700_000_000, 5)
	tests := []struct {
		name, req, want string
		noSet, setFails bool
		nilNow          bool
		wantNow         time.Time // the guest's clock after the request
	}{
		{name: "read", req: "#c clock", want: "=c clock 1700000000000000005", wantNow: behind},
		{name: "set answers the time replaced", req: "clock 1700000300000000000", want: "clock 1700000000000000005", wantNow: time.Unix(1_700_000_300, 0)},
		{name: "set refused without SetClock", req: "clock 1700000300000000000", noSet: true, want: "error clock this guest cannot set its clock", wantNow: behind},
		{name: "set that fails", req: "clock 1700000300000000000", setFails: true, want: "error clock operation not permitted", wantNow: behind},
		{name: "not a number", req: "clock soon", want: `error clock bad time "soon" (Unix nanoseconds)`, wantNow: behind},
		{name: "not positive", req: "clock -5", want: `error clock bad time "-5" (Unix nanoseconds)`, wantNow: behind},
		{name: "two args", req: "clock 1 2", want: "error clock usage: clock [<unix ns>]", wantNow: behind},
		{name: "an agent without a clock", req: "clock", nilNow: true, want: "error clock unknown command", wantNow: behind},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := &guestClock{now: behind}
			if tc.setFails {
				c.fail = errors.New("operation not permitted")
			}
			s := newServer(t)
			if !tc.nilNow {
				s.Now = c.Now
			}
			if !tc.noSet {
				s.SetClock = c.Set
			}
			if got := s.Handle(tc.req); !strings.HasPrefix(got, tc.want) {
				t.Fatalf("Handle(%q) = %q, want %q", tc.req, got, tc.want)
			}
			if !c.now.Equal(tc.wantNow) {
				t.Fatalf("guest clock %v after %q, want %v", c.now, tc.req, tc.wantNow)
			}
		})
	}
}

// The host reads the guest's clock, sets it, and learns how far off it was.
func TestClientClock(t *testing.T) {
	c := &guestClock{now: time.Unix(1_700_000_000, 0)}
	s := newServer(t)
	s.Now, s.SetClock = c.Now, c.Set
	cl := pipe(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	got, err := cl.Clock(ctx)
	if err != nil || !got.Equal(c.now) {
		t.Fatalf("Clock = %v, %v; want %v", got, err, c.now)
	}
	host := time.Unix(1_700_000_187, 250_000_000)
	set, err := cl.SetClock(ctx, host)
	if err != nil {
		t.Fatal(err)
	}
	if set.Offset() != -(187*time.Second+250*time.Millisecond) || !c.now.Equal(host) {
		t.Fatalf("SetClock: offset %v, guest now %v; want -3m7.25s and %v", set.Offset(), c.now, host)
	}
	if got, err := cl.Clock(ctx); err != nil || !got.Equal(host) {
		t.Fatalf("Clock after the set = %v, %v", got, err)
	}
	// An agent that predates the verb answers a RemoteError, which the
	// host tells apart from a broken line.
	old := pipe(t, newServer(t))
	var re *RemoteError
	if _, err := old.SetClock(ctx, host); !errors.As(err, &re) || re.Verb != VerbClock {
		t.Fatalf("SetClock on an agent without the verb = %v, want a RemoteError", err)
	}
}

func TestClientRejectsBadClockAnswer(t *testing.T) {
	for _, answer := range []string{"{tag} clock", "{tag} clock later", "{tag} clocks 5"} {
		cl := fakeGuest(t, answer)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := cl.Clock(ctx)
		cancel()
		if err == nil {
			t.Fatalf("answer %q accepted", answer)
		}
	}
}
