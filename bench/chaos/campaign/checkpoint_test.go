package campaign

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/sbxlog/sbxlog/projections/api"
	"github.com/sbxlog/sbxlog/projections/apiclient"
)

// TestCrashAtCheckpoint: sandboxd killed at a step of a checkpoint (the
// SBX_CRASH_AT seam) finishes it after a restart: the sandbox runs (a crash
// while its VM was paused included), the checkpoint is listed and stands
// in the store once, no temp dir is left, and a claim from it runs.
func TestCrashAtCheckpoint(t *testing.T) {
	for _, step := range []string{"pause", "snapshot", "clone_disk", "resume", "sync_files", "write_meta", "rename", "sync_tree"} {
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

// TestCrashAtSnapshotOfHibernated: sandboxd killed while it copies a
// hibernated sandbox's image into a checkpoint or a promoted template
// (SBX_CRASH_AT=<recipe>:<step>: link_memory, the copy's first step after
// its temp dir, and later ones) keeps that image through the restart's
// sweep: the copy is finished,
// the sandbox stays hibernated on its own snapshot and wakes from it, and
// the store holds what the state references.
func TestCrashAtSnapshotOfHibernated(t *testing.T) {
	for _, at := range []string{"checkpoint:link_memory", "checkpoint:clone_disk", "checkpoint:rename", "promote:link_memory", "promote:sync_tree"} {
		recipe, step, _ := strings.Cut(at, ":")
		t.Run(at, func(t *testing.T) {
			t.Parallel()
			n, cr := claimedThenStopped(t)
			n.start()
			if err := n.c.Hibernate(n.ctx, cr.ID); err != nil {
				t.Fatal(err)
			}
			n.waitFor("hibernated", func() bool { return n.state(cr.ID) == "hibernated" })
			n.stop()
			n.start("SBX_CRASH_AT=" + recipe + ":" + step)
			var err error
			if recipe == "checkpoint" {
				_, err = n.c.Checkpoint(n.ctx, cr.ID, api.CheckpointRequest{})
			} else {
				_, err = n.c.Promote(n.ctx, cr.ID, cr.Token, "fromimage")
			}
			if err == nil || !droppedByCrash(err) {
				t.Fatalf("%s through a crash: %v", recipe, err)
			}
			n.crashed()
			n.start()
			n.waitFor("the copy finished", func() bool {
				if recipe == "checkpoint" {
					l, _ := n.c.Checkpoints(n.ctx)
					return len(l) == 1
				}
				in, err := n.c.Info(n.ctx)
				return err == nil && len(in.Templates) == 1
			})
			n.clean()
			if s := n.state(cr.ID); s != "hibernated" {
				t.Fatalf("sandbox %s after the recovery, want hibernated", s)
			}
			n.waitFor("the store holding what the state references", n.storeMatches)
			if err := n.c.Wake(n.ctx, cr.ID); err != nil {
				t.Fatalf("wake after the recovery: %v", err)
			}
			n.clean()
		})
	}
}

// TestCrashAtCheckpointVMMDies: sandboxd killed past a checkpoint's rename
// (SBX_CRASH_AT=checkpoint:sync_tree, the VM resumed), and the sandbox's
// VMM killed while sandboxd is down: the restart does not leave the sandbox
// running on a dead VMM (its VM is lost with the checkpoint, and restarted
// or failed by the restart policy), and the store holds what the state
// references.
func TestCrashAtCheckpointVMMDies(t *testing.T) {
	n, cr := claimedThenStopped(t)
	n.start("SBX_CRASH_AT=checkpoint:sync_tree")
	if _, err := n.c.Checkpoint(n.ctx, cr.ID, api.CheckpointRequest{}); err == nil || !droppedByCrash(err) {
		t.Fatalf("checkpoint through a crash: %v", err)
	}
	n.crashed()
	runDir := filepath.Join(n.d.DataDir, "run", n.d.Instance(), cr.VM)
	killed := 0
	for _, p := range VMMsUnder(runDir) {
		if filepath.Dir(p.Socket) == runDir && syscall.Kill(p.Pid, syscall.SIGKILL) == nil {
			killed++
		}
	}
	if killed != 1 {
		t.Fatalf("killed %d VMMs of %s", killed, cr.VM)
	}
	n.waitFor("the VMM gone", func() bool { return len(VMMsUnder(runDir)) == 0 })
	n.start()
	n.clean()
	if s := n.state(cr.ID); s != "running" && s != "failed" {
		t.Fatalf("sandbox %s after the recovery", s)
	}
	n.waitFor("the store holding what the state references", n.storeMatches)
}

// TestCrashAtFork: sandboxd killed while a fork is taken (its source's
// snapshot, the children's clones from it, the source's removal): after
// the restart the fork is all or none (every child runs, or every child
// failed and none runs), no orphan, and the store holds what the state
// references (the fork's source collected).
func TestCrashAtFork(t *testing.T) {
	for _, at := range []string{"checkpoint:snapshot", "checkpoint:rename", "clone:restore", "clone:probe", "checkpoint_delete:remove_snap"} {
		t.Run(at, func(t *testing.T) {
			t.Parallel()
			n := newNode(t, PoolConf{Template: "default", Net: "none", Size: "small", Warm: 1})
			n.start()
			n.waitFor("warm", n.warm(1))
			cr := n.claim()
			n.stop()
			n.start("SBX_CRASH_AT=" + at)
			go func() { _, _ = n.c.Fork(n.ctx, cr.ID, api.ForkRequest{Count: 2}) }()
			n.crashed()
			n.start()
			n.clean()
			n.waitFor("the store holding what the state references", n.storeMatches)
			sbs, err := n.c.Sandboxes(n.ctx, apiclient.ListOptions{})
			if err != nil {
				t.Fatal(err)
			}
			children := 0
			for _, sb := range sbs {
				if sb.ID != cr.ID && sb.State == "running" {
					children++
				}
			}
			if children != 0 && children != 2 {
				t.Fatalf("%d of the fork's 2 children run: neither all nor none (%+v)", children, sbs)
			}
			if s := n.state(cr.ID); s != "running" {
				t.Fatalf("the fork's parent is %s", s)
			}
		})
	}
}
