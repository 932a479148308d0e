package chdriver

import (
	"context"

	"github.com/sbxlog/sbxlog/executors/ch"
)

// API is the part of the CH REST API the recipes call. *ch.Client is the real
// one; tests wrap it to record or fail calls.
type API interface {
	Info(ctx context.Context) (*ch.VmInfo, error)
	Create(ctx context.Context, cfg *ch.VmConfig) error
	Boot(ctx context.Context) error
	Pause(ctx context.Context) error
	Resume(ctx context.Context) error
	Snapshot(ctx context.Context, destinationURL string) error
	Restore(ctx context.Context, rc ch.RestoreConfig) error
	Shutdown(ctx context.Context) error
	AddNet(ctx context.Context, nc ch.NetConfig) (*ch.PciDeviceInfo, error)
	RemoveDevice(ctx context.Context, id string) error
}

var _ API = (*ch.Client)(nil)

// CH call names, as a recording wrapper should report them (the endpoint).
const (
	CallInfo         = "vm.info"
	CallCreate       = "vm.create"
	CallBoot         = "vm.boot"
	CallPause        = "vm.pause"
	CallResume       = "vm.resume"
	CallSnapshot     = "vm.snapshot"
	CallRestore      = "vm.restore"
	CallShutdown     = "vm.shutdown"
	CallAddNet       = "vm.add-net"
	CallRemoveDevice = "vm.remove-device"
)
