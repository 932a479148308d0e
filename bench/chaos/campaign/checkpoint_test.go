package campaign

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/sbxlog/sbxlog/projections/api"
)

// TestCrashAtCheckpoint: sandboxd killed at a step of a checkpoint (the
// SBX_CRASH_AT seam) finishes it after a restart: the sandbox runs (a crash
// while its VM was paused included), the checkpoint is listed and stands
// in the store once, no temp dir is left, and a claim from it runs.
func TestCrashAtCheckpoint(t *testing.T) {
	for _, step := range []string{"snapshot", "resume", "sync_files", "rename", "sync_tree"} {
		t.Run(step, func(t *testing.T) {
			t.Parallel()
			n, cr := claimedThenStopped(t)
			n.start("SBX_CRASH_AT=checkpoint:" + step)
			// The crash lands while the call waits: a dropped connection.
			if _, err := n.c.Checkpoint(n.ctx, cr.ID, api.CheckpointRequest{}); err == nil || !droppedByCrash(err) {
				t.Fatalf("checkpoint through a crash: %v", err)
			}
			n.crashed()
			n.start()
			var listed []api.CheckpointRecord
			n.waitFor("the checkpoint taken", func() bool {
				listed, _ = n.c.Checkpoints(n.ctx)
				return len(listed) == 1
			})
			if s := n.state(cr.ID); s != "running" {
				t.Fatalf("sandbox %s after the recovery", s)
			}
			n.clean()
			ents, _ := os.ReadDir(filepath.Join(n.d.DataDir, "store", "checkpoint"))
			if len(ents) != 1 || ents[0].Name() != listed[0].ID {
				t.Fatalf("checkpoint store holds %v, want %s", ents, listed[0].ID)
			}
			b, err := n.c.ClaimCheckpoint(n.ctx, listed[0].ID, api.CheckpointClaimRequest{})
			if err != nil || b.FromCheckpoint != listed[0].ID {
				t.Fatalf("claim from the recovered checkpoint: %+v, %v", b, err)
			}
			n.clean()
		})
	}
}
