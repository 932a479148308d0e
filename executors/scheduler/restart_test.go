package scheduler

import (
	"context"
	"strings"
	"testing"

	"github.com/sbxlog/sbxlog/executors"
	"github.com/sbxlog/sbxlog/fsm"
)

// restartingDriver is a fakeDriver that can also restart VMs.
type restartingDriver struct{ fakeDriver }

var _ executors.Restarter = (*restartingDriver)(nil)

func (f *restartingDriver) Restart(ctx context.Context, in fsm.RestartVM) (executors.Result, error) {
	return f.do(ctx, in)
}

// TestSchedulerRestart: a RestartVM intent runs the driver's Restart and
// answers VMRestarted or VMRestartFailed; a driver that cannot restart fails
// it at once (the claim then fails rather than waiting for ever).
func TestSchedulerRestart(t *testing.T) {
	restart := func() fsm.RestartVM {
		return fsm.RestartVM{OpID: nextOp(), Claim: "sb_0000000000000001", VM: "vm-r", Key: key, Instance: "i", RunDir: "i/vm-r"}
	}
	cases := []struct {
		name    string
		d       executors.Driver
		want    string
		wantErr string
		calls   int
	}{
		{"restarted", &restartingDriver{}, "fsm.VMRestarted", "", 1},
		{"restart fails", &restartingDriver{fakeDriver{fn: func(context.Context, fsm.Intent) (executors.Result, error) {
			return executors.Result{}, executors.Unrecoverablef("no disk")
		}}}, "fsm.VMRestartFailed", "no disk", 1},
		{"driver cannot restart", &fakeDriver{}, "fsm.VMRestartFailed", "cannot restart", 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := newProposer()
			sc := newTestScheduler(t, c.d, p, Options{})
			in := restart()
			if in.Kind() != fsm.KindRestart {
				t.Fatalf("kind %q", in.Kind())
			}
			sc.Offer([]fsm.Intent{in})
			cmd := p.next(t)
			var got, msg string
			switch x := cmd.(type) {
			case fsm.VMRestarted:
				got = "fsm.VMRestarted"
				if x.VM != "vm-r" || x.Cause != in.OpID {
					t.Fatalf("result %+v", x)
				}
			case fsm.VMRestartFailed:
				got, msg = "fsm.VMRestartFailed", x.Error
				if x.VM != "vm-r" || x.Cause != in.OpID {
					t.Fatalf("result %+v", x)
				}
			default:
				t.Fatalf("got %T", cmd)
			}
			if got != c.want || !strings.Contains(msg, c.wantErr) {
				t.Fatalf("got %s %q, want %s %q", got, msg, c.want, c.wantErr)
			}
			var calls int
			switch d := c.d.(type) {
			case *restartingDriver:
				calls = d.callCount()
			case *fakeDriver:
				calls = d.callCount()
			}
			if calls != c.calls {
				t.Fatalf("%d driver calls, want %d", calls, c.calls)
			}
		})
	}
}
