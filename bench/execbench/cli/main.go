// Command cli is execbench's comparator: the old daemon's path, where every
// executor operation was one fork+exec of a VM-manager CLI. It performs ONE
// clone per invocation with the same chdriver recipe the worker pool runs
// in-process, prints the step report as JSON and exits; the VMM it started
// keeps running (its own process group), as with the old CLI.
//
//	cli -data DIR -instance ID -vmm PATH -vm ID -golden REL [-size small]
//
// It never sweeps the store (Prepare): other invocations run beside it.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/oklog/ulid/v2"
	"github.com/rs/zerolog"

	"github.com/sbxlog/sbxlog/executors/chdriver"
	"github.com/sbxlog/sbxlog/executors/layout"
	"github.com/sbxlog/sbxlog/fsm"
)

func main() {
	data := flag.String("data", "", "data directory (run, store, templates)")
	instance := flag.String("instance", "", "instance id")
	vmmBin := flag.String("vmm", "", "VMM binary (absolute path)")
	vm := flag.String("vm", "", "VM id")
	golden := flag.String("golden", "", "golden snapshot dir, relative to the store")
	template := flag.String("template", "default", "pool template")
	size := flag.String("size", "small", "pool size")
	flag.Parse()
	if err := run(*data, *instance, *vmmBin, *vm, *golden, fsm.PoolKey{Template: *template, Net: "none", Size: *size}); err != nil {
		fmt.Fprintln(os.Stderr, "cli:", err)
		os.Exit(1)
	}
}

func run(data, instance, vmmBin, vm, golden string, k fsm.PoolKey) error {
	if data == "" || instance == "" || vmmBin == "" || vm == "" || golden == "" {
		return fmt.Errorf("-data, -instance, -vmm, -vm and -golden are required")
	}
	d, err := chdriver.New(chdriver.Config{
		Roots: layout.RootsIn(data), Instance: instance, VMM: vmmBin,
		Log: zerolog.New(os.Stderr).Level(zerolog.WarnLevel),
	})
	if err != nil {
		return err
	}
	defer d.Close()
	op := ulid.Make()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := d.Clone(ctx, fsm.CloneVM{OpID: op, VM: vm, Key: k, Instance: instance, RunDir: instance + "/" + vm, GoldenDir: golden})
	if err != nil {
		return err
	}
	return json.NewEncoder(os.Stdout).Encode(res.Report)
}
