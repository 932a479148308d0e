package chdriver

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sbxlog/sbxlog/executors/layout"
)

// A data dir too deep for a VM's sockets is refused at start-up, before any
// recipe, with what to do about it.
func TestPrepareRefusesADataDirTooDeepForSockets(t *testing.T) {
	h := newHarness(t, "")
	cfg := h.cfg
	cfg.Roots = layout.RootsIn(filepath.Join(t.TempDir(), strings.Repeat("d", layout.MaxSocketPath)))
	d, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if _, err := d.Prepare(context.Background()); err == nil || !strings.Contains(err.Error(), "shorter data dir") {
		t.Fatalf("Prepare on a deep data dir = %v, want a socket path error", err)
	}
}
