package main

import (
	"strings"
	"testing"

	"github.com/sbxlog/sbxlog/fsm"
	"github.com/sbxlog/sbxlog/projections/api"
)

// TestCheckpointCommands drives checkpoint, checkpoints (list, claim, rm)
// and fork, each checked against the node's state.
func TestCheckpointCommands(t *testing.T) {
	n := startNode(t, 2)
	var cl api.ClaimResponse
	mustJSON(t, &cl, "claim", "--template", "default")

	var ck api.CheckpointRecord
	mustJSON(t, &ck, "checkpoint", cl.ID, "--name", "v1")
	if !fsm.ValidCheckpointID(ck.ID) || ck.SandboxID != cl.ID || ck.Name != "v1" {
		t.Fatalf("checkpoint %+v", ck)
	}
	if out := mustRun(t, "checkpoints"); !strings.Contains(out, ck.ID) || !strings.Contains(out, "v1") || !strings.HasPrefix(out, "ID") {
		t.Fatalf("checkpoints:\n%s", out)
	}
	var branch api.ClaimResponse
	mustJSON(t, &branch, "checkpoints", "claim", ck.ID, "--ttl", "2m")
	if rec := claimRec(n, branch.ID); rec.FromCheckpoint != ck.ID || rec.Status != fsm.ClaimRunning || rec.TTLSeconds != 120 {
		t.Fatalf("branch %+v", rec)
	}
	var fr api.ForkResponse
	mustJSON(t, &fr, "fork", cl.ID, "--count", "2", "--ref-prefix", "f/")
	if len(fr.Children) != 2 {
		t.Fatalf("fork %+v", fr)
	}
	for _, c := range fr.Children {
		if rec := claimRec(n, c.ID); rec.Status != fsm.ClaimRunning || rec.ClaimRef != "f/"+c.ID {
			t.Fatalf("child %+v", rec)
		}
	}
	if out := mustRun(t, "checkpoints", "rm", ck.ID); !strings.Contains(out, "deleted") {
		t.Fatalf("rm: %s", out)
	}
	var list api.CheckpointList
	mustJSON(t, &list, "checkpoints")
	if len(list.Checkpoints) != 0 {
		t.Fatalf("listed after rm: %+v", list)
	}
}
