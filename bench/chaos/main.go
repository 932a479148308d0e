// Command chaos is the kill -9 campaign (make chaos): it builds sandboxd and
// chsim, runs a random workload against sandboxd on a scratch data dir while
// killing it with SIGKILL at random moments (and crashing it at recipe
// steps, killing VMMs and turning on chsim faults), and checks at the end
// that no acknowledged operation was lost, no VM serves two claims, no VMM
// is orphaned, no other instance's VM was touched, every woken sandbox
// restored exactly what its hibernate stored and (as root, with its egress
// pool) every running egress VM's tap is locked after each restart and no
// lock outlives its VM, and a netns guest on a probe claim's tap meets the
// pool's policy after each restart and never leaks across a kill; with
// checkpoints, forks, promotes and archives in the workload, that acked
// checkpoints and templates stand until deleted, forks are all or none,
// and the store and the archive store hold exactly what the state
// references. It
// prints the operations,
// kills, faults and violations, and exits 1 on any violation (2 when the
// campaign could not run). See package bench/chaos/campaign.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/sbxlog/sbxlog/bench/chaos/campaign"
)

func main() {
	duration := flag.Duration("duration", 10*time.Minute, "least time the workload runs")
	kills := flag.Int("kills", 50, "least number of SIGKILLs of sandboxd")
	seed := flag.Uint64("seed", 0, "random seed (0: from the clock; printed)")
	workers := flag.Int("workers", 3, "concurrent workload clients")
	vmmKills := flag.Bool("vmm-kills", true, "also kill random VMM processes")
	faults := flag.Bool("faults", true, "turn on chsim faults for some incarnations")
	crashSteps := flag.Bool("crash-steps", true, "crash sandboxd at random recipe steps (SBX_CRASH_AT) too")
	nats := flag.Bool("nats", true, "run sandboxd with replication (embedded NATS), so usage.jsonl is checked against the log")
	egress := flag.Bool("egress", true, "add an egress pool (sandboxd in a network namespace with a bridge; needs root), check its taps' locks and probe its egress from a netns guest")
	dir := flag.String("dir", "", "scratch dir (default: a temp dir, removed unless -keep)")
	keep := flag.Bool("keep", false, "keep the scratch dir (data dirs, daemon logs)")
	bin := flag.String("bin", "", "directory holding prebuilt sandboxd and chsim (default: build them)")
	quiet := flag.Bool("q", false, "no progress lines")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	bins := campaign.Binaries{}
	if *bin != "" {
		bins = campaign.Binaries{Sandboxd: *bin + "/sandboxd", Chsim: *bin + "/chsim"}
	} else {
		d, err := os.MkdirTemp("", "chaos-bin")
		if err != nil {
			fatal(err)
		}
		defer os.RemoveAll(d)
		fmt.Fprintln(os.Stderr, "building sandboxd and chsim...")
		if bins, err = campaign.Build(ctx, d); err != nil {
			fatal(err)
		}
	}
	if *egress {
		if err := campaign.EgressAvailable(); err != nil {
			fmt.Fprintf(os.Stderr, "chaos: no egress pool: %v\n", err)
			*egress = false
		}
	}
	opt := campaign.Options{
		Bins: bins, Dir: *dir, Keep: *keep, Duration: *duration, Kills: *kills, Seed: *seed, Workers: *workers,
		VMMKills: *vmmKills, Faults: *faults, CrashSteps: *crashSteps, NATS: *nats, Egress: *egress,
	}
	if !*quiet {
		opt.Out = os.Stderr
	}
	res, err := campaign.Run(ctx, opt)
	if res != nil {
		res.Print(os.Stdout)
	}
	if err != nil {
		fatal(err)
	}
	if !res.Passed() {
		os.Exit(1)
	}
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "chaos:", err)
	os.Exit(2)
}
