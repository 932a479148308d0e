package e2e

import (
	"context"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sbxlog/sbxlog/executors/guest/guesttest"
	"github.com/sbxlog/sbxlog/projections/api"
	"github.com/sbxlog/sbxlog/projections/apiclient"
)

// ext4Image makes a 16 MiB ext4 image holding files (name -> content).
func ext4Image(t *testing.T, dir, name string, files map[string]string) string {
	t.Helper()
	src := filepath.Join(dir, name+".src")
	if err := os.MkdirAll(src, 0o755); err != nil {
		t.Fatal(err)
	}
	for f, body := range files {
		if err := os.WriteFile(filepath.Join(src, f), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	img := filepath.Join(dir, name+".img")
	mkfs, err := exec.LookPath("mkfs.ext4")
	if err != nil {
		t.Skipf("no mkfs.ext4 to make a volume image: %v", err)
	}
	if out, err := exec.Command(mkfs, "-q", "-F", "-d", src, img, "16M").CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4: %v: %s", err, out)
	}
	return img
}

// serials lists the guest's disks' virtio serials (a serial file has no
// newline), sorted, on one line.
const serials = `for f in /sys/block/*/serial; do cat "$f"; echo; done | sort | tr '\n' ' '`

// TestVolumesQEMU is issue 24's acceptance 5: the built sandboxd on the
// QEMU driver (TCG) with the project's guest and a catalog of ext4 images.
// A claim with a read-only volume sees its files (and cannot write them),
// with a read-write one beside it that it can; a second claim of the
// read-write volume is refused (409); a live attach shows a second volume
// in the running guest at the mount asked for, and a detach takes it away;
// a hibernate and the wake an exec causes keep the volumes mounted.
func TestVolumesQEMU(t *testing.T) {
	g := guesttest.Require(t)
	dir := shortTempDir(t, "volq")
	dataset := ext4Image(t, dir, "dataset", map[string]string{"hello.txt": "hello from the dataset\n"})
	extra := ext4Image(t, dir, "extra", map[string]string{"second.txt": "a second volume\n"})
	scratch := ext4Image(t, dir, "scratch", nil)
	n := startQEMUNode(t, dir, g, map[string]any{"volumes": []any{
		map[string]any{"name": "dataset", "path": dataset},
		map[string]any{"name": "extra", "path": extra},
		map[string]any{"name": "scratch", "path": scratch, "writable": true},
	}})
	root := n.root
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	req := api.ClaimRequest{Template: "default", Volumes: []api.VolumeJSON{{Name: "dataset"}, {Name: "scratch", Mode: "rw", Mount: "/data"}}}
	cl := n.claim(t, ctx, req)
	if len(cl.Volumes) != 2 || cl.Volumes[0].Mount != "/volumes/dataset" || cl.Volumes[1].Mode != "rw" {
		t.Fatalf("claim volumes %+v", cl.Volumes)
	}
	sb := root.WithToken(cl.Token)
	sh := func(script string) (string, int) {
		t.Helper()
		res, err := sb.Exec(ctx, cl.ID, api.ExecRequest{Argv: []string{"sh", "-c", script}, TimeoutSeconds: 120})
		if err != nil {
			t.Fatalf("exec %q: %v", script, err)
		}
		if res.ExitCode != 0 && res.Stderr != "" {
			t.Logf("exec %q: exit %d, stderr %q", script, res.ExitCode, res.Stderr)
		}
		return res.Stdout, int(res.ExitCode)
	}
	if out, code := sh("cat /volumes/dataset/hello.txt"); code != 0 || out != "hello from the dataset\n" {
		t.Fatalf("read-only volume: exit %d, %q", code, out)
	}
	if _, code := sh("echo x > /volumes/dataset/new.txt"); code == 0 {
		t.Fatal("wrote into a read-only volume")
	}
	if out, code := sh("echo written > /data/f && sync && cat /data/f"); code != 0 || out != "written\n" {
		t.Fatalf("read-write volume: exit %d, %q", code, out)
	}

	// The read-write volume is this sandbox's: a second claim is 409.
	_, err := root.Claim(ctx, api.ClaimRequest{Template: "default", Volumes: []api.VolumeJSON{{Name: "scratch"}}})
	var ae *apiclient.Error
	if !errors.As(err, &ae) || ae.Status != http.StatusConflict || !strings.Contains(ae.Message, "volume busy") {
		t.Fatalf("second claim of the read-write volume: %v", err)
	}

	// A live attach shows a second read-only volume in the running guest.
	start := time.Now()
	vs, err := sb.AttachVolumes(ctx, cl.ID, []api.VolumeJSON{{Name: "extra", Mount: "/mnt/extra"}})
	if err != nil || len(vs) != 3 {
		t.Fatalf("attach: %+v, %v", vs, err)
	}
	t.Logf("live attach (hot-plug and mount): %v", time.Since(start))
	if out, code := sh("cat /mnt/extra/second.txt; " + serials); code != 0 || out != "a second volume\ndataset extra scratch " {
		t.Fatalf("live-attached volume: exit %d, %q", code, out)
	}

	// Hibernated and woken (by the next exec), the volumes are still there.
	if err := root.Hibernate(ctx, cl.ID); err != nil {
		t.Fatal(err)
	}
	if out, code := sh("cat /volumes/dataset/hello.txt /mnt/extra/second.txt /data/f"); code != 0 || out != "hello from the dataset\na second volume\nwritten\n" {
		t.Fatalf("after hibernate and wake: exit %d, %q", code, out)
	}

	// Detached, it is gone from the guest.
	if vs, err = sb.DetachVolumes(ctx, cl.ID, []string{"extra"}); err != nil || len(vs) != 2 {
		t.Fatalf("detach: %+v, %v", vs, err)
	}
	if out, code := sh("grep -c ' /mnt/extra ' /proc/mounts; " + serials); out != "0\ndataset scratch " || code != 0 {
		t.Fatalf("after detach: exit %d, %q", code, out)
	}
	if err := root.Release(ctx, cl.ID); err != nil {
		t.Fatal(err)
	}
}
