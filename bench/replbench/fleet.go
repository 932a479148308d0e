package replbench

// The fleet section (`go run ./bench -only fleetbench`, issue 26 acceptance
// 4): two built sandboxd processes (chsim) on a three-server loopback
// cluster (R3). Node fa keeps the claimed pool warm; node fb has another
// pool only, so a claim of fa's template on fb is a redirect to fa.
//
//   - Claim latency with a redirect (fb's answer naming fa, then the claim
//     on fa with no_redirect, timed end to end as an SDK following it pays)
//     against a local warm claim on fa, taking turns on idle nodes.
//   - View lag between the nodes: from fa's log reaching a position (its
//     GET /v1/info) to fb's cluster view having folded it (fb's row of fa),
//     under a claim/release load on fa, and through the loss of each NATS
//     server in turn under the same load.
//
// Targets: the redirect costs at most one local warm claim more at p50
// (the origin's answer is no slower than a claim), and the view lags by at
// most 5 s (docs/operations.md) at p99 under load and through each loss.

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sbxlog/sbxlog/bench/chaos/campaign"
	"github.com/sbxlog/sbxlog/bench/report"
	"github.com/sbxlog/sbxlog/eventlog/replication/natsembed"
	"github.com/sbxlog/sbxlog/eventlog/replication/stream"
	"github.com/sbxlog/sbxlog/projections/api"
	"github.com/sbxlog/sbxlog/projections/apiclient"
	"github.com/sbxlog/sbxlog/projections/cluster"
)

type fleetConfig struct {
	claimN  int           // claims per side
	loadDur time.Duration // the load-only lag window
	faults  int           // NATS servers lost in turn
	window  time.Duration // load around each loss
	workers int           // claim/release loops on fa
	lagGoal time.Duration
}

func fleetConfigFor(quick bool) fleetConfig {
	c := fleetConfig{claimN: 200, loadDur: 10 * time.Second, faults: 3, window: 12 * time.Second, workers: 2, lagGoal: 5 * time.Second}
	if quick {
		c.claimN, c.loadDur, c.faults, c.window = 30, 3*time.Second, 1, 8*time.Second
	}
	return c
}

// RunFleet measures the fleet section.
func RunFleet(ctx context.Context, opts report.Options) (*report.Section, error) {
	cfg := fleetConfigFor(opts.Quick)
	sec := &report.Section{
		Title: "Fleet: redirected claims and the cluster view's lag",
		Method: fmt.Sprintf("Two built sandboxd processes (hypervisor chsim) on a three-server JetStream cluster on loopback (R3): fa keeps pool %s/none/small warm (2), "+
			"fb has another pool only, so fb answers a claim of that template with a redirect to fa. Claims: %d local warm claims on fa and %d redirected ones "+
			"(fb's redirect answer, then the claim on fa with no_redirect, timed end to end at the client), taking turns, each on idle nodes with fb's view of fa current, "+
			"released untimed. View lag: %d claim/release loops on fa; fa's log position (GET /v1/info) and fb's view of it (its replication.nodes row of fa) polled "+
			"every 10 ms; the lag of a position is from fa reporting it to fb's row reaching it. Under load for %s, then through the loss (in-process Shutdown) "+
			"of each NATS server in turn with the same load for %s around it.",
			claimTemplate, cfg.claimN, cfg.claimN, cfg.workers, cfg.loadDur, cfg.window),
		Header: []string{"measure", "p50", "p99", "max", "samples"},
	}
	bins, err := campaign.Build(ctx, filepath.Join(opts.Scratch, "bin"))
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(opts.Scratch, "fb")
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	cl, err := natsembed.StartCluster(cctx, filepath.Join(dir, "nats"), 3, natsembed.ClusterConfig{})
	cancel()
	if err != nil {
		return nil, err
	}
	defer cl.Shutdown()
	natsConf := map[string]any{"url": cl.URLs(), "replicas": 3}
	fa, err := startClaimDaemon(ctx, bins, dir, "fa", claimTemplate, 2, natsConf)
	if err != nil {
		return nil, err
	}
	defer fa.stop()
	fb, err := startClaimDaemon(ctx, bins, dir, "fb", "rq", 1, natsConf)
	if err != nil {
		return nil, err
	}
	defer fb.stop()

	local, redirected, answer, err := redirectLatency(ctx, cfg, fa, fb)
	if err != nil {
		return nil, fmt.Errorf("claims: %w", err)
	}
	row := func(name string, d report.Durations) {
		sec.AddRow(name, report.Fmt(d.Quantile(0.5)), report.Fmt(d.Quantile(0.99)), report.Fmt(d.Quantile(1)), len(d))
	}
	row("local warm claim on fa", local)
	row("redirected claim: fb's answer + the claim on fa", redirected)
	row("  of which fb's redirect answer", answer)
	l50, r50 := local.Quantile(0.5), redirected.Quantile(0.5)
	sec.Verdict(r50 <= 2*l50, "a redirected claim at p50 %s vs a local warm claim %s (+%s; target <= one more local claim, %s)",
		report.Fmt(r50), report.Fmt(l50), report.Fmt(r50-l50), report.Fmt(2*l50))

	lag, err := viewLag(ctx, cfg, fa, fb, cfg.loadDur, nil)
	if err != nil {
		return nil, fmt.Errorf("view lag under load: %w", err)
	}
	row(fmt.Sprintf("view lag fa -> fb under load (%d loops)", cfg.workers), lag)
	sec.Verdict(lag.Quantile(0.99) <= cfg.lagGoal, "view lag under load p99 %s (target <= %s)", report.Fmt(lag.Quantile(0.99)), report.Fmt(cfg.lagGoal))

	nc, err := nats.Connect(cl.URLs(), nats.MaxReconnects(-1))
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	for i, srv := range cl.Servers[:cfg.faults] {
		if err := streamsWhole(ctx, js); err != nil {
			return nil, err
		}
		lag, err := viewLag(ctx, cfg, fa, fb, cfg.window, srv.Shutdown)
		if err != nil {
			return nil, fmt.Errorf("view lag through server %d's loss: %w", i, err)
		}
		if err := srv.Restart(); err != nil {
			return nil, fmt.Errorf("restart server %d: %w", i, err)
		}
		row(fmt.Sprintf("view lag fa -> fb, NATS server %d lost under load", i), lag)
		sec.Verdict(lag.Quantile(1) <= cfg.lagGoal, "view lag through server %d's loss: max %s, p99 %s (target <= %s)",
			i, report.Fmt(lag.Quantile(1)), report.Fmt(lag.Quantile(0.99)), report.Fmt(cfg.lagGoal))
	}
	sec.Notes = append(sec.Notes, "The view lag includes fa's publishing: through a server's loss, fa's events wait for the stream's new leader "+
		"before any view can fold them, so the loss rows measure the whole path from one node's log to another node's view.",
		"A server's loss here is its in-process Shutdown (its connections closed at once), not a SIGKILL of a process: "+
			"TestFleetFaults SIGKILLs server processes and logs the same lags (from the stream, and from the claim's answer) per server.")
	return sec, nil
}

// redirectLatency times local warm claims on fa and redirected claims
// (fb's answer, then fa's), taking turns.
func redirectLatency(ctx context.Context, cfg fleetConfig, fa, fb *claimDaemon) (local, redirected, answer report.Durations, err error) {
	warmup := cfg.claimN / 10
	for i := range 2 * (cfg.claimN + warmup) {
		if err := fa.waitIdle(ctx, 2); err != nil {
			return nil, nil, nil, err
		}
		if err := waitFolded(ctx, fa, fb, 2); err != nil {
			return nil, nil, nil, err
		}
		start := time.Now()
		var cr *api.ClaimResponse
		var first time.Duration
		if i%2 == 1 {
			_, err := fb.c.Claim(ctx, api.ClaimRequest{Template: claimTemplate})
			first = time.Since(start)
			var ae *apiclient.Error
			if !errors.As(err, &ae) || len(ae.Redirect) == 0 || ae.Redirect[0] != fa.d.Addr {
				return nil, nil, nil, fmt.Errorf("claim on fb: %v, want a redirect to %s", err, fa.d.Addr)
			}
			cr, err = fa.c.Claim(ctx, api.ClaimRequest{Template: claimTemplate, NoRedirect: true})
			if err != nil {
				return nil, nil, nil, fmt.Errorf("redirected claim on fa: %w", err)
			}
		} else if cr, err = fa.c.Claim(ctx, api.ClaimRequest{Template: claimTemplate}); err != nil {
			return nil, nil, nil, fmt.Errorf("claim on fa: %w", err)
		}
		took := time.Since(start)
		if cr.Tier != "warm" {
			return nil, nil, nil, fmt.Errorf("claim served by tier %s on an idle warm pool", cr.Tier)
		}
		if err := fa.c.Release(ctx, cr.ID); err != nil {
			return nil, nil, nil, err
		}
		if i < 2*warmup {
			continue
		}
		if i%2 == 1 {
			redirected, answer = append(redirected, took), append(answer, first)
		} else {
			local = append(local, took)
		}
	}
	return local, redirected, answer, nil
}

// waitFolded waits until fb's view has folded all of fa's log and sees
// fa live with warm VMs.
func waitFolded(ctx context.Context, fa, fb *claimDaemon, warm int) error {
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		ai, err := fa.info(ctx)
		if err != nil {
			return err
		}
		if r, ok := viewRow(ctx, fb, fa.d.Name); ok && r.Live && r.Applied >= ai.LogSeq && r.Warm[fa.pool] >= warm {
			return nil
		}
		time.Sleep(5 * time.Millisecond)
	}
	return errors.New("fb's view did not catch up with fa within a minute")
}

// viewRow is node's row of d's cluster view.
func viewRow(ctx context.Context, d *claimDaemon, node string) (cluster.NodeStatus, bool) {
	in, err := d.info(ctx)
	if err != nil || in.Replication == nil {
		return cluster.NodeStatus{}, false
	}
	for _, r := range in.Replication.Nodes {
		if r.Node == node {
			return r, true
		}
	}
	return cluster.NodeStatus{}, false
}

// viewLag runs the claim/release load on fa for dur (fault, if any, after
// a second of it) and returns the lag of each of fa's log positions seen
// to fb's view folding it.
func viewLag(ctx context.Context, cfg fleetConfig, fa, fb *claimDaemon, dur time.Duration, fault func()) (report.Durations, error) {
	type sample struct {
		at  time.Time
		seq uint64
	}
	lctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var loadErr error
	var mu sync.Mutex
	for range cfg.workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for lctx.Err() == nil {
				cr, err := fa.c.Claim(lctx, api.ClaimRequest{Template: claimTemplate, NoRedirect: true})
				if err == nil {
					err = fa.c.Release(lctx, cr.ID)
				}
				if err != nil && lctx.Err() == nil {
					mu.Lock()
					loadErr = err
					mu.Unlock()
					return
				}
			}
		}()
	}
	var src, dst []sample
	start := time.Now()
	faulted := fault == nil
	var final uint64
	for {
		if !faulted && time.Since(start) >= time.Second {
			fault()
			faulted = true
		}
		if ai, err := fa.info(ctx); err == nil {
			src = append(src, sample{time.Now(), ai.LogSeq})
			final = ai.LogSeq
		}
		if r, ok := viewRow(ctx, fb, fa.d.Name); ok {
			dst = append(dst, sample{time.Now(), r.Applied})
		}
		if time.Since(start) >= dur && lctx.Err() == nil {
			stop()
			wg.Wait()
			if ai, err := fa.info(ctx); err == nil {
				final = ai.LogSeq
			}
		}
		if lctx.Err() != nil && len(dst) > 0 && dst[len(dst)-1].seq >= final {
			break
		}
		if time.Since(start) > dur+time.Minute {
			stop()
			return nil, fmt.Errorf("fb's view of fa stuck at %d, fa at %d", dst[len(dst)-1].seq, final)
		}
		time.Sleep(10 * time.Millisecond)
	}
	stop()
	if loadErr != nil {
		return nil, fmt.Errorf("load on fa: %w", loadErr)
	}
	var lag report.Durations
	// Both series are in time order and positions only grow: the first of
	// fb's samples at or after a position's time that reached it is found
	// by moving forward.
	j := 0
	for i, s := range src {
		if i > 0 && s.seq == src[i-1].seq {
			continue
		}
		for j < len(dst) && (dst[j].at.Before(s.at) || dst[j].seq < s.seq) {
			j++
		}
		if j == len(dst) {
			break
		}
		lag = append(lag, dst[j].at.Sub(s.at))
	}
	if len(lag) == 0 {
		return nil, errors.New("no lag samples")
	}
	return lag, nil
}

// streamsWhole waits until the op-log stream and the address bucket have
// a leader and two current replicas again.
func streamsWhole(ctx context.Context, js jetstream.JetStream) error {
	deadline := time.Now().Add(time.Minute)
	for _, name := range []string{stream.DefaultName, "KV_" + cluster.DefaultBucket} {
		for {
			cctx, cancel := context.WithTimeout(ctx, time.Second)
			whole := stream.Whole(cctx, js, name, 3)
			cancel()
			if whole {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("stream %s not whole again within a minute", name)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	return nil
}
