package chdriver

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/sbxlog/sbxlog/fsm"
)

// A volume on chsim: hot-plugged into a running clone with vm.add-disk
// (read-only, its serial, a re-run finding it done), named in the VM's
// config (what a hibernate's config.json keeps for the restore), and
// removed with vm.remove-device (a re-run finding it gone).
func TestVolumeAttachDetach(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "")
	ctx := context.Background()
	golden := h.buildGolden(testKey)
	const vm = "vm-00000000000000c1"
	h.clone(vm, golden)
	img := filepath.Join(t.TempDir(), "dataset.img")
	if err := os.WriteFile(img, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	in := fsm.VolumeIntent{OpID: newOp(), Claim: "sb_00000000000000c1", VM: vm, Key: testKey, Instance: testInstance,
		RunDir: testInstance + "/" + vm, Disk: fsm.VolumeDisk{Name: "dataset", Path: img, Mount: "/volumes/dataset"}}
	for range 2 {
		if _, err := h.d.AttachVolume(ctx, fsm.AttachVolume{VolumeIntent: in}); err != nil {
			t.Fatal(err)
		}
	}
	info, err := h.api(vm).Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if paths := info.Config.DiskPaths(); !slices.Contains(paths, img) {
		t.Fatalf("disks %v, want %s among them", paths, img)
	}
	if ro, _ := info.Config.Get("disks", "1", "readonly"); ro != true {
		t.Fatalf("volume disk readonly = %v", ro)
	}
	if serial, _ := info.Config.Get("disks", "1", "serial"); serial != "dataset" {
		t.Fatalf("volume disk serial = %v", serial)
	}
	for range 2 {
		if _, err := h.d.DetachVolume(ctx, fsm.DetachVolume{VolumeIntent: in}); err != nil {
			t.Fatal(err)
		}
	}
	if info, err = h.api(vm).Info(ctx); err != nil || slices.Contains(info.Config.DiskPaths(), img) {
		t.Fatalf("after detach: %v, %v", info.Config.DiskPaths(), err)
	}
}
