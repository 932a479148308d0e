package replbench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/sbxlog/sbxlog/bench/chaos/campaign"
	"github.com/sbxlog/sbxlog/bench/report"
	"github.com/sbxlog/sbxlog/cmd/sandboxd/node/replication"
	"github.com/sbxlog/sbxlog/projections/api"
	"github.com/sbxlog/sbxlog/projections/apiclient"
)

// claimTemplate is the template of the pool the claim-latency daemons keep
// warm.
const claimTemplate = "rb"

// claimDaemon is a sandboxd process for the claim-latency rows.
type claimDaemon struct {
	d    *campaign.Daemon
	c    *apiclient.Client
	hc   *http.Client
	pool string // its one pool's key
}

// startClaimDaemon starts the built sandboxd (hypervisor chsim) with one
// warm pool of template tpl and the given nats section, and waits until its
// pool is warm.
func startClaimDaemon(ctx context.Context, bins campaign.Binaries, dir, name, tpl string, warm int, nats map[string]any) (*claimDaemon, error) {
	pools := []campaign.PoolConf{{Template: tpl, Net: "none", Size: "small", Warm: warm}}
	d, err := campaign.NewDaemon(name, bins.Sandboxd, filepath.Join(dir, name, "data"), pools, true)
	if err != nil {
		return nil, err
	}
	// The same config as campaign's, with this row's replication settings.
	cfg, _ := json.MarshalIndent(map[string]any{
		"listen": d.Addr, "data_dir": d.DataDir, "node_id": name, "api_token": campaign.Token,
		"hypervisor": "chsim", "pools": pools, "log_level": "warn", "nats": nats,
	}, "", "  ")
	if err := os.WriteFile(d.ConfigPath(), cfg, 0o644); err != nil {
		return nil, err
	}
	if _, err := d.Start(ctx, nil, time.Minute); err != nil {
		return nil, err
	}
	hc := &http.Client{Timeout: 30 * time.Second}
	c, err := apiclient.New("http://"+d.Addr, campaign.Token, hc)
	if err != nil {
		return nil, err
	}
	cd := &claimDaemon{d: d, c: c, hc: hc, pool: tpl + "/none/small"}
	if err := cd.waitIdle(ctx, warm); err != nil {
		cd.stop()
		return nil, err
	}
	return cd, nil
}

// waitIdle polls /v1/info until the pool holds want warm VMs, nothing
// refills, the log has not moved for a while and replication has published
// all of it: the node is idle.
func (cd *claimDaemon) waitIdle(ctx context.Context, want int) error {
	const quiet = 20 * time.Millisecond
	deadline := time.Now().Add(time.Minute)
	var lastSeq uint64
	var since time.Time
	for {
		in, err := cd.info(ctx)
		if err != nil {
			return err
		}
		warm := false
		for _, p := range in.Pools {
			warm = warm || (p.Key.String() == cd.pool && p.Warm >= want && p.Refilling == 0)
		}
		if in.LogSeq != lastSeq || !warm || in.Replication == nil || in.Replication.Replicator.Pending > 0 {
			lastSeq, since = in.LogSeq, time.Now()
		} else if time.Since(since) >= quiet {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: not idle within a minute: %+v", cd.d.Name, in)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// info is GET /v1/info with its replication status.
func (cd *claimDaemon) info(ctx context.Context) (*nodeInfo, error) {
	req, err := http.NewRequestWithContext(ctx, "GET", "http://"+cd.d.Addr+"/v1/info", nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+campaign.Token)
	resp, err := cd.hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var in nodeInfo
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: GET /v1/info: %s", cd.d.Name, resp.Status)
	}
	return &in, json.NewDecoder(resp.Body).Decode(&in)
}

// nodeInfo is GET /v1/info with its replication object typed.
type nodeInfo struct {
	api.Info
	Replication *replication.Status `json:"replication"`
}

func (cd *claimDaemon) stop() {
	_ = cd.d.Signal(syscall.SIGTERM, 30*time.Second)
	campaign.KillVMMsUnder(cd.d.DataDir)
}

// claimLatency times warm claims over HTTP against two sandboxd, one with
// asynchronous replication (the default) and one with nats.sync, taking
// turns so machine load hits both alike. Before each claim the node is idle
// (pool full, the previous claim's release and refill done and replicated,
// the log quiet), so a claim is a lone claim with its full replication
// round trip. nats nil: each daemon
// embeds its own server (sandboxd's default); otherwise both use it.
func claimLatency(ctx context.Context, cfg config, bins campaign.Binaries, dir string, top *topology, embeddedDaemons bool) (async, sync report.Durations, err error) {
	const warm = 2
	natsFor := func(syncMode bool) map[string]any {
		n := map[string]any{"sync": syncMode}
		if !embeddedDaemons {
			n["url"], n["replicas"] = top.urls, top.replicas
		}
		return n
	}
	var ds [2]*claimDaemon
	for i, mode := range []string{"a", "s"} {
		name := fmt.Sprintf("rb-r%d-%s", top.replicas, mode)
		if ds[i], err = startClaimDaemon(ctx, bins, dir, name, claimTemplate, warm, natsFor(i == 1)); err != nil {
			for _, d := range ds[:i] {
				d.stop()
			}
			return nil, nil, err
		}
	}
	defer func() {
		for _, d := range ds {
			d.stop()
		}
	}()
	var samples [2]report.Durations
	warmup := cfg.claimN / 10
	for i := range 2 * (cfg.claimN + warmup) {
		d := ds[i%2]
		if err := d.waitIdle(ctx, warm); err != nil {
			return nil, nil, err
		}
		start := time.Now()
		cr, err := d.c.Claim(ctx, api.ClaimRequest{Template: claimTemplate})
		took := time.Since(start)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: claim: %w", d.d.Name, err)
		}
		if cr.Tier != "warm" {
			return nil, nil, fmt.Errorf("%s: claim served by tier %s on an idle warm pool", d.d.Name, cr.Tier)
		}
		if err := d.c.Release(ctx, cr.ID); err != nil {
			return nil, nil, fmt.Errorf("%s: release: %w", d.d.Name, err)
		}
		if i >= 2*warmup {
			samples[i%2] = append(samples[i%2], took)
		}
	}
	if len(samples[1]) == 0 {
		return nil, nil, errors.New("no claim samples")
	}
	return samples[0], samples[1], nil
}

// claimRow adds a topology's claim-latency row and verdict.
func claimRow(sec *report.Section, cfg config, name string, async, sync report.Durations, floor time.Duration) {
	a50, s50 := async.Quantile(0.5), sync.Quantile(0.5)
	sec.AddRow(fmt.Sprintf("%s, sandboxd warm claim over HTTP, sync vs async (%d each)", name, len(sync)),
		"-", report.Fmt(s50)+" / "+report.Fmt(sync.Quantile(0.99))+" (async "+report.Fmt(a50)+" / "+report.Fmt(async.Quantile(0.99))+")",
		"-", fmt.Sprintf("+%s at p50, %.2fx (floor %s)", report.Fmt(s50-a50), float64(s50)/float64(a50), report.Fmt(floor)), "-")
	sec.Verdict(s50-a50 <= cfg.syncCostTarget,
		"%s: a warm claim with nats.sync costs %s more than without at p50 (%s vs %s; target <= +%s)",
		name, report.Fmt(s50-a50), report.Fmt(s50), report.Fmt(a50), report.Fmt(cfg.syncCostTarget))
}
