package chsim_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sbxlog/sbxlog/executors/ch/chsim"
	"github.com/sbxlog/sbxlog/executors/guest/silkagent/silktest"
	"github.com/sbxlog/sbxlog/executors/guest/silkd"
)

// The tool ops over the simulated guest, through the VM's vsock: the
// whole-tree round trip and fs_watch over its tree (a file created by
// fs_write, as it runs no shell); git and lsp are not simulated.
func TestSimulatedToolOps(t *testing.T) {
	_, _, dial := simVMWith(t, chsim.DefaultOptions(), 256<<20)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	silktest.Tree(t, ctx, func(testing.TB) *silkd.Conn { return dial() }, "/root", 1000, 10<<10, silktest.WriteCreate)
	if _, err := dial().GitStatus(ctx, "/root"); !errors.Is(err, silkd.ErrUnimplemented) {
		t.Fatalf("git_status in the simulated guest = %v, want unimplemented", err)
	}
	if _, err := dial().LspStart(ctx, "go", "/root"); !errors.Is(err, silkd.ErrUnimplemented) {
		t.Fatalf("lsp_start in the simulated guest = %v, want unimplemented", err)
	}
}
