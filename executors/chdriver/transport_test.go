package chdriver

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/sbxlog/sbxlog/executors"
	"github.com/sbxlog/sbxlog/executors/layout"
	"github.com/sbxlog/sbxlog/executors/transport"
	"github.com/sbxlog/sbxlog/fsm"
)

// The checkpoint import's steps run through the driver's step hook (the
// SBX_CRASH_AT seam) as recipe checkpoint_import: a crash armed at one of
// them stops the import there, and nothing is left in the store.
func TestImportStepsThroughTheHook(t *testing.T) {
	h := newHarness(t, "")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close() // accepts, never answers: the fetch step is never reached
	h.d.UseTransport(transport.Config{Roots: h.cfg.Roots, Format: transport.FormatOf(string(CHSim)), Token: "t"})
	var seen []string
	crash := errors.New("SBX_CRASH_AT")
	h.setHook(func(_ context.Context, s StepCall) error {
		if s.Recipe == string(fsm.KindCheckpointImport) {
			seen = append(seen, s.Step)
			if s.Step == transport.StepFetch {
				return crash
			}
		}
		return nil
	})
	in := fsm.FetchCheckpoint{OpID: newOp(), Checkpoint: "ck_00aa000000000001", Origin: ln.Addr().String()}
	if _, err := h.d.ImportCheckpoint(context.Background(), in); !errors.Is(err, crash) || executors.IsUnrecoverable(err) {
		t.Fatalf("import: %v, want the hook's crash", err)
	}
	if len(seen) != 3 || seen[0] != transport.StepCheck || seen[1] != transport.StepMkTemp || seen[2] != transport.StepFetch {
		t.Fatalf("hooked steps %v", seen)
	}
	ents, _ := os.ReadDir(h.cfg.Roots.Store)
	for _, e := range ents {
		if e.Name()[0] == '.' {
			t.Errorf("store holds %s", e.Name())
		}
	}
	if _, err := os.Stat(filepath.Join(h.cfg.Roots.Store, layout.CheckpointRel(in.Checkpoint))); err == nil {
		t.Fatal("a checkpoint dir after a crashed import")
	}
}
