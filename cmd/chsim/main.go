// Command chsim is a simulator of the Cloud Hypervisor REST API, a drop-in
// stand-in for the cloud-hypervisor binary on machines that cannot run it:
// same --api-socket flag, one process per VM. It is not a hypervisor. The
// behaviour and the fault-injection environment variables are documented in
// package executors/ch/chsim and printed by --help.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"syscall"

	"github.com/sbxlog/sbxlog/executors/ch/chsim"
)

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	opts := chsim.DefaultOptions()
	if err := opts.ApplyEnv(os.Getenv); err != nil {
		fmt.Fprintln(os.Stderr, "chsim:", err)
		return 2
	}
	fs := flag.NewFlagSet("chsim", flag.ContinueOnError)
	fs.SetOutput(os.Stderr)
	fs.Usage = func() { fmt.Fprint(os.Stderr, chsim.Usage) }
	apiSocket := fs.String("api-socket", "", "API socket: path=<socket>, a bare path, or fd=<n>")
	version := fs.Bool("version", false, "print the simulated version")
	opts.RegisterFlags(fs)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if *version {
		fmt.Printf("cloud-hypervisor v%s (chsim: an API simulator, not a hypervisor)\n", chsim.Version)
		return 0
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "chsim: unexpected arguments %q (a VM is configured through the API)\n", fs.Args())
		return 2
	}
	path, fd, err := chsim.ResolveSocketArg(*apiSocket)
	if err != nil {
		fmt.Fprintln(os.Stderr, "chsim:", err)
		fs.Usage()
		return 2
	}
	opts.Socket = path
	opts.Log = os.Stderr

	srv, err := chsim.New(opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if fd >= 0 {
		ln, err := net.FileListener(os.NewFile(uintptr(fd), "api-socket"))
		if err != nil {
			fmt.Fprintln(os.Stderr, "chsim: fd", fd, "is not a listening socket:", err)
			return 1
		}
		srv.UseListener(ln)
	}
	// CH exits cleanly on SIGTERM and SIGINT.
	sigs := []os.Signal{syscall.SIGTERM, syscall.SIGINT}
	if opts.IgnoreSIGTERM {
		signal.Ignore(syscall.SIGTERM)
		sigs = sigs[1:]
	}
	ctx, stop := signal.NotifyContext(context.Background(), sigs...)
	defer stop()
	if err := srv.Serve(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}
