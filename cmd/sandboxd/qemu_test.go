package main

import (
	"maps"
	"path/filepath"
	"testing"

	"github.com/sbxlog/sbxlog/executors/qemu"
)

// The template table: the cached builds, then qemu.kernel/initrd as
// "default", then qemu.templates, with relative paths made absolute.
func TestQEMUTemplates(t *testing.T) {
	cached := map[string]qemu.Guest{
		"busybox": {Dir: "/c/g", Kernel: "/c/g/vmlinuz", Initrd: "/c/g/initrd.img"},
		"default": {Dir: "/c/t", Kernel: "/c/g/vmlinuz", Initrd: "/c/g/initrd.img", Disk: "/c/t/disk.qcow2"},
	}
	wd, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		cfg  QEMUConfig
		want map[string]qemu.Guest
	}{
		{"cached only", QEMUConfig{}, cached},
		{"kernel and initrd replace default", QEMUConfig{Kernel: "/k", Initrd: "i"}, map[string]qemu.Guest{
			"busybox": cached["busybox"],
			"default": {Kernel: "/k", Initrd: filepath.Join(wd, "i")},
		}},
		{"templates add and replace", QEMUConfig{Kernel: "/k", Initrd: "/i", Templates: map[string]QEMUTemplate{
			"default": {Kernel: "/k2", Initrd: "/i2", Disk: "/d.qcow2"},
			"py":      {Kernel: "/k", Initrd: "/i", Disk: "py.qcow2"},
		}}, map[string]qemu.Guest{
			"busybox": cached["busybox"],
			"default": {Kernel: "/k2", Initrd: "/i2", Disk: "/d.qcow2"},
			"py":      {Kernel: "/k", Initrd: "/i", Disk: filepath.Join(wd, "py.qcow2")},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := qemuTemplates(tc.cfg, cached)
			if err != nil {
				t.Fatal(err)
			}
			if !maps.Equal(got, tc.want) {
				t.Fatalf("got %+v\nwant %+v", got, tc.want)
			}
		})
	}
}
