package main

// The hypervisors sandboxd can run, as node.Hypervisor: each opens its
// driver for the node's instance id and adapts the driver's own Prepare and
// exit reports to the node's.

import (
	"context"
	"errors"
	"fmt"

	"github.com/rs/zerolog"

	"github.com/sbxlog/sbxlog/cmd/sandboxd/node"
	"github.com/sbxlog/sbxlog/executors/ch"
	"github.com/sbxlog/sbxlog/executors/chdriver"
	"github.com/sbxlog/sbxlog/executors/layout"
	"github.com/sbxlog/sbxlog/executors/procstat"
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

// chHV runs Cloud Hypervisor, or chsim in its place; with guarded egress
// (OpenGuarded, proxy.go) its driver locks egress taps and opens doors.
type chHV struct {
	cfg       Config
	name, bin string
	zl        zerolog.Logger
}

var _ node.GuardedOpener = chHV{}

// chHypervisor runs Cloud Hypervisor, or chsim in its place.
func chHypervisor(cfg Config, name, bin string, zl zerolog.Logger) node.Hypervisor {
	zl.Info().Str("hypervisor", name).Str("binary", bin).Msg("VMM binary")
	return chHV{cfg: cfg, name: name, bin: bin, zl: zl}
}

func (h chHV) Name() string { return h.name }

func (h chHV) Open(roots layout.Roots, instance string) (node.Driver, error) {
	return h.openWith(roots, instance, func(*chdriver.Config) {})
}

func (h chHV) openWith(roots layout.Roots, instance string, with func(*chdriver.Config)) (node.Driver, error) {
	c := chdriver.Config{
		Roots: roots, Instance: instance, VMM: h.bin, Hypervisor: chdriver.Hypervisor(h.name),
		CgroupSlice: vmm.DefaultCgroupSlice(), RestoreMode: ch.MemoryRestoreMode(h.cfg.RestoreMode),
		Bridge: h.cfg.Bridge, Log: h.zl, StepHook: crashHook(h.zl), Archive: h.cfg.archive,
	}
	with(&c)
	d, err := chdriver.New(c)
	if err != nil {
		return nil, err
	}
	return chNode{d}, nil
}

type chNode struct{ *chdriver.Driver }

func (c chNode) Prepare(ctx context.Context) (node.Prepared, error) {
	p, err := c.Driver.Prepare(ctx)
	return node.Prepared{CopyMode: p.CopyMode, Swept: p.Swept}, err
}

func (c chNode) OnExit(fn func(vm, detail string)) {
	c.Driver.OnExit(func(e chdriver.Exit) { fn(e.VM, fmt.Sprintf("VMM (pid %d) exited", e.Pid)) })
}

func (c chNode) VMMUsage(_ context.Context, vm, runDir string) (procstat.Usage, error) {
	pid, err := c.Driver.VMMPid(vm, runDir)
	return usageOf(pid, err, vmm.ErrNoProcess, vmm.ErrNotOurs)
}

// qemuHypervisor runs real guests under QEMU; with guarded egress
// (OpenGuarded, proxy.go) its egress pools' VMs get locked taps and doors.
func qemuHypervisor(cfg Config, bin string, zl zerolog.Logger) node.Hypervisor {
	zl.Info().Str("hypervisor", "qemu").Str("binary", bin).Msg("VMM binary")
	return qemuHV{cfg: cfg, bin: bin, zl: zl}
}

type qemuHV struct {
	cfg Config
	bin string
	zl  zerolog.Logger
}

var _ node.GuardedOpener = qemuHV{}

func (h qemuHV) Name() string { return "qemu" }

func (h qemuHV) Open(roots layout.Roots, instance string) (node.Driver, error) {
	return h.OpenGuarded(roots, instance, node.Guarded{})
}

type qemuNode struct{ *qemu.Driver }

func (q qemuNode) Prepare(ctx context.Context) (node.Prepared, error) {
	p, err := q.Driver.Prepare(ctx)
	return node.Prepared{CopyMode: p.CopyMode, Swept: p.Swept}, err
}

func (q qemuNode) OnExit(fn func(vm, detail string)) {
	q.Driver.OnExit(func(e qemu.Exit) { fn(e.VM, fmt.Sprintf("QEMU (pid %d) exited", e.Pid)) })
}

func (q qemuNode) VMMUsage(_ context.Context, vm, runDir string) (procstat.Usage, error) {
	pid, err := q.Driver.VMMPid(vm, runDir)
	return usageOf(pid, err, qemu.ErrNotRunning)
}

// usageOf reads the usage of the VMM a driver's VMMPid found. Its errors
// that are one of none mean that no VMM runs: procstat.ErrNoProcess, as
// node.Driver's VMMUsage reports it.
func usageOf(pid int, err error, none ...error) (procstat.Usage, error) {
	for _, n := range none {
		if errors.Is(err, n) {
			return procstat.Usage{}, fmt.Errorf("%w: %v", procstat.ErrNoProcess, err)
		}
	}
	if err != nil {
		return procstat.Usage{}, err
	}
	return procstat.Read(pid)
}
