package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sbxlog/sbxlog/cmd/sandboxd/node/nodetest"
	"github.com/sbxlog/sbxlog/fsm"
	"github.com/sbxlog/sbxlog/projections/api"
)

// volumes list, attach and detach against an in-process node.
func TestVolumesCommands(t *testing.T) {
	img := filepath.Join(t.TempDir(), "data.img")
	if err := os.WriteFile(img, make([]byte, 8192), 0o600); err != nil {
		t.Fatal(err)
	}
	startNodeWith(t, 1, func(o *nodetest.Options) {
		o.Volumes = []fsm.VolumeSpec{{Name: "data", Path: img}, {Name: "other", Path: img + ".missing", Writable: true}}
	})
	if out := mustRun(t, "volumes", "list"); !strings.Contains(out, "data   /volumes/data   8192  true       false") || !strings.Contains(out, "other") {
		t.Fatalf("volumes list:\n%s", out)
	}
	var cl api.ClaimResponse
	mustJSON(t, &cl, "claim", "--template", "default")
	if out := mustRun(t, "volumes", "attach", cl.ID, "data:/mnt/data"); out != cl.ID+" data /mnt/data ro\n" {
		t.Fatalf("volumes attach: %q", out)
	}
	var set api.SandboxVolumes
	mustJSON(t, &set, "volumes", "detach", cl.ID, "data")
	if len(set.Volumes) != 0 {
		t.Fatalf("volumes detach: %+v", set)
	}
	if code, _, errs := sbx("volumes", "attach", cl.ID, "nope"); code != 1 || !strings.Contains(errs, "unknown or not available") {
		t.Fatalf("attach of an unknown volume: exit %d %q", code, errs)
	}
	if code, _, _ := sbx("volumes", "attach", cl.ID); code != 2 {
		t.Fatalf("attach without a volume: exit %d", code)
	}
}
