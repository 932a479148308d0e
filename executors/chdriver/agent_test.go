package chdriver

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/sbxlog/sbxlog/executors"
	"github.com/sbxlog/sbxlog/executors/ch/chsim"
	"github.com/sbxlog/sbxlog/executors/guest/silkd"
)

// DialAgent reaches the guest's silkd port of a running VM, and reports a
// VM that is not running (or not this instance's) as unreachable.
func TestDialAgent(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "")
	golden := h.buildGolden(testKey)
	const vm = "vm-00000000000000d1"
	h.clone(vm, golden)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	c, err := h.d.DialAgent(ctx, testInstance+"/"+vm)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, ok := c.(*net.UnixConn); !ok {
		t.Fatalf("DialAgent returned %T, want the raw *net.UnixConn", c)
	}
	// The stream is the agent's from its first byte: under chsim, its
	// simulated one, which says so.
	info, err := silkd.NewConn(c).Info(ctx)
	if err != nil || !info.Simulated || info.Agent != chsim.SimAgent {
		t.Fatalf("info through DialAgent = %+v, %v", info, err)
	}

	for _, rel := range []string{testInstance + "/vm-00000000000000d2", "other/" + vm} {
		_, err := h.d.DialAgent(ctx, rel)
		if !errors.Is(err, executors.ErrAgentUnreachable) {
			t.Errorf("DialAgent(%s) = %v, want ErrAgentUnreachable", rel, err)
		}
	}
	var u *executors.Unrecoverable
	if _, err := h.d.DialAgent(ctx, "other/"+vm); !errors.As(err, &u) {
		t.Errorf("another instance's run dir: %v, want Unrecoverable too", err)
	}
}
