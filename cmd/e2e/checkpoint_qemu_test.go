package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sbxlog/sbxlog/eventlog/event"
	"github.com/sbxlog/sbxlog/executors/guest/guesttest"
	"github.com/sbxlog/sbxlog/executors/guest/silkd"
	"github.com/sbxlog/sbxlog/projections/api"
	"github.com/sbxlog/sbxlog/projections/apiclient"
)

// TestCheckpointQEMU is issue 24's acceptance 1 for checkpoints and forks,
// on the built sandboxd with the QEMU driver (TCG) and the Debian template:
// a running guest with a file in tmpfs and one on its disk is
// checkpointed; two sandboxes claimed from the checkpoint both have the
// files (same sha256), and a write in one is not seen in the other; the
// source, hibernated, is forked 3 ways without waking, each child with
// the files.
func TestCheckpointQEMU(t *testing.T) {
	g := guesttest.RequireDebian(t)
	n := startQEMUNode(t, shortTempDir(t, "ckq"), g, nil)
	addr, data, root := n.addr, n.data, n.root
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	// Claimed once the pool is warm: claims before would each cold-boot a
	// guest, which a loaded host's TCG may not finish in time.
	for deadline := time.Now().Add(20 * time.Minute); ; {
		in, err := root.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if p, ok := poolOf(in, "default/none/small"); ok && p.Warm > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no warm VM: %+v", in)
		}
		time.Sleep(time.Second)
	}
	src, err := root.Claim(ctx, api.ClaimRequest{Template: "default", TTLSeconds: 3600})
	if err != nil {
		t.Fatal(err)
	}
	// sh runs a shell line in sandbox c through its agent relay.
	sh := func(c *api.ClaimResponse, line string) string {
		t.Helper()
		sb, err := apiclient.New(addr, c.Token, nil)
		if err != nil {
			t.Fatal(err)
		}
		nc, err := sb.DialAgent(ctx, c.ID)
		if err != nil {
			t.Fatalf("%s: agent: %v", c.ID, err)
		}
		defer nc.Close()
		var out, errb bytes.Buffer
		res, err := silkd.NewConn(nc).Exec(ctx, silkd.Exec{Argv: []string{"sh", "-c", line}}, silkd.ExecIO{Stdout: &out, Stderr: &errb})
		if err != nil || res.Code != 0 {
			t.Fatalf("%s: %q: %+v %v; stderr %q", c.ID, line, res, err, errb.String())
		}
		return out.String()
	}
	const files = "/dev/shm/mem.bin /root/disk.bin"
	sums := func(c *api.ClaimResponse) string { return sh(c, "sha256sum "+files) }
	// tmpfs (guest memory only) and the root disk.
	if fs := sh(src, "stat -f -c %T /dev/shm /root"); !strings.HasPrefix(fs, "tmpfs\n") || strings.Contains(strings.TrimPrefix(fs, "tmpfs\n"), "tmpfs") {
		t.Fatalf("filesystems: %q, want tmpfs then a disk", fs)
	}
	want := sh(src, "head -c 4M /dev/urandom > /dev/shm/mem.bin && head -c 4M /dev/urandom > /root/disk.bin && sha256sum "+files)

	start := time.Now()
	ck, err := root.Checkpoint(ctx, src.ID, api.CheckpointRequest{Name: "acceptance"})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("checkpoint %s taken in %v; the guest was paused for %v", ck.ID, time.Since(start), pauseWindow(t, ctx, root, ck.ID))
	// The source runs on, unchanged.
	if got := sums(src); got != want {
		t.Fatalf("source after the checkpoint:\n%s\nwant\n%s", got, want)
	}
	var branches []*api.ClaimResponse
	for range 2 {
		start := time.Now()
		b, err := root.ClaimCheckpoint(ctx, ck.ID, api.CheckpointClaimRequest{TTLSeconds: 3600})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("claim from the checkpoint: %s in %v", b.ID, time.Since(start))
		if b.FromCheckpoint != ck.ID {
			t.Fatalf("claim %+v", b)
		}
		if got := sums(b); got != want {
			t.Fatalf("%s has\n%s\nwant\n%s", b.ID, got, want)
		}
		branches = append(branches, b)
	}
	// A write in one is not seen in the other (nor in the source).
	changed := sh(branches[0], "echo one > /root/disk.bin && echo one > /dev/shm/mem.bin && sha256sum "+files)
	if changed == want {
		t.Fatal("the write changed nothing")
	}
	if got := sums(branches[1]); got != want {
		t.Fatalf("the other branch sees the write:\n%s", got)
	}
	if got := sums(src); got != want {
		t.Fatalf("the source sees the write:\n%s", got)
	}
	// Fork 3 from the hibernated source: it stays hibernated.
	if err := root.Hibernate(ctx, src.ID); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	kids, err := root.Fork(ctx, src.ID, api.ForkRequest{Count: 3, TTLSeconds: 3600})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("fork of 3 from the hibernated source in %v", time.Since(start))
	if sb, err := root.Sandbox(ctx, src.ID); err != nil || sb.State != "hibernated" {
		t.Fatalf("source after the fork: %+v, %v", sb, err)
	}
	if len(kids) != 3 {
		t.Fatalf("%d children", len(kids))
	}
	for i := range kids {
		if got := sums(&kids[i]); got != want {
			t.Fatalf("child %s has\n%s\nwant\n%s", kids[i].ID, got, want)
		}
	}
	if err := root.DeleteCheckpoint(ctx, ck.ID); err != nil {
		t.Fatal(err)
	}
	// The checkpoints are removed from the store once nothing reads them
	// (the fork's at once, the deleted one now).
	for deadline := time.Now().Add(time.Minute); ; {
		ents, _ := os.ReadDir(filepath.Join(data, "store", "checkpoint"))
		if len(ents) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("checkpoint store still holds %d entries", len(ents))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// pauseWindow reads checkpoint id's pause window from its checkpoint_taken
// event in the op log (the driver's report).
func pauseWindow(t *testing.T, ctx context.Context, c *apiclient.Client, id string) time.Duration {
	t.Helper()
	st, err := c.Events(ctx, apiclient.EventsOptions{From: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	for {
		ev, err := st.Next()
		if err != nil {
			t.Fatalf("events: %v", err)
		}
		le, err := ev.LogEvent()
		if err != nil || le.Type != "checkpoint_taken" || le.Aggregate.ID != id {
			continue
		}
		var p event.CheckpointTaken
		if err := json.Unmarshal(le.Payload, &p); err != nil || p.Report == nil {
			t.Fatalf("checkpoint_taken %s: %v", le.Payload, err)
		}
		for _, s := range p.Report.Steps {
			if s.Name == "pause_window" && s.NS > 0 {
				return time.Duration(s.NS)
			}
		}
		t.Fatalf("no pause window in %+v", p.Report)
	}
}
