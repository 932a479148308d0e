package e2e

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sbxlog/sbxlog/executors/archive"
	"github.com/sbxlog/sbxlog/executors/guest/silkd"
	"github.com/sbxlog/sbxlog/projections/api"
	"github.com/sbxlog/sbxlog/projections/apiclient"
)

// archiveDir is a fresh archive dir, on another filesystem than the data
// dir where the host has one (/dev/shm, a tmpfs), else a temp dir.
func archiveDir(t *testing.T) string {
	t.Helper()
	if d, err := os.MkdirTemp("/dev/shm", "sbx-archive-"); err == nil {
		t.Cleanup(func() { os.RemoveAll(d) })
		return d
	}
	return t.TempDir()
}

// archives lists the complete archives under dir (<instance>/<name> with
// a manifest).
func archives(t *testing.T, dir string) []string {
	t.Helper()
	found, err := filepath.Glob(filepath.Join(dir, "*", "*", archive.ManifestFile))
	if err != nil {
		t.Fatal(err)
	}
	return found
}

// archivingClaim starts a chsim node with archive store adir (wrapped by
// wrap, as startChsimNodeWith), gives it a pool of "e2e" and claims a
// sandbox with on_expire "archive" and a lease of ttl seconds, retrying
// until the pool's golden is ready.
func archivingClaim(ctx context.Context, t *testing.T, root, adir string, ttl int64, wrap ...string) (*chsimNode, *api.ClaimResponse) {
	t.Helper()
	n := startChsimNodeWith(t, root, map[string]any{"archive_dir": adir}, wrap...)
	if _, err := n.c.SetPools(ctx, api.PoolsRequest{Pools: []api.PoolSpec{{Template: "e2e", Warm: 1}}}); err != nil {
		t.Fatalf("PUT pools: %v", err)
	}
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(50 * time.Millisecond) {
		cr, err := n.c.Claim(ctx, api.ClaimRequest{Template: "e2e", TTLSeconds: ttl, OnExpire: "archive"})
		if err == nil {
			return n, cr
		}
		if time.Now().After(deadline) {
			t.Fatalf("claim: %v", err)
		}
	}
}

// TestArchiveOnExpireEndToEnd: against the built sandboxd on chsim with an
// archive_dir, a claim with on_expire "archive" is hibernated and archived
// at the end of its lease (its local snapshot gone, the archive complete,
// GET showing it archived); a wake copies it back and restores it with the
// file written before intact, and deletes the archive. A node without an
// archive_dir still refuses on_expire "archive" (covered by the API's bad
// input table); one whose archive_dir is not a directory does not start.
func TestArchiveOnExpireEndToEnd(t *testing.T) {
	const root = "e2e-root-token"
	adir := archiveDir(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	n, cr := archivingClaim(ctx, t, root, adir, 3)
	c := n.c
	content := strings.Repeat("kept through the archive\n", 1000)
	g, err := agentConn(ctx, n.addr, cr.ID, cr.Token)
	if err != nil {
		t.Fatal(err)
	}
	if err := g.WriteFile(ctx, silkd.FsWrite{Path: "/root/kept"}, strings.NewReader(content)); err != nil {
		t.Fatal(err)
	}
	g.Close()

	// The lease ends: hibernated, then archived.
	awaitState(t, ctx, c, cr.ID, "archived")
	sb, err := c.Sandbox(ctx, cr.ID)
	if err != nil || !sb.Archived || sb.Hibernated || sb.OnExpire != "archive" {
		t.Fatalf("archived sandbox: %+v, %v", sb, err)
	}
	if got := archives(t, adir); len(got) != 1 {
		t.Fatalf("archives in %s: %v", adir, got)
	}
	if snaps, _ := os.ReadDir(filepath.Join(n.data, "store", "hibernate")); len(snaps) != 0 {
		t.Fatalf("local hibernate snapshots left after the archive: %v", snaps)
	}
	// A renew of an archived sandbox is the old daemon's 409.
	if _, err := c.Renew(ctx, cr.ID, 60); apiclient.StatusOf(err) != 409 {
		t.Fatalf("renew of an archived sandbox: %v, want 409", err)
	}

	// A wake copies it back and restores it: the file is there.
	if err := c.Wake(ctx, cr.ID); err != nil {
		t.Fatalf("wake from the archive: %v", err)
	}
	// The wake granted a fresh 3 s lease, whose end archives it again: a
	// longer one keeps it running for the checks below.
	if _, err := c.Renew(ctx, cr.ID, 600); err != nil {
		t.Fatalf("renew after the wake: %v", err)
	}
	if sb, err := c.Sandbox(ctx, cr.ID); err != nil || sb.State != "running" || sb.Archived {
		t.Fatalf("after the wake: %+v, %v", sb, err)
	}
	g, err = agentConn(ctx, n.addr, cr.ID, cr.Token)
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if _, err := g.ReadFile(ctx, "/root/kept", &b); err != nil || b.String() != content {
		t.Fatalf("file after the wake from the archive: %d bytes, %v", b.Len(), err)
	}
	g.Close()
	if got := archives(t, adir); len(got) != 0 {
		t.Fatalf("archive not deleted after the wake: %v", got)
	}
	if err := c.Release(ctx, cr.ID); err != nil {
		t.Fatal(err)
	}
}

// TestArchiveCrashAtEachStep: sandboxd killed (SIGKILL, the SBX_CRASH_AT
// seam) at a step of the archive or the unarchive recipe, then restarted
// without the seam, finishes the operation: archived once (one complete
// archive, no local snapshot), woken with the file intact, the archive
// deleted.
func TestArchiveCrashAtEachStep(t *testing.T) {
	const root = "e2e-root-token"
	for i, spec := range []string{
		"archive:check", "archive:put", "archive:remove_local",
		"unarchive:mktemp", "unarchive:get", "unarchive:rename", "unarchive:delete_archive",
	} {
		// Numbered, not named: the data dir (from the test's name) must
		// stay short enough for a VM's socket paths.
		t.Run(strconv.Itoa(i), func(t *testing.T) {
			t.Logf("SBX_CRASH_AT=%s", spec)
			adir := archiveDir(t)
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			n, cr := archivingClaim(ctx, t, root, adir, 4, "env", "SBX_CRASH_AT="+spec)
			c := n.c
			g, err := agentConn(ctx, n.addr, cr.ID, cr.Token)
			if err != nil {
				t.Fatal(err)
			}
			if err := g.WriteFile(ctx, silkd.FsWrite{Path: "/root/kept"}, strings.NewReader(spec)); err != nil {
				t.Fatal(err)
			}
			g.Close()
			restart := func() {
				t.Helper()
				select {
				case <-n.daemon.exited:
				case <-time.After(90 * time.Second):
					t.Fatalf("sandboxd did not crash at %s", spec)
				}
				n.daemon = startDaemon(t, n.dir, n.data, n.addr, "-config", filepath.Join(n.dir, "sandboxd.json"))
			}
			if strings.HasPrefix(spec, "archive:") {
				restart()
			}
			awaitState(t, ctx, c, cr.ID, "archived")
			if got := archives(t, adir); len(got) != 1 {
				t.Fatalf("archives: %v", got)
			}
			if strings.HasPrefix(spec, "unarchive:") {
				if _, err := c.WakeNoWait(ctx, cr.ID); err != nil {
					// The crash may beat the 202 to the socket: the
					// unarchive starts only once the wake is durable, so
					// a daemon dying now recorded it.
					select {
					case <-n.daemon.exited:
					case <-time.After(30 * time.Second):
						t.Fatalf("wake: %v (and sandboxd did not crash)", err)
					}
				}
				restart()
			} else if err := c.Wake(ctx, cr.ID); err != nil {
				t.Fatalf("wake: %v", err)
			}
			awaitState(t, ctx, c, cr.ID, "running")
			// The wake's fresh lease is as short as the claim's: a longer
			// one keeps the sandbox running for the checks below.
			if _, err := c.Renew(ctx, cr.ID, 600); err != nil {
				t.Fatalf("renew after the wake: %v", err)
			}
			g, err = agentConn(ctx, n.addr, cr.ID, cr.Token)
			if err != nil {
				t.Fatal(err)
			}
			var b bytes.Buffer
			if _, err := g.ReadFile(ctx, "/root/kept", &b); err != nil || b.String() != spec {
				t.Fatalf("file after the wake: %q, %v", b.String(), err)
			}
			g.Close()
			if got := archives(t, adir); len(got) != 0 {
				t.Fatalf("archive left after the wake: %v", got)
			}
			if err := c.Release(ctx, cr.ID); err != nil {
				t.Fatal(err)
			}
		})
	}
}
