// Package apibench is the HTTP API's benchmark section (`go run ./bench
// -only apibench`): a warm claim over loopback HTTP, end to end, at 1, 1k
// and 100k live claims, and claims/s at 64 concurrent clients, against the
// old daemon's claims.json store measured in the same run.
//
// sbxlog side: apitest's in-process node, i.e. the real api.Server, engine
// and Pebble op log (fsync per commit, shared between concurrent claims) on
// the scratch disk, behind a real net/http server, with the hypervisor
// replaced by apitest's IN-PROCESS HYPERVISOR FAKE (executor intents are
// answered at once, so warm pools refill instantly and the 100k live claims
// are built in seconds). The live claims are built by proposing claims
// through the engine directly (the same commands the handler proposes).
// The "sbxlog" rows measure the claim path: the engine's refill loop is held
// back during timed runs and the pool refilled between them; one row at 1
// live claim runs the daemon's configuration, refills alongside the claims.
// Floors measured in the same rounds: an HTTP no-op round trip, a raw
// append+fdatasync and a one-event op log append on the scratch disk.
//
// Comparator: the old daemon's claim, served by a minimal net/http handler
// over the same loopback client: pick a warm VM, add the claim to the
// in-memory map of live claims, then commit the whole map to claims.json
// (maps.Clone under the map lock, then under a write lock json.Marshal,
// write a temp file, rename) — without fsync (the old default) and with
// fsync (file before the rename, directory after).
//
// Targets (issue 6, acceptance 5): sbxlog's warm-claim p50 at or under
// 250 µs with the fsync included, and p50 at 100k live claims within 1.2x of
// p50 at 1.
package apibench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"github.com/sbxlog/sbxlog/bench/report"
	"github.com/sbxlog/sbxlog/cmd/sandboxd/node/nodetest"
	"github.com/sbxlog/sbxlog/eventlog"
	"github.com/sbxlog/sbxlog/eventlog/event"
	"github.com/sbxlog/sbxlog/fsm"
	"github.com/sbxlog/sbxlog/fsm/engine"
	"github.com/sbxlog/sbxlog/projections/api"
)

const rootToken = "bench-root-token"

var key = fsm.PoolKey{Template: "default", Net: "none", Size: "small"}

type config struct {
	levels []int // live claims held while measuring
	rounds int   // rounds alternate between systems and levels
	// perRound is the sequential claims per system, level and round: many
	// short rounds spread a noisy host's bursts over every system.
	perRound int
	warmup   int
	// jsonPerRound caps the comparator's samples per round at a level: a
	// 100k-claim commit takes a good part of a second.
	jsonPerRound map[int]int
	clients      int
	perClient    int           // claims per client in the concurrent run
	jsonConcMax  time.Duration // bound on one comparator concurrent run
	warm         int           // warm target of the sbxlog pool
	p50Target    time.Duration
	ratioTarget  float64
}

func configFor(quick bool) config {
	c := config{
		levels: []int{1, 1000, 100_000}, rounds: 20, perRound: 100, warmup: 300,
		jsonPerRound: map[int]int{100_000: 1},
		clients:      64, perClient: 50, jsonConcMax: 3 * time.Second, warm: 4000,
		p50Target: 250 * time.Microsecond, ratioTarget: 1.2,
	}
	if quick {
		c.levels, c.rounds, c.perRound, c.warmup = []int{1, 100, 2000}, 2, 50, 20
		c.jsonPerRound = map[int]int{2000: 10}
		c.perClient, c.jsonConcMax, c.warm = 3, 500*time.Millisecond, 300
	}
	return c
}

// system is one claim server under test.
type system struct {
	name  string
	fsync string
	live  int
	url   string
	// std, when set, is the net/http.Client the claims go through instead
	// of the bench's own client; seqClient is the one sequential runs use,
	// kept across runs so its connection stays warm.
	std       *http.Client
	seqClient claimClient
	// owner, when set, is the system whose server this one measures through
	// another client: the claims of both are released together.
	owner *system
	// release ends the claims made by a round, untimed, so every round
	// starts at the level's live count.
	release func(ctx context.Context, ids []string) error
	close   func() error

	seq, conc report.Durations
	concRate  float64
	concN     int
	tiers     map[string]int
}

// Run measures the section.
func Run(ctx context.Context, opts report.Options) (*report.Section, error) {
	cfg := configFor(opts.Quick)
	dir := filepath.Join(opts.Scratch, "apibench")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)

	std := &http.Client{Transport: &http.Transport{
		MaxIdleConns: 4 * cfg.clients, MaxIdleConnsPerHost: 2 * cfg.clients, IdleConnTimeout: time.Minute,
		DisableCompression: true,
	}}
	defer std.CloseIdleConnections()

	var systems []*system
	defer func() {
		for _, s := range systems {
			if s.seqClient != nil {
				s.seqClient.close()
			}
			if s.owner == nil {
				_ = s.close()
			}
		}
	}()
	for i, live := range cfg.levels {
		s, err := startSbxlog(ctx, filepath.Join(dir, fmt.Sprintf("sbxlog-%d", live)), live, cfg.warm, true)
		if err != nil {
			return nil, fmt.Errorf("sbxlog node with %d live claims: %w", live, err)
		}
		systems = append(systems, s)
		if i == 0 {
			systems = append(systems, throughStd(s, sbxStdName, std))
			r, err := startSbxlog(ctx, filepath.Join(dir, fmt.Sprintf("sbxlog-refilling-%d", live)), live, cfg.warm, false)
			if err != nil {
				return nil, fmt.Errorf("sbxlog node with refills running: %w", err)
			}
			systems = append(systems, r)
		}
		for _, sync := range []bool{false, true} {
			j, err := startClaimsJSON(filepath.Join(dir, fmt.Sprintf("claimsjson-%d-%v", live, sync)), live, sync)
			if err != nil {
				return nil, err
			}
			systems = append(systems, j)
		}
	}

	httpFloor, err := startNoop()
	if err != nil {
		return nil, err
	}
	guardFloor, err := startNoopGuarded()
	if err != nil {
		return nil, err
	}
	systems = append(systems, httpFloor, throughStd(httpFloor, noopStdName, std), guardFloor)
	fsyncFloor, err := newSyncFloor(filepath.Join(dir, "fsync-floor"))
	if err != nil {
		return nil, err
	}
	defer fsyncFloor.close()
	logFloor, err := newLogFloor(filepath.Join(dir, "log-floor"))
	if err != nil {
		return nil, err
	}
	defer logFloor.close()

	// Warm-up: connections, page cache, Pebble's first flush.
	for _, s := range systems {
		n := cfg.warmup
		if m, ok := cfg.jsonPerRound[s.live]; ok && s.name == jsonName {
			n = min(n, m)
		}
		if _, err := sequential(ctx, s, n); err != nil {
			return nil, err
		}
	}
	// Each round runs every measurement once, in an order rotated per round,
	// so a noisy host's bursts are spread over all of them. The sbxlog
	// claim-path nodes (every level) and the HTTP floor are measured
	// interleaved claim by claim, so the levels' figures are taken at the
	// same moments; the others (background work of their own, or seconds
	// per claim) run one at a time, the disk written back and the garbage
	// collected before each.
	var group []*system
	var runs []func() error
	for _, s := range systems {
		if s.name == sbxName || s.name == sbxStdName || isNoop(s.name) {
			group = append(group, s)
			continue
		}
		n := cfg.perRound
		if m, ok := cfg.jsonPerRound[s.live]; ok && s.name == jsonName {
			n = min(n, m)
		}
		runs = append(runs, func() error {
			d, err := sequential(ctx, s, n)
			s.seq = append(s.seq, d...)
			return err
		})
	}
	runs = append(runs,
		func() error { return interleaved(ctx, group, cfg.perRound) },
		func() error { return fsyncFloor.measure(cfg.perRound) },
		func() error { return logFloor.measure(ctx, cfg.perRound) })
	for r := 0; r < cfg.rounds; r++ {
		for i := range runs {
			quiesce()
			if err := runs[(i+r)%len(runs)](); err != nil {
				return nil, err
			}
		}
	}
	for _, s := range systems {
		bound := time.Duration(0)
		if s.name == jsonName {
			bound = cfg.jsonConcMax
			// Its commits serialise: with every client's first claim in
			// flight the run lasts clients x a commit, whatever the bound.
			if time.Duration(cfg.clients)*s.seq.Quantile(0.5) > 2*bound {
				continue
			}
		}
		quiesce()
		if err := concurrent(ctx, s, cfg.clients, cfg.perClient, bound); err != nil {
			return nil, err
		}
	}
	return buildSection(cfg, systems, fsyncFloor.lat, logFloor.lat), nil
}

func buildSection(cfg config, systems []*system, fsyncs, appends report.Durations) *report.Section {
	sec := &report.Section{
		Title: "HTTP API: warm claim over loopback, vs the old claims.json store",
		Method: fmt.Sprintf("POST /v1/claim over loopback HTTP/1.1 with keep-alive (server and client in one process; "+
			"timed from request to the last byte of the reply). Client: the bench's lean HTTP/1.1 client (one keep-alive "+
			"connection per client, the request written with one write, the reply read and parsed by net/http.ReadResponse "+
			"on the caller's goroutine), the same for every row; the rows marked 'Go net/http client' measure the same "+
			"servers through Go's net/http.Client, whose Transport passes each request and reply through goroutines of its "+
			"own, interleaved with the lean rows. Server: Go's net/http. sbxlog: the real api.Server (with metrics), engine and Pebble "+
			"op log on the scratch disk (every claim durable before its reply: fsync, shared between concurrent claims), with "+
			"the hypervisor replaced by an IN-PROCESS HYPERVISOR FAKE that answers executor intents at once. Each level runs "+
			"on its own node, its live claims built by proposing claims through the engine directly, with a warm pool of %d. "+
			"'sbxlog' rows measure the claim path: the engine's refills are held back during timed runs and done between "+
			"them; the 'refills running' row is the daemon as configured (engine refill delay %s), where each warm claim "+
			"also brings a refill op and a clone result op onto the same log and the same cores (the fake answers clones "+
			"at once, so they land right behind the claims). Comparator: the old daemon's claim (insert into the live-claims "+
			"map, rewrite the whole map as claims.json: maps.Clone, json.Marshal, write temp, rename) behind the same HTTP "+
			"client, without fsync (old default) and with fsync (file before rename, directory after); it does no refill "+
			"work. Sequential: one client, %d rounds; in each, the claim-path nodes of every level and the HTTP floors (both clients) are "+
			"measured interleaved in blocks of %d claims (so the levels are compared at nearly the same moments), the other rows one run "+
			"each, in an order rotated per round, the disk written back and garbage collected before each run (untimed); "+
			"the claims of a run are released after it, so the live count stays within a run's claims of the level. Concurrent: %d clients with their own connections, %d claims each (the comparator "+
			"stops after %s). Floors, measured in the same rounds: an HTTP no-op (bare, and behind the API's body guard), a raw append+fdatasync, a 1-event op log append.",
			cfg.warm, engine.DefaultRefillDelay, cfg.rounds, interleaveBlock, cfg.clients, cfg.perClient, cfg.jsonConcMax),
		Header: []string{"claim served by", "fsync", "live claims", "samples", "p50", "p99", "p50 vs sbxlog", "claims/s @64", "p50 @64", "p99 @64"},
	}
	sbx := map[int]*system{}
	for _, s := range systems {
		if s.name == sbxName {
			sbx[s.live] = s
		}
	}
	var noop, noopStd, noopGuard, sbxStd *system
	for _, s := range systems {
		switch s.name {
		case noopName:
			noop = s
			continue
		case noopStdName:
			noopStd = s
			continue
		case noopGuardName:
			noopGuard = s
			continue
		case sbxStdName:
			sbxStd = s
		}
		ratio := fmt.Sprintf("%.2fx", float64(s.seq.Quantile(0.5))/float64(sbx[s.live].seq.Quantile(0.5)))
		rate, c50, c99 := "not run", "-", "-"
		if s.concN > 0 {
			rate, c50, c99 = fmt.Sprintf("%.0f", s.concRate), report.Fmt(s.conc.Quantile(0.5)), report.Fmt(s.conc.Quantile(0.99))
		}
		sec.AddRow(s.name, s.fsync, s.live, len(s.seq), report.Fmt(s.seq.Quantile(0.5)), report.Fmt(s.seq.Quantile(0.99)),
			ratio, rate, c50, c99)
	}
	for _, f := range []struct {
		label string
		s     *system
	}{{"floor: HTTP round trip, no-op handler", noop}, {"floor: HTTP round trip, no-op handler, Go net/http client", noopStd},
		{"floor: HTTP round trip, no-op handler behind the API's body guard", noopGuard}} {
		sec.AddRow(f.label, "no", "-", len(f.s.seq), report.Fmt(f.s.seq.Quantile(0.5)), report.Fmt(f.s.seq.Quantile(0.99)),
			"-", fmt.Sprintf("%.0f", f.s.concRate), report.Fmt(f.s.conc.Quantile(0.5)), report.Fmt(f.s.conc.Quantile(0.99)))
	}
	sec.AddRow("floor: 256 B append + fdatasync, scratch disk", "yes", "-", len(fsyncs), report.Fmt(fsyncs.Quantile(0.5)), report.Fmt(fsyncs.Quantile(0.99)),
		"-", "-", "-", "-")
	sec.AddRow("floor: op log append, 1 event, 1 writer", "yes (Pebble)", "-", len(appends), report.Fmt(appends.Quantile(0.5)), report.Fmt(appends.Quantile(0.99)),
		"-", "-", "-", "-")

	first, last := sbx[cfg.levels[0]], sbx[cfg.levels[len(cfg.levels)-1]]
	worst := time.Duration(0)
	for _, l := range cfg.levels {
		worst = max(worst, sbx[l].seq.Quantile(0.5))
	}
	var refilling *system
	for _, s := range systems {
		if s.name == sbxRefilling {
			refilling = s
		}
	}
	sec.Verdict(worst <= cfg.p50Target, "sbxlog warm claim p50 over HTTP with the fsync included: %s at worst over %v live claims (target <= %s); "+
		"with refills running alongside: %s at %d; through Go's net/http client: %s at %d (its no-op floor %s, %s against the lean client's); "+
		"floors HTTP %s + op log append %s = %s",
		report.Fmt(worst), cfg.levels, report.Fmt(cfg.p50Target), report.Fmt(refilling.seq.Quantile(0.5)), refilling.live,
		report.Fmt(sbxStd.seq.Quantile(0.5)), sbxStd.live, report.Fmt(noopStd.seq.Quantile(0.5)),
		report.FmtDelta(noopStd.seq.Quantile(0.5)-noop.seq.Quantile(0.5)),
		report.Fmt(noop.seq.Quantile(0.5)), report.Fmt(appends.Quantile(0.5)), report.Fmt(noop.seq.Quantile(0.5)+appends.Quantile(0.5)))
	sec.Notes = append(sec.Notes, fmt.Sprintf("the body guard (every request declaring a body, claims included): %s at p50 on a no-op round trip (%s vs %s), measured in the same blocks",
		report.FmtDelta(noopGuard.seq.Quantile(0.5)-noop.seq.Quantile(0.5)), report.Fmt(noopGuard.seq.Quantile(0.5)), report.Fmt(noop.seq.Quantile(0.5))))
	r := float64(last.seq.Quantile(0.5)) / float64(first.seq.Quantile(0.5))
	sec.Verdict(r <= cfg.ratioTarget, "p50 at %d live claims is %.2fx p50 at %d (%s vs %s; target <= %.1fx)",
		last.live, r, first.live, report.Fmt(last.seq.Quantile(0.5)), report.Fmt(first.seq.Quantile(0.5)), cfg.ratioTarget)
	for _, s := range systems {
		if s.name != jsonName && !isNoop(s.name) && (len(s.tiers) != 1 || s.tiers["warm"] == 0) {
			sec.Notes = append(sec.Notes, fmt.Sprintf("%s at %d live claims served tiers %v (expected warm only)", s.name, s.live, s.tiers))
		}
		if s.name == jsonName && s.concN == 0 {
			sec.Notes = append(sec.Notes, fmt.Sprintf("claims.json at %d live claims, fsync %s: 64-client run not made: its commits serialise, so it would last about %d x %s; its rate is about 1/p50 = %.1f claims/s",
				s.live, s.fsync, cfg.clients, report.Fmt(s.seq.Quantile(0.5)), 1/s.seq.Quantile(0.5).Seconds()))
		}
	}
	sec.Notes = append(sec.Notes, "The hypervisor is faked in-process for every sbxlog row; the claim path (HTTP, auth, fsm, Pebble fsync, reply) is the daemon's.",
		fmt.Sprintf("Load average at the end of the run: %s.", report.LoadAvg()))
	return sec
}

// sequential makes n claims one after another and returns their latencies;
// the claims are released afterwards.
func sequential(ctx context.Context, s *system, n int) (report.Durations, error) {
	out := make(report.Durations, 0, n)
	ids := make([]string, 0, n)
	for i := 0; i < n; i++ {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		d, cr, err := s.seq0().claim(ctx)
		if err != nil {
			return nil, fmt.Errorf("%s (%s, %d live): %w", s.name, s.fsync, s.live, err)
		}
		out = append(out, d)
		ids = append(ids, cr.ID)
		s.countTier(cr.Tier)
	}
	return out, s.release(ctx, ids)
}

// interleaveBlock is how many claims in a row interleaved makes on one
// system: short enough that every system is measured at nearly the same
// moments, long enough that the path is warm (a connection used once per
// pass over many servers is measured cold: about 50 µs more per claim).
const interleaveBlock = 20

// interleaved makes n claims on every system of group, in blocks of
// interleaveBlock per system taken in turn (the first system rotating), so
// every system is measured at nearly the same moments; the claims are
// released afterwards.
func interleaved(ctx context.Context, group []*system, n int) error {
	// Claims are released per server: a system measured through two
	// clients settles once, with both clients' claims gone.
	ids := map[*system][]string{}
	var servers []*system
	for b := 0; b*interleaveBlock < n; b++ {
		for k := range group {
			s := group[(b+k)%len(group)]
			srv := s.server()
			if _, ok := ids[srv]; !ok {
				servers = append(servers, srv)
				ids[srv] = nil
			}
			for i := b * interleaveBlock; i < min(n, (b+1)*interleaveBlock); i++ {
				d, cr, err := s.seq0().claim(ctx)
				if err != nil {
					return fmt.Errorf("%s (%d live): %w", s.name, s.live, err)
				}
				s.seq = append(s.seq, d)
				ids[srv] = append(ids[srv], cr.ID)
				s.countTier(cr.Tier)
			}
		}
	}
	for _, srv := range servers {
		if err := srv.release(ctx, ids[srv]); err != nil {
			return err
		}
	}
	return nil
}

// concurrent runs clients goroutines of perClient claims each (stopping
// early after bound, when set) and records the rate and latencies.
func concurrent(ctx context.Context, s *system, clients, perClient int, bound time.Duration) error {
	var (
		mu   sync.Mutex
		lat  report.Durations
		ids  []string
		errs []error
		stop atomic.Bool
		wg   sync.WaitGroup
	)
	start := time.Now()
	for g := 0; g < clients; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := s.newClient()
			defer c.close()
			for i := 0; i < perClient && !stop.Load() && ctx.Err() == nil; i++ {
				d, cr, err := c.claim(ctx)
				mu.Lock()
				if err != nil {
					errs = append(errs, err)
					mu.Unlock()
					return
				}
				lat = append(lat, d)
				ids = append(ids, cr.ID)
				s.countTier(cr.Tier)
				mu.Unlock()
				if bound > 0 && time.Since(start) > bound {
					stop.Store(true)
				}
			}
		}()
	}
	wg.Wait()
	wall := time.Since(start)
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%s (%s, %d live) concurrent: %w", s.name, s.fsync, s.live, err)
	}
	s.conc, s.concN = lat, len(lat)
	s.concRate = float64(len(lat)) / wall.Seconds()
	return s.release(ctx, ids)
}

func (s *system) countTier(t string) {
	if s.tiers == nil {
		s.tiers = map[string]int{}
	}
	s.tiers[t]++
}

var claimBody = []byte(`{"template":"default","net":"none","size":"small","ttl_seconds":3600}`)

// newClient returns a client of the system's kind on its server (with its
// own connection, for the lean kind).
func (s *system) newClient() claimClient {
	if s.std != nil {
		return &netHTTPClient{c: s.std, url: s.url}
	}
	return newConnClient(s.url)
}

// seq0 is the client sequential runs use.
func (s *system) seq0() claimClient {
	if s.seqClient == nil {
		s.seqClient = s.newClient()
	}
	return s.seqClient
}

// server is the system that owns s's server.
func (s *system) server() *system {
	if s.owner != nil {
		return s.owner
	}
	return s
}

// throughStd measures s's server through Go's net/http.Client.
func throughStd(s *system, name string, std *http.Client) *system {
	return &system{name: name, fsync: s.fsync, live: s.live, url: s.url, std: std,
		owner: s, release: s.release, close: s.close}
}

// holdRefills is the engine RefillDelay of the claim-path nodes: longer than
// any run, so refills happen between timed runs (settle proposes them).
const holdRefills = 24 * time.Hour

// startSbxlog starts an in-process node (hypervisor faked) holding live
// running claims and a pool of warm VMs. With hold, the engine's refill loop
// is held back and refills happen only in settle, between timed runs;
// without, the engine refills as in the daemon.
func startSbxlog(ctx context.Context, dir string, live, warm int, hold bool) (*system, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	opts := nodetest.Options{
		Dir: dir, RootToken: rootToken, Log: zerolog.Nop(),
		Pools: []fsm.PoolSpec{{PoolKey: key, Warm: 0, WarmMax: warm}},
	}
	name := sbxRefilling
	if hold {
		opts.RefillDelay, name = holdRefills, sbxName
	}
	n, err := nodetest.Start(opts)
	if err != nil {
		return nil, err
	}
	s := &system{name: name, fsync: "yes (Pebble)", live: live, url: n.URL, close: n.Close}
	s.release = func(ctx context.Context, ids []string) error {
		if err := parallel(ctx, ids, 32, func(id string) error {
			_, err := n.Engine.Propose(ctx, fsm.Release{Meta: n.Engine.Meta(), Claim: id})
			return err
		}); err != nil {
			return err
		}
		return settle(ctx, n, live, warm)
	}
	// The live claims: proposed through the engine, served by the fake's
	// clones (the pool has no warm VMs yet).
	ids := make([]string, live)
	for i := range ids {
		ids[i] = newClaimID()
	}
	if err := parallel(ctx, ids, 256, func(id string) error {
		_, err := n.Engine.Propose(ctx, fsm.Claim{Meta: n.Engine.Meta(), ID: id, Key: key, TTLSeconds: fsm.MaxTTLSeconds})
		return err
	}); err != nil {
		n.Close()
		return nil, err
	}
	if _, err := n.Engine.Propose(ctx, fsm.ConfigurePools{Meta: n.Engine.Meta(), Pools: []fsm.PoolSpec{{PoolKey: key, Warm: warm}}}); err != nil {
		n.Close()
		return nil, err
	}
	if err := settle(ctx, n, live, warm); err != nil {
		n.Close()
		return nil, err
	}
	return s, nil
}

// settle waits until the node has refilled and exactly live claims remain.
func settle(ctx context.Context, n *nodetest.Node, live, warm int) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	for {
		// Refill explicitly (up to fsm.MaxRefillBatch per op): a node
		// holding its refills back would not.
		if _, err := n.Engine.Propose(ctx, fsm.Refill{Meta: n.Engine.Meta(), Key: key}); err != nil {
			return err
		}
		var short bool
		n.Engine.View(func(st *fsm.State) { short = len(fsm.RefillsNeeded(st)) > 0 })
		if !short {
			break
		}
	}
	if err := n.WaitWarm(ctx, key, warm); err != nil {
		return err
	}
	if err := n.Settle(ctx); err != nil {
		return err
	}
	if got := n.LiveClaims(); got != live {
		return fmt.Errorf("node holds %d live claims, want %d", got, live)
	}
	return nil
}

// parallel runs fn over items with at most width at a time.
func parallel(ctx context.Context, items []string, width int, fn func(string) error) error {
	var (
		wg   sync.WaitGroup
		next atomic.Int64
		mu   sync.Mutex
		errs []error
	)
	for w := 0; w < width; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				i := int(next.Add(1)) - 1
				if i >= len(items) {
					return
				}
				if err := fn(items[i]); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
					return
				}
			}
		}()
	}
	wg.Wait()
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	return ctx.Err()
}

func newClaimID() string {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	return "sb_" + hex.EncodeToString(b[:])
}

// listen serves h on a fresh loopback port.
func listen(h http.Handler) (url string, closeFn func() error, err error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	return "http://" + ln.Addr().String(), func() error {
		srv.Close()
		if err := <-done; !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	}, nil
}

// System names.
const (
	noopName    = "floor: HTTP no-op"
	noopStdName = "floor: HTTP no-op, Go net/http client"
	// noopGuardName is the no-op behind the API server's body guard, so
	// the guard's price is read against the bare no-op in the same blocks.
	noopGuardName = "floor: HTTP no-op, body guard"
	jsonName      = "claims.json"
	sbxName       = "sbxlog"
	sbxStdName    = "sbxlog, Go net/http client"
	sbxRefilling  = "sbxlog, refills running"
)

// isNoop reports whether name is one of the HTTP floors.
func isNoop(name string) bool {
	return name == noopName || name == noopStdName || name == noopGuardName
}

// startNoopGuarded is startNoop's handler behind the API's body guard.
func startNoopGuarded() (*system, error) {
	return startNoopWith(noopGuardName, func(h http.Handler) http.Handler { return api.BodyGuard(h, time.Minute) })
}

// startNoop serves a fixed claim reply: the HTTP floor of a claim.
func startNoop() (*system, error) {
	return startNoopWith(noopName, func(h http.Handler) http.Handler { return h })
}

func startNoopWith(name string, wrap func(http.Handler) http.Handler) (*system, error) {
	reply, _ := json.Marshal(api.ClaimResponse{ID: "sb_0123456789abcdef", Token: "sbt_" + strings.Repeat("0", 64),
		Deadline: time.Now().UTC().Format(time.RFC3339Nano), OwnerAddr: "127.0.0.1:7777", Template: "default",
		Net: "none", Size: "small", Tier: "warm", VM: "vm-0123456789abcdef"})
	url, closeFn, err := listen(wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(reply)
	})))
	if err != nil {
		return nil, err
	}
	return &system{name: name, fsync: "no", url: url, close: closeFn,
		release: func(context.Context, []string) error { return nil }}, nil
}

// syncFloor measures one small append plus fdatasync on the scratch disk:
// what one durable commit costs at least.
type syncFloor struct {
	f   *os.File
	buf []byte
	lat report.Durations
}

func newSyncFloor(path string) (*syncFloor, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	return &syncFloor{f: f, buf: make([]byte, 256)}, nil
}

func (s *syncFloor) measure(n int) error {
	for i := 0; i < n; i++ {
		start := time.Now()
		if _, err := s.f.Write(s.buf); err != nil {
			return err
		}
		if err := syscall.Fdatasync(int(s.f.Fd())); err != nil {
			return err
		}
		s.lat = append(s.lat, time.Since(start))
	}
	return nil
}

func (s *syncFloor) close() error { return s.f.Close() }

// quiesce runs before every timed run, untimed: it writes back what the
// previous run left dirty (the comparator writes megabytes per claim) and
// collects its garbage, so one system's leftovers are not billed to the
// next one.
func quiesce() {
	syscall.Sync()
	runtime.GC()
}

// logFloor appends one claim_created event at a time to an op log of its
// own: the durable-commit floor of a claim (eventlog + Pebble + fsync).
type logFloor struct {
	l    *eventlog.Log
	tmpl event.Event
	ops  uint64
	lat  report.Durations
}

func newLogFloor(dir string) (*logFloor, error) {
	l, err := eventlog.Open(dir, eventlog.Options{NodeID: "floor", Logger: zerolog.Nop()})
	if err != nil {
		return nil, err
	}
	p := event.ClaimCreated{
		Claim: "sb_0123456789abcdef", Key: event.PoolKey{Template: "default", Net: "none", Size: "small"},
		VM: "vm-0123456789abcdef", Tier: "warm", TTLSeconds: 3600,
		DeadlineNS: 1_800_000_000_000_000_000, ServeByNS: 1_790_000_000_000_000_000, TokenGen: 1,
	}
	tmpl, err := event.New(p, p.Claim, event.OpIDFromUint(1, 1), event.ZeroOpID, 1_790_000_000_000_000_000)
	if err != nil {
		l.Close()
		return nil, err
	}
	return &logFloor{l: l, tmpl: tmpl}, nil
}

func (f *logFloor) measure(ctx context.Context, n int) error {
	for i := 0; i < n; i++ {
		f.ops++
		ev := f.tmpl
		ev.OpID = event.OpIDFromUint(uint64(time.Now().UnixMilli()), f.ops)
		start := time.Now()
		if _, err := f.l.Append(ctx, []event.Event{ev}); err != nil {
			return err
		}
		f.lat = append(f.lat, time.Since(start))
	}
	return nil
}

func (f *logFloor) close() error { return f.l.Close() }
