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
	// Templates is the template table: what each pool template boots.
	// Default: what the build scripts cached (qemu.CachedTemplates: "busybox"
	// from `make guest`'s initramfs, "default" and every other name from
	// executors/guest/template.sh); an entry here adds or replaces one.
	Templates map[string]QEMUTemplate `json:"templates,omitempty"`
	// Kernel and Initrd, if set, are template "default" booting that kernel
	// and initrd without a disk (a shorthand for templates.default).
	Kernel string `json:"kernel,omitempty"`
	Initrd string `json:"initrd,omitempty"`
}

// QEMUTemplate is one template: a kernel and initrd (executors/guest/build.sh)
// and optionally a qcow2 root disk (executors/guest/template.sh's disk.qcow2).
type QEMUTemplate struct {
	Kernel string `json:"kernel"`
	Initrd string `json:"initrd"`
	Disk   string `json:"disk,omitempty"`
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

// newQEMUDriver builds the QEMU driver with the template table of
// qemuTemplates and, when the node has a bridge, its egress lane.
func newQEMUDriver(cfg Config, bin string, roots layout.Roots, instance string, egress *qemu.Egress, zl zerolog.Logger) (*qemu.Driver, error) {
	templates, err := qemuTemplates(cfg.QEMU, qemu.CachedTemplates("", ""))
	if err != nil {
		return nil, err
	}
	stepHook, archiveHook := qemuCrashHooks(zl)
	return qemu.New(qemu.Config{
		Roots: roots, Instance: instance, QEMU: bin, Accel: qemu.Accel(cfg.QEMU.Accel),
		Templates: templates, Egress: egress, Log: zl, Archive: cfg.archive,
		StepHook: stepHook, ArchiveHook: archiveHook,
	})
}

// qemuTemplates is the one place the QEMU template table is made: the cached
// builds, then qemu.kernel/initrd as "default", then qemu.templates; paths
// made absolute.
func qemuTemplates(c QEMUConfig, cached map[string]qemu.Guest) (map[string]qemu.Guest, error) {
	table := make(map[string]qemu.Guest, len(cached)+len(c.Templates)+1)
	for name, g := range cached {
		table[name] = g
	}
	if c.Kernel != "" || c.Initrd != "" {
		table[qemu.TemplateDefault] = qemu.Guest{Kernel: c.Kernel, Initrd: c.Initrd}
	}
	for name, t := range c.Templates {
		table[name] = qemu.Guest{Kernel: t.Kernel, Initrd: t.Initrd, Disk: t.Disk}
	}
	for name, g := range table {
		for _, p := range []*string{&g.Kernel, &g.Initrd, &g.Disk} {
			if *p == "" {
				continue
			}
			abs, err := filepath.Abs(*p)
			if err != nil {
				return nil, fmt.Errorf("qemu template %s: %w", name, err)
			}
			*p = abs
		}
		table[name] = g
	}
	return table, nil
}
