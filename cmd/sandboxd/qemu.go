package main

import (
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"

	"github.com/rs/zerolog"

	"github.com/sbxlog/sbxlog/executors/layout"
	"github.com/sbxlog/sbxlog/executors/qemu"
)

// QEMUConfig is the "qemu" section of the config, used with hypervisor qemu
// (executors/qemu).
type QEMUConfig struct {
	// Binary is the emulator (default qemu-system-x86_64 from PATH).
	Binary string `json:"binary,omitempty"`
	// Accel: kvm, tcg or auto (default: KVM only if a short probe boot
	// answers, else TCG).
	Accel string `json:"accel,omitempty"`
	// Kernel and Initrd are the guest every template boots. Default: the
	// newest build of `make guest` in ${SBX_CACHE:-~/.cache/sbxlog}/guest.
	Kernel string `json:"kernel,omitempty"`
	Initrd string `json:"initrd,omitempty"`
}

func (c QEMUConfig) validate() error {
	if _, err := qemu.ParseAccel(c.Accel); err != nil {
		return fmt.Errorf("qemu.accel %q: want kvm, tcg or auto", c.Accel)
	}
	return nil
}

// resolveQEMU finds the emulator binary.
func resolveQEMU(cfg Config) (string, error) {
	bin := cfg.QEMU.Binary
	if bin == "" {
		bin = "qemu-system-x86_64"
	}
	p, err := exec.LookPath(bin)
	if err != nil {
		return "", errors.New("hypervisor qemu: " + bin + " not found (apt-get install qemu-system-x86, or set qemu.binary)")
	}
	return filepath.Abs(p)
}

// newQEMUDriver builds the QEMU driver; the guest defaults to the newest
// cached `make guest` build.
func newQEMUDriver(cfg Config, bin string, roots layout.Roots, instance string, egress *qemu.Egress, zl zerolog.Logger) (*qemu.Driver, error) {
	kernel, initrd := cfg.QEMU.Kernel, cfg.QEMU.Initrd
	if kernel == "" && initrd == "" {
		if g, ok := qemu.CachedGuest(""); ok {
			kernel, initrd = g.Kernel, g.Initrd
		}
	}
	for _, p := range []*string{&kernel, &initrd} {
		if *p != "" {
			abs, err := filepath.Abs(*p)
			if err != nil {
				return nil, err
			}
			*p = abs
		}
	}
	return qemu.New(qemu.Config{
		Roots: roots, Instance: instance, QEMU: bin, Accel: qemu.Accel(cfg.QEMU.Accel),
		Kernel: kernel, Initrd: initrd, Egress: egress, Log: zl,
	})
}
