package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/sbxlog/sbxlog/cmd/sandboxd/replservice"
	"github.com/sbxlog/sbxlog/eventlog"
	"github.com/sbxlog/sbxlog/executors"
	"github.com/sbxlog/sbxlog/executors/ch"
	"github.com/sbxlog/sbxlog/executors/chdriver"
	"github.com/sbxlog/sbxlog/executors/fsx"
	"github.com/sbxlog/sbxlog/executors/qemu"
	"github.com/sbxlog/sbxlog/executors/reconcile"
	"github.com/sbxlog/sbxlog/executors/vmm"
	"github.com/sbxlog/sbxlog/fsm"
	"github.com/sbxlog/sbxlog/fsm/engine"
	"github.com/sbxlog/sbxlog/projections/api"
	"github.com/sbxlog/sbxlog/projections/auth"
)

// snapshotEvery bounds the tail a restart replays: a snapshot is taken once
// this many events were applied since the last one.
const snapshotEvery = 50_000

// daemon is a running sandboxd.
type daemon struct {
	cfg    Config
	zl     zerolog.Logger
	log    *eventlog.Log
	repl   *service.Service // nil: replication off
	eng    *engine.Engine
	pool   *executors.Pool
	driver interface{ Close() }
	srv    *api.Server
	http   *http.Server
	ln     net.Listener

	mu       sync.Mutex
	snapSeq  uint64
	stopOnce sync.Once
	stopped  chan struct{}
	bg       sync.WaitGroup
}

// proposer adapts the engine to executors.Proposer.
type proposer struct{ eng *engine.Engine }

func (p proposer) Propose(ctx context.Context, cmd fsm.Command) error {
	_, err := p.eng.Propose(ctx, cmd)
	return err
}

func newLogger(level string) zerolog.Logger {
	lvl, err := zerolog.ParseLevel(level)
	if err != nil || level == "" {
		lvl = zerolog.InfoLevel
	}
	return zerolog.New(os.Stderr).Level(lvl).With().Timestamp().Str("component", "sandboxd").Logger()
}

func newInstanceID() string {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	return "i-" + hex.EncodeToString(b[:])
}

// start brings the daemon up in the documented order and returns once it
// serves HTTP.
func start(ctx context.Context, cfg Config) (*daemon, error) {
	zl := newLogger(cfg.LogLevel)
	d := &daemon{cfg: cfg, zl: zl, stopped: make(chan struct{})}
	ok := false
	defer func() {
		if !ok {
			d.closeAll()
		}
	}()

	dataDir, err := filepath.Abs(cfg.DataDir)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dataDir, 0o755); err != nil {
		return nil, fmt.Errorf("data dir: %w", err)
	}
	secret, err := auth.LoadOrCreateSecret(filepath.Join(dataDir, "node.secret"))
	if err != nil {
		return nil, err
	}
	rootToken := cfg.APIToken
	if rootToken == "" && cfg.APITokenFile != "" {
		path, err := filepath.Abs(cfg.APITokenFile)
		if err != nil {
			return nil, err
		}
		var created bool
		if rootToken, created, err = loadOrCreateToken(path); err != nil {
			return nil, err
		}
		verb := "read from"
		if created {
			verb = "generated into"
		}
		zl.Info().Str("api_token_file", path).Msgf("root API token %s %s; sbxctl reads data/api.token from its working directory (run it where you ran make run), else export SBX_API_TOKEN=$(cat %s)", verb, path, path)
	}
	authn, err := auth.New(rootToken, cfg.Tenants, secret)
	if err != nil {
		return nil, err
	}
	if rootToken == "" {
		zl.Warn().Msg("no api_token configured: root-only routes answer 401")
	}

	defer startGC()()

	// 1. The log, then the state: latest snapshot plus the tail.
	d.log, err = eventlog.Open(filepath.Join(dataDir, "log"), eventlog.Options{NodeID: cfg.NodeID, Logger: zl})
	if err != nil {
		return nil, err
	}
	firstStart := d.log.LastSeq() == 0
	// Replication follows the log from here on: it publishes what is
	// durable, independently of the state's rebuild below.
	if !cfg.NATS.Disabled {
		if d.repl, err = startReplication(cfg, dataDir, d.log, zl); err != nil {
			return nil, err
		}
	} else {
		zl.Info().Msg("replication disabled (nats.disabled / -no-nats)")
	}
	res, err := engine.Rebuild(d.log, engine.RebuildOptions{TrustSnapshot: true})
	if err != nil {
		return nil, err
	}
	d.snapSeq = res.SnapshotSeq
	ev := zl.Info().Uint64("seq", res.Seq).Uint64("snapshot_seq", res.SnapshotSeq).Int("tail_events", res.Events).
		Dur("elapsed", res.Elapsed).Int("live_claims", res.State.LiveClaims())
	if res.SnapshotErr != nil {
		ev = ev.AnErr("snapshot_skipped", res.SnapshotErr)
	}
	ev.Msg("state rebuilt from the op log")

	var metrics *api.Metrics
	d.eng = engine.New(d.log, res.State, engine.Options{
		Log:      zl,
		OnAppend: func(dur time.Duration) { metrics.ObserveAppend(dur) },
	})
	metrics = api.NewMetrics(d.eng)

	// 2. Node identity, first-start pools, limits.
	var node, instance string
	d.eng.View(func(st *fsm.State) { node, instance = st.Node(), st.Instance() })
	if node == "" {
		instance = newInstanceID()
		if _, err := d.eng.Propose(ctx, fsm.ConfigureNode{Meta: d.eng.Meta(), Node: cfg.NodeID, Instance: instance}); err != nil {
			return nil, fmt.Errorf("record node identity: %w", err)
		}
		zl.Info().Str("node", cfg.NodeID).Str("instance", instance).Msg("new node: identity recorded in the log")
	}
	if firstStart && len(cfg.Pools) > 0 {
		specs := make([]fsm.PoolSpec, len(cfg.Pools))
		for i, p := range cfg.Pools {
			specs[i] = fsm.PoolSpec{PoolKey: fsm.PoolKey{Template: p.Template, Net: p.Net, Size: p.Size}, Warm: p.Warm, WarmMax: p.WarmMax, IdleHibernateSeconds: p.IdleHibernateSeconds}
		}
		if _, err := d.eng.Propose(ctx, fsm.ConfigurePools{Meta: d.eng.Meta(), Pools: specs}); err != nil {
			return nil, fmt.Errorf("apply configured pools: %w", err)
		}
		zl.Info().Int("pools", len(specs)).Msg("first start: pools from the config applied; PUT /v1/pools owns them from now on")
	} else if len(cfg.Pools) > 0 {
		zl.Info().Msg("pools come from the log (PUT /v1/pools); the config's pools apply only on a first start")
	}
	if err := d.applyLimits(ctx); err != nil {
		return nil, err
	}

	// 3. Executors: resolve the hypervisor, prepare the roots.
	hv, bin, err := resolveHypervisor(cfg)
	if err != nil {
		return nil, err
	}
	zl.Info().Str("hypervisor", hv).Str("binary", bin).Msg("hypervisor selected")
	roots := executors.RootsIn(dataDir)
	var drv executors.Driver
	var copyMode fsx.Method
	var swept []string
	if hv == "qemu" {
		q, err := newQEMUDriver(cfg, bin, roots, instance, zl)
		if err != nil {
			return nil, err
		}
		d.driver, drv = q, q
		q.OnExit(func(e qemu.Exit) { d.vmExited(e.VM, fmt.Sprintf("QEMU (pid %d) exited", e.Pid)) })
		prep, err := q.Prepare(ctx)
		if err != nil {
			return nil, err
		}
		copyMode, swept = prep.CopyMode, prep.Swept
	} else {
		c, err := chdriver.New(chdriver.Config{
			Roots: roots, Instance: instance, VMM: bin, Hypervisor: chdriver.Hypervisor(hv),
			CgroupSlice: vmm.DefaultCgroupSlice(), RestoreMode: ch.MemoryRestoreMode(cfg.RestoreMode),
			Bridge: cfg.Bridge, Log: zl, StepHook: crashHook(zl),
		})
		if err != nil {
			return nil, err
		}
		d.driver, drv = c, c
		// VMMs that die on their own from now on (adopted by the reconcile
		// below or launched later) are recorded and their policy applied.
		c.OnExit(func(e chdriver.Exit) { d.vmExited(e.VM, fmt.Sprintf("VMM (pid %d) exited", e.Pid)) })
		prep, err := c.Prepare(ctx)
		if err != nil {
			return nil, err
		}
		copyMode, swept = prep.CopyMode, prep.Swept
	}
	zl.Info().Str("copy_mode", copyMode.String()).Int("temp_dirs_swept", len(swept)).Msg("executors prepared")

	// 4. Reconcile: adopt the VMs the state says run, record the dead ones,
	// kill VMMs and remove run dirs no state owns (this instance's only),
	// before any executor runs.
	if rd, ok := drv.(reconcile.Driver); ok {
		if _, err := reconcile.Run(ctx, d.reconcileOptions(rd)); err != nil {
			return nil, err
		}
	} else {
		zl.Warn().Str("hypervisor", hv).Msg("this driver has no start-up reconcile; intents re-run and adopt their VMMs by pid file")
	}

	// 5. API and executor pool; commits feed both from now on.
	apiOpts := api.Options{Log: zl, Metrics: metrics}
	var apiEng api.Engine = d.eng
	if d.repl != nil {
		apiOpts.Redirector = redirector{svc: d.repl, self: cfg.NodeID}
		apiOpts.Replication = func() any { return d.repl.Status() }
		if cfg.NATS.Sync {
			apiEng = syncEngine{eng: d.eng, svc: d.repl, timeout: cfg.NATS.syncTimeout()}
		}
	}
	d.srv = api.New(api.Config{OwnerAddr: cfg.OwnerAddr, Node: cfg.NodeID, Hypervisor: hv}, apiEng, d.log, authn, apiOpts)
	d.pool = executors.NewPool(drv, proposer{d.eng}, executors.PoolOptions{Concurrency: cfg.RefillConcurrency, Log: zl, Observer: metrics})
	d.eng.SetOnCommit(func(c engine.Commit) {
		d.srv.OnCommit(c.Events)
		if len(c.Intents) > 0 {
			d.pool.Offer(c.Intents)
		}
	})

	// 6. Start the executors with every pending intent (in-flight recipes
	// resume under their op ids) and the engine's loops; only now may the
	// VM view send its first sync.
	d.pool.Offer(d.eng.Intents())
	d.eng.Start()
	d.srv.SetReady()

	// 7. Serve.
	d.ln, err = net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, err
	}
	streams, endStreams := context.WithCancel(context.Background())
	d.http = &http.Server{Handler: endStreamsOn(streams, d.srv), ReadHeaderTimeout: 10 * time.Second}
	d.http.RegisterOnShutdown(endStreams)
	d.bg.Add(2)
	go func() {
		defer d.bg.Done()
		if err := d.http.Serve(d.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			zl.Error().Err(err).Msg("http server")
		}
	}()
	go func() { defer d.bg.Done(); d.snapshotLoop() }()
	if d.repl != nil {
		d.bg.Add(1)
		go func() { defer d.bg.Done(); replicatedGauge(d.stopped, d.repl, metrics) }()
	}
	zl.Info().Str("listen", d.ln.Addr().String()).Str("node", cfg.NodeID).Str("instance", instance).Msg("sandboxd serving")
	ok = true
	return d, nil
}

func (d *daemon) reconcileOptions(rd reconcile.Driver) reconcile.Options {
	return reconcile.Options{
		Driver: rd, Propose: proposer{d.eng}, View: d.eng.View, Meta: d.eng.Meta,
		Policy: d.cfg.restartPolicy(), Log: d.zl,
	}
}

// vmExited records a VM whose VMM died while the daemon runs.
func (d *daemon) vmExited(vm, detail string) {
	rd, ok := d.driver.(reconcile.Driver)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := reconcile.ReportExit(ctx, d.reconcileOptions(rd), vm, detail); err != nil && !errors.Is(err, engine.ErrStopped) {
		d.zl.Error().Err(err).Str("vm", vm).Msg("could not record a VM whose VMM exited")
	}
}

// applyLimits records max_claims and the tenants' caps when they differ
// from the state's: the config owns limits.
func (d *daemon) applyLimits(ctx context.Context) error {
	caps := map[string]int{}
	for _, t := range d.cfg.Tenants {
		if t.MaxClaims > 0 {
			caps[t.Name] = t.MaxClaims
		}
	}
	var cur fsm.Limits
	d.eng.View(func(st *fsm.State) { cur = st.Limits() })
	same := cur.MaxClaims == d.cfg.MaxClaims && len(cur.TenantCaps) == len(caps)
	for k, v := range caps {
		same = same && cur.TenantCaps[k] == v
	}
	if same {
		return nil
	}
	if _, err := d.eng.Propose(ctx, fsm.ConfigureLimits{Meta: d.eng.Meta(), MaxClaims: d.cfg.MaxClaims, TenantCaps: caps}); err != nil {
		return fmt.Errorf("apply limits: %w", err)
	}
	return nil
}

// resolveHypervisor picks the VMM binary: auto prefers cloud-hypervisor from
// PATH and falls back to chsim (next to this binary, then PATH).
func resolveHypervisor(cfg Config) (hv, bin string, err error) {
	find := func(name string) string {
		if exe, err := os.Executable(); err == nil {
			p := filepath.Join(filepath.Dir(exe), name)
			if fi, err := os.Stat(p); err == nil && !fi.IsDir() {
				return p
			}
		}
		if p, err := exec.LookPath(name); err == nil {
			if abs, err := filepath.Abs(p); err == nil {
				return abs
			}
		}
		return ""
	}
	switch cfg.Hypervisor {
	case "auto", "cloud-hypervisor":
		bin = cfg.CHBinary
		if bin == "" {
			if p, err := exec.LookPath("cloud-hypervisor"); err == nil {
				bin, _ = filepath.Abs(p)
			}
		}
		if bin != "" {
			return "cloud-hypervisor", bin, nil
		}
		if cfg.Hypervisor == "cloud-hypervisor" {
			return "", "", errors.New("hypervisor cloud-hypervisor: binary not found in PATH (set ch_binary)")
		}
		fallthrough
	case "chsim":
		if bin = find("chsim"); bin == "" {
			return "", "", errors.New("no cloud-hypervisor binary and no chsim next to sandboxd or in PATH (run make build)")
		}
		return "chsim", bin, nil
	case "qemu":
		if bin, err = resolveQEMU(cfg); err != nil {
			return "", "", err
		}
		return "qemu", bin, nil
	}
	return "", "", fmt.Errorf("unknown hypervisor %q", cfg.Hypervisor)
}

// snapshotLoop saves a state snapshot once snapshotEvery events were applied
// since the last one, so a restart replays a bounded tail.
func (d *daemon) snapshotLoop() {
	t := time.NewTicker(10 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-d.stopped:
			return
		case <-t.C:
		}
		var applied uint64
		d.eng.View(func(st *fsm.State) { applied = st.Applied() })
		d.mu.Lock()
		due := applied >= d.snapSeq+snapshotEvery
		d.mu.Unlock()
		if due {
			d.snapshot()
		}
	}
}

// snapshot saves the engine's state. The snapshot is written after the
// events it covers (Pebble's WAL is a prefix), so it never claims more than
// the log holds.
func (d *daemon) snapshot() {
	seq, data := d.eng.Snapshot()
	d.mu.Lock()
	defer d.mu.Unlock()
	if seq <= d.snapSeq {
		return
	}
	start := time.Now()
	if err := d.log.SaveSnapshot(seq, data); err != nil {
		d.zl.Error().Err(err).Uint64("seq", seq).Msg("state snapshot failed")
		return
	}
	d.snapSeq = seq
	d.zl.Info().Uint64("seq", seq).Int("bytes", len(data)).Dur("elapsed", time.Since(start)).Msg("state snapshot saved")
}

// stop is SIGTERM: stop serving, stop the executors (VMs keep running),
// snapshot, close the log.
func (d *daemon) stop() error {
	var err error
	d.stopOnce.Do(func() {
		close(d.stopped)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if d.http != nil {
			_ = d.http.Shutdown(ctx)
		}
		if d.pool != nil {
			if e := d.pool.Shutdown(ctx); e != nil {
				d.zl.Warn().Err(e).Msg("executors did not stop in time; their intents re-run on the next start")
			}
		}
		if d.eng != nil {
			d.eng.Shutdown()
			if d.eng.Err() != nil && !errors.Is(d.eng.Err(), engine.ErrStopped) {
				err = d.eng.Err()
			} else {
				d.snapshot()
			}
		}
		d.bg.Wait()
		if d.repl != nil {
			flushReplication(d.repl, d.log, d.zl)
		}
		d.closeAll()
		d.zl.Info().Msg("sandboxd stopped; VMs left running")
	})
	return err
}

func (d *daemon) closeAll() {
	if d.driver != nil {
		d.driver.Close()
	}
	// Replication reads the log: it stops first.
	if d.repl != nil {
		if err := d.repl.Close(); err != nil {
			d.zl.Warn().Err(err).Msg("replication stopped with errors")
		}
	}
	if d.log != nil {
		_ = d.log.Close()
	}
}
