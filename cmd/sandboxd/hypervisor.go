package main

// The hypervisors sandboxd can run, as node.Hypervisor: each opens its
// driver for the node's instance id and adapts the driver's own Prepare and
// exit reports to the node's.

import (
	"context"
	"fmt"

	"github.com/rs/zerolog"

	"github.com/sbxlog/sbxlog/cmd/sandboxd/node"
	"github.com/sbxlog/sbxlog/executors/ch"
	"github.com/sbxlog/sbxlog/executors/chdriver"
	"github.com/sbxlog/sbxlog/executors/layout"
	"github.com/sbxlog/sbxlog/executors/qemu"
	"github.com/sbxlog/sbxlog/executors/vmm"
)

// hypervisor is a node.Hypervisor from a name and an open function.
type hypervisor struct {
	name string
	open func(roots layout.Roots, instance string) (node.Driver, error)
}

func (h hypervisor) Name() string { return h.name }
func (h hypervisor) Open(roots layout.Roots, instance string) (node.Driver, error) {
	return h.open(roots, instance)
}

// chHypervisor runs Cloud Hypervisor, or chsim in its place.
func chHypervisor(cfg Config, name, bin string, zl zerolog.Logger) node.Hypervisor {
	zl.Info().Str("hypervisor", name).Str("binary", bin).Msg("VMM binary")
	return hypervisor{name: name, open: func(roots layout.Roots, instance string) (node.Driver, error) {
		d, err := chdriver.New(chdriver.Config{
			Roots: roots, Instance: instance, VMM: bin, Hypervisor: chdriver.Hypervisor(name),
			CgroupSlice: vmm.DefaultCgroupSlice(), RestoreMode: ch.MemoryRestoreMode(cfg.RestoreMode),
			Bridge: cfg.Bridge, Log: zl, StepHook: crashHook(zl),
		})
		if err != nil {
			return nil, err
		}
		return chNode{d}, nil
	}}
}

type chNode struct{ *chdriver.Driver }

func (c chNode) Prepare(ctx context.Context) (node.Prepared, error) {
	p, err := c.Driver.Prepare(ctx)
	return node.Prepared{CopyMode: p.CopyMode, Swept: p.Swept}, err
}

func (c chNode) OnExit(fn func(vm, detail string)) {
	c.Driver.OnExit(func(e chdriver.Exit) { fn(e.VM, fmt.Sprintf("VMM (pid %d) exited", e.Pid)) })
}

// qemuHypervisor runs real guests under QEMU.
func qemuHypervisor(cfg Config, bin string, zl zerolog.Logger) node.Hypervisor {
	zl.Info().Str("hypervisor", "qemu").Str("binary", bin).Msg("VMM binary")
	return hypervisor{name: "qemu", open: func(roots layout.Roots, instance string) (node.Driver, error) {
		d, err := newQEMUDriver(cfg, bin, roots, instance, zl)
		if err != nil {
			return nil, err
		}
		return qemuNode{d}, nil
	}}
}

type qemuNode struct{ *qemu.Driver }

func (q qemuNode) Prepare(ctx context.Context) (node.Prepared, error) {
	p, err := q.Driver.Prepare(ctx)
	return node.Prepared{CopyMode: p.CopyMode, Swept: p.Swept}, err
}

func (q qemuNode) OnExit(fn func(vm, detail string)) {
	q.Driver.OnExit(func(e qemu.Exit) { fn(e.VM, fmt.Sprintf("QEMU (pid %d) exited", e.Pid)) })
}
