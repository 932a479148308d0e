package ckptbench

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	"github.com/sbxlog/sbxlog/bench/chaos/campaign"
	"github.com/sbxlog/sbxlog/bench/qemubench"
	"github.com/sbxlog/sbxlog/bench/report"
	"github.com/sbxlog/sbxlog/projections/api"
	"github.com/sbxlog/sbxlog/projections/apiclient"
)

// forkConfig sizes a forkbench run.
type forkConfig struct {
	sizes  []int // children per fork
	rounds int   // each round: a warm claim, a clone claim, a checkpoint, a fork of each size
	warm   int   // the warm pool's target
}

func forkConfigFor(quick bool) forkConfig {
	if quick {
		return forkConfig{sizes: []int{1, 8, 32}, rounds: 2, warm: 2}
	}
	return forkConfig{sizes: []int{1, 8, 32}, rounds: 6, warm: 2}
}

// The pools: warmTpl is kept warm (warm claims and the fork's parent);
// cloneTpl is emptied once its golden is ready, so its claims are served
// by the clone tier (a VM restored from the golden on demand).
const (
	warmTpl  = "fw"
	cloneTpl = "fc"
)

// forkRuns are a run's samples.
type forkRuns struct {
	warm, clone, checkpoint report.Durations
	fork                    map[int]report.Durations
}

// RunFork measures the forkbench section.
func RunFork(ctx context.Context, opts report.Options) (*report.Section, error) {
	cfg := forkConfigFor(opts.Quick)
	if os.Geteuid() != 0 {
		return nil, errors.New("forkbench: needs root to loop-mount XFS")
	}
	dir, done, err := opts.Dir("forkbench")
	if err != nil {
		return nil, err
	}
	defer done()
	bins, err := campaign.Build(ctx, filepath.Join(dir, "bin"))
	if err != nil {
		return nil, err
	}
	// Under the system temp dir, not the scratch dir: the VMs' socket paths
	// must stay within a unix socket's 107 bytes.
	mnt, unmount, err := qemubench.MountLoop(ctx, "", "xfs", 4<<30)
	if err != nil {
		return nil, fmt.Errorf("forkbench: %w", err)
	}
	defer func() { _ = unmount() }()
	n, err := startForkNode(ctx, bins, mnt, cfg)
	if err != nil {
		return nil, err
	}
	defer n.stop()
	runs, err := n.measure(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("forkbench: %w: %s", err, logTail(n.d.Log))
	}
	return forkSection(cfg, runs), nil
}

// forkNode is the sandboxd under test.
type forkNode struct {
	d *campaign.Daemon
	c *apiclient.Client
}

// startForkNode starts the built sandboxd (chsim) with its data dir on mnt,
// max_fork_count the largest size, both pools warm, then empties the clone
// pool.
func startForkNode(ctx context.Context, bins campaign.Binaries, mnt string, cfg forkConfig) (*forkNode, error) {
	pools := []campaign.PoolConf{
		{Template: warmTpl, Net: "none", Size: "small", Warm: cfg.warm},
		{Template: cloneTpl, Net: "none", Size: "small", Warm: 1},
	}
	d, err := campaign.NewDaemon("fork", bins.Sandboxd, filepath.Join(mnt, "d"), pools, false)
	if err != nil {
		return nil, err
	}
	if err := d.Configure(map[string]any{"max_fork_count": slices.Max(cfg.sizes), "log_level": "warn"}); err != nil {
		return nil, err
	}
	if _, err := d.Start(ctx, nil, time.Minute); err != nil {
		_ = d.Signal(syscall.SIGKILL, 10*time.Second) // one that did not answer in time
		campaign.KillVMMsUnder(d.DataDir)
		return nil, fmt.Errorf("%w: %s", err, logTail(d.Log))
	}
	c, err := apiclient.New("http://"+d.Addr, campaign.Token, &http.Client{Timeout: 5 * time.Minute})
	if err != nil {
		return nil, err
	}
	n := &forkNode{d: d, c: c}
	if err := n.waitIdle(ctx, map[string]int{warmTpl: cfg.warm, cloneTpl: 1}); err != nil {
		n.stop()
		return nil, err
	}
	if _, err := c.SetPools(ctx, api.PoolsRequest{Pools: []api.PoolSpec{
		{Template: warmTpl, Net: "none", Size: "small", Warm: cfg.warm},
		{Template: cloneTpl, Net: "none", Size: "small", Warm: 0},
	}}); err != nil {
		n.stop()
		return nil, err
	}
	if err := n.waitIdle(ctx, map[string]int{warmTpl: cfg.warm, cloneTpl: 0}); err != nil {
		n.stop()
		return nil, err
	}
	return n, nil
}

func (n *forkNode) stop() {
	_ = n.d.Signal(syscall.SIGTERM, 30*time.Second)
	campaign.KillVMMsUnder(n.d.DataDir)
}

// waitIdle polls /v1/info until every pool of want holds exactly its warm
// count, nothing refills and the log has not moved for a while: whatever
// the last measure left (releases, refills, removals) is done.
func (n *forkNode) waitIdle(ctx context.Context, want map[string]int) error {
	const quiet = 50 * time.Millisecond
	deadline := time.Now().Add(2 * time.Minute)
	var lastSeq uint64
	var since time.Time
	for {
		in, err := n.c.Info(ctx)
		if err != nil {
			return err
		}
		ok := true
		for _, p := range in.Pools {
			if w, mine := want[p.Key.Template]; mine && (p.Warm != w || p.Refilling != 0) {
				ok = false
			}
		}
		if in.LogSeq != lastSeq || !ok {
			lastSeq, since = in.LogSeq, time.Now()
		} else if time.Since(since) >= quiet {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("node not idle within 2 minutes: %+v", in.Pools)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// measure runs the rounds, each on an idle node: a warm claim, a
// clone-tier claim, a checkpoint of the parent, and a fork of each size
// (children released, checkpoints deleted, untimed).
func (n *forkNode) measure(ctx context.Context, cfg forkConfig) (*forkRuns, error) {
	idle := map[string]int{warmTpl: cfg.warm, cloneTpl: 0}
	parent, err := n.c.Claim(ctx, api.ClaimRequest{Template: warmTpl})
	if err != nil {
		return nil, fmt.Errorf("parent claim: %w", err)
	}
	r := &forkRuns{fork: map[int]report.Durations{}}
	claim := func(tpl, tier string) (time.Duration, error) {
		if err := n.waitIdle(ctx, idle); err != nil {
			return 0, err
		}
		t0 := time.Now()
		cr, err := n.c.Claim(ctx, api.ClaimRequest{Template: tpl})
		took := time.Since(t0)
		if err != nil {
			return 0, fmt.Errorf("%s claim: %w", tier, err)
		}
		if cr.Tier != tier {
			return 0, fmt.Errorf("claim of %s served by tier %s, want %s", tpl, cr.Tier, tier)
		}
		return took, n.c.Release(ctx, cr.ID)
	}
	// Round 0 warms up (connections, page cache, the first fork's paths)
	// and is not recorded.
	for round := range cfg.rounds + 1 {
		keep := round > 0
		took, err := claim(warmTpl, "warm")
		if err != nil {
			return nil, err
		}
		if keep {
			r.warm = append(r.warm, took)
		}
		if took, err = claim(cloneTpl, "clone"); err != nil {
			return nil, err
		}
		if keep {
			r.clone = append(r.clone, took)
		}
		if err := n.waitIdle(ctx, idle); err != nil {
			return nil, err
		}
		t0 := time.Now()
		ck, err := n.c.Checkpoint(ctx, parent.ID, api.CheckpointRequest{})
		took = time.Since(t0)
		if err != nil {
			return nil, fmt.Errorf("checkpoint: %w", err)
		}
		if keep {
			r.checkpoint = append(r.checkpoint, took)
		}
		if err := n.c.DeleteCheckpoint(ctx, ck.ID); err != nil {
			return nil, fmt.Errorf("delete checkpoint: %w", err)
		}
		for _, size := range cfg.sizes {
			if err := n.waitIdle(ctx, idle); err != nil {
				return nil, err
			}
			t0 := time.Now()
			kids, err := n.c.Fork(ctx, parent.ID, api.ForkRequest{Count: size})
			took := time.Since(t0)
			if err != nil {
				return nil, fmt.Errorf("fork of %d: %w", size, err)
			}
			if len(kids) != size {
				return nil, fmt.Errorf("fork of %d answered %d children", size, len(kids))
			}
			if keep {
				r.fork[size] = append(r.fork[size], took)
			}
			for _, k := range kids {
				if err := n.c.Release(ctx, k.ID); err != nil {
					return nil, fmt.Errorf("release fork child: %w", err)
				}
			}
		}
	}
	return r, n.c.Release(ctx, parent.ID)
}

// forkTarget is the per-child cost a fork of n may reach: one warm claim
// and one clone-tier claim (a child is a claim whose VM is restored from a
// snapshot, as a clone-tier claim's is; the fork's checkpoint is shared by
// the children).
func forkTarget(warm, clone time.Duration) time.Duration { return warm + clone }

func forkSection(cfg forkConfig, r *forkRuns) *report.Section {
	sec := &report.Section{
		Title: "Fork of N children against a warm claim (control plane, chsim)",
		Method: fmt.Sprintf(`A built sandboxd (hypervisor chsim: the Cloud Hypervisor API simulator, one process per VM, no
guest) with its data dir on a 4 GiB loop-mounted XFS with reflink=1, max_fork_count %d. Pool %s keeps %d
warm VMs (warm claims, and the fork's parent, one claim held for the run); pool %s is emptied once its
golden is ready, so its claims are served by the clone tier (a VM restored from the golden on demand).
%d rounds after one of warm-up, each on an idle node (pools at target, nothing refilling, the log quiet):
a warm claim, a clone-tier claim, a checkpoint of the parent (POST .../checkpoint until it is taken,
then deleted), and a fork of each size N in %v (POST .../fork, which answers once every child runs;
children released untimed). Over loopback HTTP with keep-alive, timed at the client. Per-child cost
= the fork's time / N. Comparator, same node, same run: a warm claim and a clone-tier claim. Target:
per-child cost at N = %d <= a warm claim + a clone-tier claim at p50 (a child is a claim whose VM is
restored from a snapshot; the fork's checkpoint is shared). The VMM's own cost is not here: chsim's
restore does no guest work; a real QEMU guest's checkpoint is in the pausebench section and its
restore (wake) in qemubench; 32 TCG guests of 256 MiB do not fit this 2-core machine.`,
			slices.Max(cfg.sizes), warmTpl, cfg.warm, cloneTpl, cfg.rounds, cfg.sizes, slices.Max(cfg.sizes)),
		Header: []string{"measure", "p50", "p99", "per child p50", "per child / (warm + clone)", "samples"},
	}
	w, c := r.warm.Quantile(0.5), r.clone.Quantile(0.5)
	target := forkTarget(w, c)
	sec.AddRow("warm claim", report.Fmt(w), report.Fmt(r.warm.Quantile(0.99)), "-", "-", len(r.warm))
	sec.AddRow("clone-tier claim", report.Fmt(c), report.Fmt(r.clone.Quantile(0.99)), "-", "-", len(r.clone))
	sec.AddRow("checkpoint of the parent (API call)", report.Fmt(r.checkpoint.Quantile(0.5)), report.Fmt(r.checkpoint.Quantile(0.99)), "-", "-", len(r.checkpoint))
	for _, size := range cfg.sizes {
		d := r.fork[size]
		per := d.Quantile(0.5) / time.Duration(size)
		sec.AddRow(fmt.Sprintf("fork of %d", size), report.Fmt(d.Quantile(0.5)), report.Fmt(d.Quantile(0.99)),
			report.Fmt(per), fmt.Sprintf("%.2fx", ratio(per, target)), len(d))
	}
	big := slices.Max(cfg.sizes)
	per := r.fork[big].Quantile(0.5) / time.Duration(big)
	sec.Verdict(per <= target, "fork of %d: %s per child at p50 vs a warm claim %s + a clone-tier claim %s = %s (target <= 1x)",
		big, report.Fmt(per), report.Fmt(w), report.Fmt(c), report.Fmt(target))
	sec.Notes = append(sec.Notes, fmt.Sprintf("Machine: load average %s at the end.", report.LoadAvg()))
	return sec
}

// logTail is the end of the daemon's log, for an error: the log goes with
// the scratch filesystem.
func logTail(path string) string {
	b, _ := os.ReadFile(path)
	return string(b[max(0, len(b)-2000):])
}
