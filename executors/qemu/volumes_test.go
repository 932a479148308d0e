package qemu

import (
	"slices"
	"strings"
	"testing"

	"github.com/sbxlog/sbxlog/fsm"
)

// A machine's volumes are on its command line with their slots (what a
// restore of a hibernated VM with volumes needs), read-only unless RW; the
// slots are taken lowest first and run out after fsm.MaxClaimVolumes.
func TestVolumeArgsAndSlots(t *testing.T) {
	m := Meta{Machine: "pc", Accel: AccelTCG, MemoryMiB: 256, Kernel: "/k", Initrd: "/i",
		Volumes: []MetaVolume{{Name: "data", Path: "/srv/a,b.img", Slot: 0x18}, {Name: "db", Path: "/srv/db.img", RW: true, Slot: 0x19}}}
	args := strings.Join(cmdline("/run/vm", m, true), " ")
	for _, want := range []string{
		"-blockdev driver=raw,node-name=vol-data,read-only=on,file.driver=file,file.filename=/srv/a,,b.img",
		"-device virtio-blk-pci,drive=vol-data,id=vol-data,serial=data,addr=0x18",
		"-blockdev driver=raw,node-name=vol-db,read-only=off,file.driver=file,file.filename=/srv/db.img",
		"-device virtio-blk-pci,drive=vol-db,id=vol-db,serial=db,addr=0x19",
	} {
		if !strings.Contains(args, want) {
			t.Errorf("cmdline lacks %q:\n%s", want, args)
		}
	}
	var vs []MetaVolume
	var slots []int
	for range fsm.MaxClaimVolumes {
		s, err := freeSlot(vs)
		if err != nil {
			t.Fatal(err)
		}
		slots = append(slots, s)
		vs = append(vs, MetaVolume{Slot: s})
	}
	if slots[0] != VolumeFirstSlot || !slices.IsSorted(slots) || slots[len(slots)-1] != VolumeFirstSlot+fsm.MaxClaimVolumes-1 {
		t.Fatalf("slots %v", slots)
	}
	if _, err := freeSlot(vs); err == nil {
		t.Fatal("a ninth slot")
	}
	// A slot freed by a detach is reused.
	vs = slices.Delete(vs, 2, 3)
	if s, _ := freeSlot(vs); s != VolumeFirstSlot+2 {
		t.Fatalf("freed slot: %#x", s)
	}
}
