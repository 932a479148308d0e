package chdriver

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/sbxlog/sbxlog/executors"
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
	// The stream is the guest's from its first byte.
	if _, err := io.WriteString(c, "{\"v\":1,\"op\":\"info\"}\n"); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if line, err := bufio.NewReader(c).ReadString('\n'); err != nil || line == "" {
		t.Fatalf("no answer from the guest port: %q, %v", line, err)
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
