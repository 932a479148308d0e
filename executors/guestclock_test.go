package executors_test

import (
	"bytes"
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/sbxlog/sbxlog/executors"
	"github.com/sbxlog/sbxlog/executors/guest/agent"
)

// SyncGuestClock: the offset it returns and the line it logs, by how far
// the guest was off; a refusal is a warning with offset 0, a dead agent an
// error.
func TestSyncGuestClock(t *testing.T) {
	host := time.Date(2026, 12, 2, 9, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name      string
		guestOff  time.Duration
		refuse    bool
		dead      bool
		wantLevel string
		wantErr   bool
	}{
		{name: "a second behind: info", guestOff: -time.Second, wantLevel: `"level":"info"`},
		{name: "an hour ahead: info", guestOff: time.Hour, wantLevel: `"level":"info"`},
		{name: "under a second: debug", guestOff: -999 * time.Millisecond, wantLevel: `"level":"debug"`},
		{name: "verb refused: warning", refuse: true, wantLevel: `"level":"warn"`},
		{name: "agent gone: error", dead: true, wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			guest := host.Add(tc.guestOff)
			srv := &agent.Server{BootID: "b"}
			if !tc.refuse {
				srv.Now = func() time.Time { return guest }
				srv.SetClock = func(t time.Time) error { guest = t; return nil }
			}
			hostEnd, guestEnd := net.Pipe()
			t.Cleanup(func() { hostEnd.Close(); guestEnd.Close() })
			if tc.dead {
				guestEnd.Close()
			} else {
				go func() { _ = srv.Serve(guestEnd, guestEnd) }()
			}
			var logs bytes.Buffer
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			off, err := executors.SyncGuestClock(ctx, agent.NewClient(hostEnd), host, zerolog.New(&logs).Level(zerolog.DebugLevel), "drv")
			if tc.wantErr {
				var re *agent.RemoteError
				if err == nil || errors.As(err, &re) {
					t.Fatalf("err %v, want a transport error", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			wantOff := tc.guestOff
			if tc.refuse {
				wantOff = 0
			}
			if off != wantOff {
				t.Fatalf("offset %v, want %v", off, wantOff)
			}
			if !tc.refuse && !guest.Equal(host) {
				t.Fatalf("guest clock %v after the sync, want %v", guest, host)
			}
			if l := logs.String(); !strings.Contains(l, tc.wantLevel) || !strings.Contains(l, `"message":"drv: `) {
				t.Fatalf("log %q, want %s and the driver's prefix", l, tc.wantLevel)
			}
		})
	}
}
