// Package node assembles one sandboxd node from its parts and runs it: the
// op log, the state rebuilt from it, the engine, the hypervisor driver, the
// start-up reconcile, the HTTP API, the executors, replication and the
// background loops. It is the one composition root: sandboxd, the API test
// harness (node/nodetest), the benchmarks and, through the sandboxd binary,
// the end-to-end tests all start nodes with Start and stop them with Stop.
//
// Start order (each step only once the previous one succeeded; a failure
// undoes the steps taken, in reverse):
//
//  1. data dir, node secret, env key (seals claims' env values),
//     authenticator (its tenants: the state's, from step 4);
//  2. open the op log;
//  3. replication (when configured): it follows the log from here on,
//     publishing what is durable, independently of the rebuild;
//  4. rebuild the state (latest snapshot + tail) and wrap it in the engine,
//     and the egress view over it (egress.go);
//  5. node identity (first start), the config's egress classes (until the
//     API owns them, egress.go), first-start pools with their egress
//     policies, the config's tenants (until the API owns them, see
//     tenants.go), the relays the last process left open recorded closed,
//     limits (only when they differ from the state's: the config owns
//     limits);
//  6. guarded egress's enforcement (proxy.go: the proxy, answering from the
//     egress view, and the lane of egress taps, when configured), then the
//     hypervisor driver, opened for the node's instance id with them, and
//     its Prepare (roots, temp-dir sweep, reflink detection);
//  7. the start-up reconcile (egress taps' locks repaired, adopt, report
//     dead, remove orphans), before any executor runs;
//  8. the API server and the executors, both fed by every commit from now
//     on;
//  9. every pending intent offered (in-flight recipes resume under their
//     op ids), the engine's timer and refill loops started;
//  10. ready: the VM view may send its first sync; then HTTP is served.
//
// Stop is the reverse: end the relays (recorded closed), stop serving, stop
// the executors (VMs keep running), close the egress proxy's doors, record
// the egress usage the meter holds, stop the engine, save a state
// snapshot, let replication publish the log's tail (bounded), close the
// driver, replication and the log.
//
// Beside the order live the two decorators of the claim path that depend on
// replication: the synchronous-replication engine (an API write answers only
// once JetStream acknowledged it) and the claim redirector over the cluster
// view (replication.go).
package node

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime/debug"
	"sync"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/rs/zerolog"

	"github.com/sbxlog/sbxlog/cmd/buildinfo"
	"github.com/sbxlog/sbxlog/cmd/sandboxd/node/replication"
	"github.com/sbxlog/sbxlog/eventlog"
	"github.com/sbxlog/sbxlog/executors"
	"github.com/sbxlog/sbxlog/executors/egress/nft"
	"github.com/sbxlog/sbxlog/executors/egress/proxy"
	"github.com/sbxlog/sbxlog/executors/fsx"
	"github.com/sbxlog/sbxlog/executors/layout"
	"github.com/sbxlog/sbxlog/executors/procstat"
	"github.com/sbxlog/sbxlog/executors/reconcile"
	"github.com/sbxlog/sbxlog/executors/scheduler"
	"github.com/sbxlog/sbxlog/fsm"
	"github.com/sbxlog/sbxlog/fsm/engine"
	"github.com/sbxlog/sbxlog/projections/api"
	"github.com/sbxlog/sbxlog/projections/auth"
	"github.com/sbxlog/sbxlog/projections/egressview"
	"github.com/sbxlog/sbxlog/projections/envseal"
)

// DefaultSnapshotEvery bounds the tail a restart replays: a snapshot is
// taken once this many events were applied since the last one.
const DefaultSnapshotEvery = 50_000

// HTTP connection bounds' defaults (Config.ReadHeaderTimeout and
// IdleTimeout): a client that opens connections and sends nothing, or keeps
// them idle, holds a file descriptor and a goroutine each until then.
const (
	DefaultReadHeaderTimeout = 10 * time.Second
	DefaultIdleTimeout       = 30 * time.Second
)

// startGCPercent is the GC target while a node starts. Rebuilding the state
// and reconciling allocate it all at once; collecting while it grows only
// re-marks what stays live, and at 100k live claims the default target
// spends a third of restart-to-serving in the collector (bench/restartbench
// measures this start path).
const startGCPercent = 400

// Driver is what a node needs of its hypervisor driver: the executors'
// port plus the node-level hooks. A driver that also implements
// reconcile.Driver is reconciled at start-up and has its VMMs' exits
// recorded; one that does not only re-runs intents.
type Driver interface {
	executors.Driver
	// Prepare readies the driver's roots before the reconcile and any
	// executor: makes them, sweeps temp dirs of crashed recipes, detects
	// how disks clone.
	Prepare(ctx context.Context) (Prepared, error)
	// OnExit registers fn, called when a VMM the driver watches exits on
	// its own (fn records it in the log).
	OnExit(fn func(vm, detail string))
	// VMMUsage reads the resource usage of the VMM process serving VM vm,
	// whose run dir is runDir (relative to the runs root, as the state
	// records it); no such process is an error wrapping
	// procstat.ErrNoProcess. It only reads, for GET /v1/sandboxes/{id}/stats.
	VMMUsage(ctx context.Context, vm, runDir string) (procstat.Usage, error)
	// Close stops watching VMMs; the VMs keep running.
	Close()
}

// Prepared is what a driver's Prepare reports.
type Prepared struct {
	CopyMode fsx.Method
	Swept    []string
}

// Hypervisor opens the node's driver once the node's instance id is known
// (it is recorded in the log on the first start, step 5).
type Hypervisor interface {
	// Name is the hypervisor as /v1/info and the log show it.
	Name() string
	// Open returns the driver owning instance's run dirs under roots (the
	// node's data dir layout).
	Open(roots layout.Roots, instance string) (Driver, error)
}

// Config configures a node. DataDir, NodeID and Hypervisor are required.
type Config struct {
	// DataDir holds the op log (DataDir/log), the node secret, run dirs,
	// the snapshot store and the replication store and journals.
	DataDir string
	// NodeID names this node's log (its JetStream subject).
	NodeID string
	// Listen is the HTTP address served, unless Listener is set.
	Listen string
	// Listener, when set, is served instead of listening on Listen (tests
	// bind 127.0.0.1:0 themselves to know the address first).
	Listener net.Listener
	// OwnerAddr is the address other nodes and clients reach this node at
	// (owner_addr in replies). Default: the listen address.
	OwnerAddr string
	// RootToken is the root API token ("" disables root).
	RootToken string
	// Tenants seed the tenant table until the API changes it (tenants.go);
	// plaintext tokens are hashed and go no further.
	Tenants []auth.TenantConfig
	// MaxClaims caps live claims (0 = no cap).
	MaxClaims int
	// Volumes is the volume catalog, applied at every start (volumes.go).
	Volumes []fsm.VolumeSpec
	// Pools are applied on a first start (an empty log) only; afterwards
	// PUT /v1/pools owns them.
	Pools []fsm.PoolSpec
	// Instance is the instance id recorded on a first start (default: a
	// random "i-<12 hex>").
	Instance string
	// RestartPolicy is stamped into VMExited commands (the zero policy
	// never restarts; sandboxd passes its configured or default policy).
	RestartPolicy fsm.RestartPolicy
	// Concurrency bounds executor operations (scheduler.DefaultConcurrency).
	Concurrency int
	// ReconcileConcurrency bounds the reconcile's adoptions (its default).
	ReconcileConcurrency int
	// RefillDelay is passed to the engine (0: its default).
	RefillDelay time.Duration
	// LogFS is the filesystem the op log lives on (nil: the real disk). A
	// test seam: tests hold its syncs or take crash images of it.
	LogFS vfs.FS
	// FullReplay rebuilds the state from the log's first event, ignoring
	// state snapshots (to measure or check a full replay).
	FullReplay bool
	// SnapshotEvery is how many applied events make a snapshot due
	// (default DefaultSnapshotEvery); SnapshotCheck how often that is
	// looked at (default 10 s).
	SnapshotEvery uint64
	SnapshotCheck time.Duration
	// ReadHeaderTimeout bounds reading a request's headers (default
	// DefaultReadHeaderTimeout); IdleTimeout closes a keep-alive connection
	// idle that long (default DefaultIdleTimeout). The body's bound is
	// API.BodyTimeout.
	ReadHeaderTimeout time.Duration
	IdleTimeout       time.Duration
	// Replication, when set, runs the node's replication (step 3).
	Replication *Replication
	// Redirector, when set, replaces the redirector replication provides
	// (tests of the redirect path without a cluster).
	Redirector api.Redirector
	// Proxy, when set, runs guarded egress's enforcement (proxy.go): the
	// egress proxy's doors for every VM and, with a bridge, the nftables
	// locks of egress taps.
	Proxy *ProxyConfig
	// API is passed to api.New; OwnerAddr, Node and Hypervisor are filled
	// in from the node when empty.
	API api.Config
	// DataPlane configures the routes to guests; its Dialer defaults to
	// the driver, when the driver is an executors.AgentDialer.
	DataPlane api.DataPlane
	// PreviewListen is the preview listener's address (preview URLs,
	// api.Server.PreviewHandler), unless PreviewListener is set; with
	// neither there is no preview. DataPlane.Preview.Advertise defaults to
	// the listener's address.
	PreviewListen   string
	PreviewListener net.Listener
	// Clock is the time the node's logic reads (the engine's stamps and
	// timers, the executors' backoff and parking, the API's answers);
	// default the system clock. Durations of
	// I/O (start phases, snapshot timing) are measured on the real clock.
	Clock engine.Clock
	// Egress configures guarded egress (egress.go).
	Egress EgressConfig
	Log    zerolog.Logger
}

// Replication configures step 3.
type Replication struct {
	// Options are the replication service's; Log, DataDir, OwnerAddr and
	// Logger are filled in from the node.
	Options replication.Options
	// RetryFreePort: when the embedded server's port is taken (a second
	// local daemon on the default port), retry on a free one instead of
	// failing.
	RetryFreePort bool
	// Sync makes API writes wait for the JetStream ack of their events, at
	// most SyncTimeout (default 5 s); then 503, the change committed here
	// all the same.
	Sync        bool
	SyncTimeout time.Duration
	// ShutdownFlush bounds Stop's wait for the stream to hold the log's
	// tail (default 5 s).
	ShutdownFlush time.Duration
}

// Phase is one start step and how long it took.
type Phase struct {
	Name string
	Dur  time.Duration
}

// Node is a running node.
type Node struct {
	cfg Config
	zl  zerolog.Logger
	// dirLock holds the data dir (datadirlock.go) until the node stops.
	dirLock *os.File
	Log     *eventlog.Log
	Repl    *replication.Service // nil: replication off
	// Engine is the single writer; Server the API; Executors run intents.
	Engine    *engine.Engine
	Server    *api.Server
	Executors *scheduler.Scheduler
	Driver    Driver
	Auth      *auth.Authenticator
	Metrics   *api.Metrics
	// Proxy is the egress proxy and Lane the egress taps' locks (nil
	// without Config.Proxy; Lane nil without its bridge).
	Proxy *proxy.Server
	Lane  *nft.Lane
	// EnvKey seals claims' env values; Egress is what the egress proxy
	// asks about each sandbox (egress.go).
	EnvKey *envseal.Key
	Egress *egressview.View
	// Instance is the instance id owning this node's VMs.
	Instance string
	// Phases are the start steps as they ran; Replayed is how many events
	// the rebuild applied after its snapshot; Reconciled what the start-up
	// reconcile found.
	Phases     []Phase
	Replayed   int
	Reconciled reconcile.Report

	http *http.Server
	ln   net.Listener
	// The preview listener (Config.PreviewListen), when configured.
	previewHTTP *http.Server
	previewLn   net.Listener

	tenants []fsm.TenantSpec // the config's, hashed

	mu       sync.Mutex
	snapSeq  uint64
	stopOnce sync.Once
	stopped  chan struct{}
	bg       sync.WaitGroup
	serveErr chan error
}

// proposer adapts the engine to the executors' and the reconcile's
// Proposer.
type proposer struct{ eng *engine.Engine }

func (p proposer) Propose(ctx context.Context, cmd fsm.Command) error {
	_, err := p.eng.Propose(ctx, cmd)
	return err
}

func newInstanceID() string {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	return "i-" + hex.EncodeToString(b[:])
}

// Start brings a node up in the order of the package doc and returns once
// it serves HTTP. On error everything it started is stopped again.
func Start(ctx context.Context, cfg Config, hv Hypervisor) (n *Node, err error) {
	switch {
	case cfg.DataDir == "":
		return nil, errors.New("node: Config.DataDir is required")
	case cfg.NodeID == "":
		return nil, errors.New("node: Config.NodeID is required")
	case hv == nil:
		return nil, errors.New("node: a Hypervisor is required")
	case cfg.Listener == nil && cfg.Listen == "":
		return nil, errors.New("node: Config.Listen or Config.Listener is required")
	}
	if cfg.SnapshotEvery == 0 {
		cfg.SnapshotEvery = DefaultSnapshotEvery
	}
	if cfg.SnapshotCheck <= 0 {
		cfg.SnapshotCheck = 10 * time.Second
	}
	if cfg.ReadHeaderTimeout <= 0 {
		cfg.ReadHeaderTimeout = DefaultReadHeaderTimeout
	}
	if cfg.IdleTimeout <= 0 {
		cfg.IdleTimeout = DefaultIdleTimeout
	}
	if cfg.Clock == nil {
		cfg.Clock = engine.SystemClock()
	}
	built := &Node{cfg: cfg, zl: cfg.Log, stopped: make(chan struct{}), serveErr: make(chan error, 1), ln: cfg.Listener, previewLn: cfg.PreviewListener}
	n = built
	defer func() {
		// A step failed: undo what the earlier ones started, in reverse
		// (the return statement has already set n to nil).
		if err != nil {
			built.Kill()
			n = nil
		}
	}()
	zl := n.zl
	phase := func(name string, t0 time.Time) { n.Phases = append(n.Phases, Phase{name, time.Since(t0)}) }

	// 1. Data dir, secret, authenticator.
	t0 := time.Now()
	dataDir, err := filepath.Abs(cfg.DataDir)
	if err != nil {
		return nil, err
	}
	n.cfg.DataDir = dataDir
	// The HTTP port first: one that is taken or invalid is reported
	// before anything else starts (NATS, the log); it is served at step 10.
	if n.ln == nil {
		if n.ln, err = net.Listen("tcp", cfg.Listen); err != nil {
			return nil, fmt.Errorf("listen %s: %w", cfg.Listen, err)
		}
	}
	if err := PrepareDataDir(dataDir); err != nil {
		return nil, err
	}
	if n.dirLock, err = lockDataDir(dataDir); err != nil {
		return nil, err
	}
	secret, err := auth.LoadOrCreateSecret(filepath.Join(dataDir, "node.secret"))
	if err != nil {
		return nil, err
	}
	if n.EnvKey, err = loadEnvKey(dataDir); err != nil {
		return nil, err
	}
	if n.tenants, err = configTenants(cfg.Tenants, cfg.RootToken); err != nil {
		return nil, err
	}
	n.cfg.Tenants = nil
	if n.Auth, err = auth.New(cfg.RootToken, nil, secret); err != nil {
		return nil, err
	}
	defer startGC()()

	// 2. The log.
	if n.Log, err = eventlog.Open(filepath.Join(dataDir, "log"), eventlog.Options{NodeID: cfg.NodeID, Logger: zl, FS: cfg.LogFS}); err != nil {
		return nil, err
	}
	firstStart := n.Log.LastSeq() == 0
	phase("open", t0)

	// 3. Replication follows the log from here on.
	if r := cfg.Replication; r != nil {
		t0 = time.Now()
		if n.Repl, err = n.startReplication(*r); err != nil {
			return nil, err
		}
		phase("replication", t0)
	}

	// 4. The state: latest snapshot plus the tail, in the engine.
	t0 = time.Now()
	res, err := engine.Rebuild(n.Log, engine.RebuildOptions{TrustSnapshot: true, NoSnapshot: cfg.FullReplay})
	if err != nil {
		return nil, err
	}
	n.snapSeq, n.Replayed = res.SnapshotSeq, res.Events
	ev := zl.Info().Uint64("seq", res.Seq).Uint64("snapshot_seq", res.SnapshotSeq).Int("tail_events", res.Events).
		Dur("elapsed", res.Elapsed).Int("live_claims", res.State.LiveClaims())
	if res.SnapshotErr != nil {
		ev = ev.AnErr("snapshot_skipped", res.SnapshotErr)
	}
	ev.Msg("state rebuilt from the op log")
	var metrics *api.Metrics
	n.Engine = engine.New(n.Log, res.State, engine.Options{
		Log: zl, Clock: cfg.Clock, RefillDelay: cfg.RefillDelay,
		OnAppend: func(d time.Duration) { metrics.ObserveAppend(d) },
	})
	metrics = api.NewMetrics(n.Engine)
	n.Metrics = metrics
	bi := buildinfo.Read()
	metrics.BuildInfo(bi.Version, bi.Revision, bi.Go)
	if err := n.startEgress(metrics); err != nil {
		return nil, err
	}
	n.Auth.UseTenants(n.tenantByHash)
	phase("rebuild", t0)

	// 5. Identity, first-start pools, limits.
	t0 = time.Now()
	if err := n.configure(ctx, firstStart); err != nil {
		return nil, err
	}
	phase("configure", t0)

	// 6. The driver.
	t0 = time.Now()
	zl.Info().Str("hypervisor", hv.Name()).Msg("hypervisor selected")
	if n.Driver, err = n.openDriver(hv, layout.RootsIn(dataDir)); err != nil {
		return nil, err
	}
	// VMMs that die on their own from now on (adopted by the reconcile
	// below or launched later) are recorded and their policy applied.
	n.Driver.OnExit(n.vmExited)
	n.useTransport(hv.Name(), layout.RootsIn(dataDir))
	prep, err := n.Driver.Prepare(ctx)
	if err != nil {
		return nil, err
	}
	zl.Info().Str("copy_mode", prep.CopyMode.String()).Int("temp_dirs_swept", len(prep.Swept)).Msg("executors prepared")
	phase("prepare", t0)

	// 7. Reconcile before any executor runs.
	t0 = time.Now()
	if rd, ok := n.Driver.(reconcile.Driver); ok {
		if n.Reconciled, err = reconcile.Run(ctx, n.reconcileOptions(rd)); err != nil {
			return nil, err
		}
	} else {
		zl.Warn().Str("hypervisor", hv.Name()).Msg("this driver has no start-up reconcile; intents re-run and adopt their VMMs by pid file")
	}
	phase("reconcile", t0)

	// 8. API and executors; commits feed both from now on.
	t0 = time.Now()
	apiCfg := cfg.API
	if apiCfg.OwnerAddr == "" {
		apiCfg.OwnerAddr = cfg.OwnerAddr
	}
	if apiCfg.OwnerAddr == "" {
		apiCfg.OwnerAddr = n.listenAddr()
	}
	if apiCfg.Node == "" {
		apiCfg.Node = cfg.NodeID
	}
	if apiCfg.Hypervisor == "" {
		apiCfg.Hypervisor = hv.Name()
	}
	apiOpts := api.Options{Log: zl, Metrics: metrics, Redirector: cfg.Redirector, Now: cfg.Clock.Now, Stats: n.vmmStats, DataPlane: cfg.DataPlane,
		Egress: n.apiEgress(), Checkpoints: n.checkpointBlobs(hv.Name(), layout.RootsIn(dataDir))}
	if gd, ok := n.Driver.(executors.AgentDialer); ok && apiOpts.DataPlane.Dialer == nil {
		apiOpts.DataPlane.Dialer = gd
	}
	// The driver knows which templates and nets this node has: the API
	// refuses the rest before proposing anything.
	if ps, ok := n.Driver.(api.PoolSupport); ok {
		apiOpts.Pools = ps
	}
	// ... and what a VM of each size gets (QEMU halves it under TCG).
	if vs, ok := n.Driver.(api.VMSizer); ok {
		apiOpts.Sizes = vs
	}
	if n.previewLn == nil && cfg.PreviewListen != "" {
		if n.previewLn, err = net.Listen("tcp", cfg.PreviewListen); err != nil {
			return nil, fmt.Errorf("preview listener: %w", err)
		}
	}
	if n.previewLn != nil && apiOpts.DataPlane.Preview.Advertise == "" {
		apiOpts.DataPlane.Preview.Advertise = n.previewLn.Addr().String()
	}
	var apiEng api.Engine = n.Engine
	var apiLog api.Log = n.Log
	if n.Repl != nil {
		if apiOpts.Redirector == nil {
			apiOpts.Redirector = redirector{svc: n.Repl, self: cfg.NodeID}
		}
		apiOpts.Replication = func() any { return n.Repl.Status() }
		if cfg.Replication.Sync {
			apiEng, apiLog = n.syncAPI(cfg.Replication.syncTimeout())
		}
	}
	n.Server = api.New(apiCfg, apiEng, apiLog, n.Auth, apiOpts)
	n.Executors = scheduler.New(n.Driver, proposer{n.Engine}, scheduler.Options{Concurrency: cfg.Concurrency, Log: zl, Observer: metrics, Clock: cfg.Clock})
	var fleet *fleetTenants
	if n.Repl != nil {
		fleet = newFleetTenants(n, metrics)
	}
	lifecycle := &lifecycleLog{zl: zl, view: n.Engine.View, warm: map[fsm.PoolKey]bool{}}
	n.Engine.SetOnCommit(func(c engine.Commit) {
		n.Server.OnCommit(c.Events)
		metrics.OnCommit(c.Events)
		lifecycle.onCommit(c.Events)
		if fleet != nil {
			fleet.onCommit(c.Events)
		}
		if len(c.Intents) > 0 {
			n.Executors.Offer(c.Intents)
		}
	})

	// 9. Pending intents, then the loops.
	n.Executors.Offer(n.Engine.Intents())
	n.Engine.Start()

	// 10. Ready, then serve.
	n.Server.SetReady()
	streams, endStreams := context.WithCancel(context.Background())
	n.http = &http.Server{Handler: endStreamsOn(streams, n.Server), ReadHeaderTimeout: cfg.ReadHeaderTimeout, IdleTimeout: cfg.IdleTimeout}
	n.http.RegisterOnShutdown(endStreams)
	n.spawn(func() {
		err := n.http.Serve(n.ln)
		if err != nil && !errors.Is(err, http.ErrServerClosed) {
			zl.Error().Err(err).Msg("http server")
		}
		n.serveErr <- err
	})
	if n.previewLn != nil {
		n.previewHTTP = &http.Server{Handler: n.Server.PreviewHandler(), ReadHeaderTimeout: cfg.ReadHeaderTimeout, IdleTimeout: cfg.IdleTimeout}
		srv, ln := n.previewHTTP, n.previewLn
		n.spawn(func() {
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				zl.Error().Err(err).Msg("preview http server")
			}
		})
		zl.Info().Str("preview_listen", ln.Addr().String()).Msg("preview listener serving")
	}
	n.spawn(n.snapshotLoop)
	n.spawn(n.runMeter)
	if n.Repl != nil {
		n.spawn(func() { replicatedGauge(n.stopped, n.Repl, metrics) })
		n.spawn(func() { fleet.run(n.stopped) })
	}
	phase("serve", t0)
	zl.Info().Str("listen", n.ln.Addr().String()).Str("node", cfg.NodeID).Str("instance", n.Instance).Msg("sandboxd serving")
	return n, nil
}

// spawn is the one way the node starts a background goroutine, so Stop
// waits for every one of them.
func (n *Node) spawn(fn func()) {
	n.bg.Add(1)
	go func() {
		defer n.bg.Done()
		fn()
	}()
}

// startGC raises the GC target for start-up, unless GOGC already asks for
// more (or turns the collector off), and returns what restores it.
func startGC() (restore func()) {
	prev := debug.SetGCPercent(startGCPercent)
	if prev < 0 || prev > startGCPercent {
		debug.SetGCPercent(prev)
	}
	return func() { debug.SetGCPercent(prev) }
}

// listenAddr is the address served: the listener's, once bound, else the
// configured one.
func (n *Node) listenAddr() string {
	if n.ln != nil {
		return n.ln.Addr().String()
	}
	return n.cfg.Listen
}

// PreviewAddr is the preview listener's address ("" without one).
func (n *Node) PreviewAddr() string {
	if n.previewLn == nil {
		return ""
	}
	return n.previewLn.Addr().String()
}

// Addr is the address the node serves HTTP on.
func (n *Node) Addr() string { return n.ln.Addr().String() }

// URL is http://Addr.
func (n *Node) URL() string { return "http://" + n.Addr() }

// configure records the node identity on a first start, the config's pools
// on a first start, and the limits when they differ from the state's.
func (n *Node) configure(ctx context.Context, firstStart bool) error {
	cfg, zl := n.cfg, n.zl
	var node string
	n.Engine.View(func(st *fsm.State) { node, n.Instance = st.Node(), st.Instance() })
	if node == "" {
		n.Instance = cfg.Instance
		if n.Instance == "" {
			n.Instance = newInstanceID()
		}
		if _, err := n.Engine.Propose(ctx, fsm.ConfigureNode{Meta: n.Engine.Meta(), Node: cfg.NodeID, Instance: n.Instance}); err != nil {
			return fmt.Errorf("record node identity: %w", err)
		}
		zl.Info().Str("node", cfg.NodeID).Str("instance", n.Instance).Msg("new node: identity recorded in the log")
	}
	if err := n.applyEgressClasses(ctx); err != nil {
		return err
	}
	if firstStart && len(cfg.Pools) > 0 {
		if _, err := n.Engine.Propose(ctx, fsm.ConfigurePools{Meta: n.Engine.Meta(), Pools: cfg.Pools, Egress: cfg.Egress.PoolEgress}); err != nil {
			return fmt.Errorf("apply configured pools: %w", err)
		}
		zl.Info().Int("pools", len(cfg.Pools)).Msg("first start: pools from the config applied; PUT /v1/pools owns them from now on")
	} else if len(cfg.Pools) > 0 {
		zl.Info().Msg("pools come from the log (PUT /v1/pools); the config's pools apply only on a first start")
	}
	if err := n.applyTenants(ctx); err != nil {
		return err
	}
	if err := n.applyVolumes(ctx); err != nil {
		return err
	}
	if err := n.closeStaleRelays(ctx); err != nil {
		return err
	}
	return n.applyLimits(ctx)
}

// closeStaleRelays records closed every relay the log still holds open:
// relays run on this process's connections and none survives it, so after
// a crash the log is set straight before anything is served.
func (n *Node) closeStaleRelays(ctx context.Context) error {
	var open int
	n.Engine.View(func(st *fsm.State) { open = st.OpenRelays() })
	if open == 0 {
		return nil
	}
	if _, err := n.Engine.Propose(ctx, fsm.CloseAllRelays{Meta: n.Engine.Meta(), Reason: fsm.RelayClosedRestart}); err != nil {
		return fmt.Errorf("record stale relays closed: %w", err)
	}
	n.zl.Info().Int("relays", open).Msg("relays open when the last process ended recorded closed")
	return nil
}

// applyLimits records max_claims when it differs from the state's: the
// config owns limits. Tenant caps are the tenant table's, so caps a log
// recorded in its limits before tenants were state are cleared.
func (n *Node) applyLimits(ctx context.Context) error {
	var cur fsm.Limits
	n.Engine.View(func(st *fsm.State) { cur = st.Limits() })
	if cur.MaxClaims == n.cfg.MaxClaims && len(cur.TenantCaps) == 0 {
		return nil
	}
	if _, err := n.Engine.Propose(ctx, fsm.ConfigureLimits{Meta: n.Engine.Meta(), MaxClaims: n.cfg.MaxClaims}); err != nil {
		return fmt.Errorf("apply limits: %w", err)
	}
	return nil
}

func (n *Node) reconcileOptions(rd reconcile.Driver) reconcile.Options {
	return reconcile.Options{
		Driver: rd, Propose: proposer{n.Engine}, View: n.Engine.View, Meta: n.Engine.Meta,
		Policy: n.cfg.RestartPolicy, Concurrency: n.cfg.ReconcileConcurrency, Log: n.zl,
	}
}

// vmExited records a VM whose VMM died while the node runs.
func (n *Node) vmExited(vm, detail string) {
	rd, ok := n.Driver.(reconcile.Driver)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := reconcile.ReportExit(ctx, n.reconcileOptions(rd), vm, detail); err != nil && !errors.Is(err, engine.ErrStopped) {
		n.zl.Error().Err(err).Str("vm", vm).Msg("could not record a VM whose VMM exited")
	}
}

// snapshotLoop saves a state snapshot once SnapshotEvery events were
// applied since the last one, so a restart replays a bounded tail.
func (n *Node) snapshotLoop() {
	t := time.NewTicker(n.cfg.SnapshotCheck)
	defer t.Stop()
	for {
		select {
		case <-n.stopped:
			return
		case <-t.C:
		}
		var applied uint64
		n.Engine.View(func(st *fsm.State) { applied = st.Applied() })
		n.mu.Lock()
		due := applied >= n.snapSeq+n.cfg.SnapshotEvery
		n.mu.Unlock()
		if due {
			n.snapshot()
		}
	}
}

// snapshot saves the engine's state. The snapshot is written after the
// events it covers (Pebble's WAL is a prefix), so it never claims more than
// the log holds.
func (n *Node) snapshot() {
	seq, data := n.Engine.Snapshot()
	n.mu.Lock()
	defer n.mu.Unlock()
	if seq <= n.snapSeq {
		return
	}
	start := time.Now()
	if err := n.Log.SaveSnapshot(seq, data); err != nil {
		n.zl.Error().Err(err).Uint64("seq", seq).Msg("state snapshot failed")
		return
	}
	n.snapSeq = seq
	n.zl.Info().Uint64("seq", seq).Int("bytes", len(data)).Dur("elapsed", time.Since(start)).Msg("state snapshot saved")
}

// Stop's bounds, one per step: the relays' ends recorded (a few seconds,
// plus a sync-mode proposal), the HTTP requests in flight answered (their
// waits end at once), the executors' running calls finished (VM
// operations, the longest).
const (
	stopRelaysWait    = 10 * time.Second
	stopHTTPWait      = 10 * time.Second
	stopExecutorsWait = 10 * time.Second
)

// stopWithdrawWait bounds the withdrawal of the node's address (one KV
// delete; NATS unreachable: the address lapses after the TTL instead).
const stopWithdrawWait = 2 * time.Second

// Stop is SIGTERM: withdraw from the cluster directory, end the relays, stop serving, stop the executors (VMs
// keep running), close the egress proxy's doors, record the egress usage,
// stop the engine, snapshot, flush replication, close everything. It is
// idempotent; the error is the engine's failure, if it failed.
func (n *Node) Stop() error {
	var err error
	n.stopOnce.Do(func() {
		close(n.stopped)
		// Each step has its own bound: one that runs long must not leave
		// the next (the executors' recipes) an expired context.
		step := func(bound time.Duration, fn func(ctx context.Context)) {
			ctx, cancel := context.WithTimeout(context.Background(), bound)
			defer cancel()
			fn(ctx)
		}
		if n.Repl != nil {
			// Out of every node's directory before this one stops
			// serving: no redirect names a stopping node.
			step(stopWithdrawWait, func(ctx context.Context) {
				if e := n.Repl.Withdraw(ctx); e != nil {
					n.zl.Warn().Err(e).Msg("could not withdraw this node's address; the other nodes drop it when its heartbeat lapses")
				}
			})
		}
		if n.Server != nil {
			// The requests waiting on an outcome (a hibernate, a claim's
			// VM, a drain) answer 503 now instead of holding Shutdown.
			n.Server.BeginShutdown()
			// Relays run on hijacked connections, which Shutdown leaves
			// alone, and a buffered exec would hold Shutdown up: end them
			// first (new ones are refused) and record them closed while the
			// engine runs.
			step(stopRelaysWait, n.Server.CloseRelays)
		}
		if n.http != nil {
			step(stopHTTPWait, func(ctx context.Context) { _ = n.http.Shutdown(ctx) })
		}
		if n.previewHTTP != nil {
			step(stopHTTPWait, func(ctx context.Context) { _ = n.previewHTTP.Shutdown(ctx) })
		}
		if n.Executors != nil {
			step(stopExecutorsWait, func(ctx context.Context) {
				if e := n.Executors.Shutdown(ctx); e != nil {
					n.zl.Warn().Err(e).Msg("executors did not stop in time; their intents re-run on the next start")
				}
			})
		}
		if n.Proxy != nil {
			// The doors close before the meter's last flush, so the bytes
			// in flight are in it; the VMs' accounting stays open (they
			// keep running, and the next process's doors go on counting).
			n.Proxy.Close()
		}
		if n.Engine != nil {
			n.flushMeter()
			n.Engine.Shutdown()
			if e := n.Engine.Err(); e != nil && !errors.Is(e, engine.ErrStopped) {
				err = e
			} else {
				n.snapshot()
			}
		}
		n.bg.Wait()
		if n.Repl != nil {
			n.flushReplication()
		}
		n.closeAll()
		n.zl.Info().Msg("sandboxd stopped; the VMs it ran, if any, keep running (the next start adopts them)")
	})
	return err
}

// Kill stops the node as a crash would leave its data dir: no snapshot, no
// replication flush, VMs left running. In-flight requests and operations
// are cut off; their effects are what the log holds. For tests and
// benchmarks of the restart path; Stop is the clean way.
func (n *Node) Kill() {
	n.stopOnce.Do(func() {
		close(n.stopped)
		if n.http != nil {
			_ = n.http.Close()
		}
		if n.previewHTTP != nil {
			_ = n.previewHTTP.Close()
		}
		if n.Server != nil {
			n.Server.AbortRelays() // a crash takes its connections along
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if n.Executors != nil {
			_ = n.Executors.Shutdown(ctx)
		}
		if n.Engine != nil {
			n.Engine.Shutdown()
		}
		n.bg.Wait()
		n.closeAll()
	})
}

// closeAll closes what Start opened, in reverse: the driver (its watchers),
// replication (it reads the log), the log.
func (n *Node) closeAll() {
	if n.Driver != nil {
		n.Driver.Close()
	}
	if n.Proxy != nil {
		// The doors go with the process; the taps' locks stay in the kernel.
		// Stop closed them already, before the meter's last flush (Close
		// is idempotent); this serves Kill and a failed Start.
		n.Proxy.Close()
	}
	if n.Repl != nil {
		if err := n.Repl.Close(); err != nil {
			n.zl.Warn().Err(err).Msg("replication stopped with errors")
		}
	}
	if n.Log != nil {
		_ = n.Log.Close()
	}
	if n.http == nil && n.ln != nil {
		// A listener never served (a failed Start) is still ours to close.
		_ = n.ln.Close()
	}
	if n.dirLock != nil {
		_ = n.dirLock.Close()
	}
	if n.previewHTTP == nil && n.previewLn != nil {
		_ = n.previewLn.Close()
	}
}

// streamsPath is the API's one route whose answers never end by themselves
// (Server-Sent Events, both views).
const streamsPath = "/v1/events"

// endStreamsOn ends the event streams h serves once stop is done. Without
// it http.Server.Shutdown waits its whole timeout for them on every SIGTERM
// while a client follows the log; their clients resume by cursor. Other
// requests are left to finish.
func endStreamsOn(stop context.Context, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == streamsPath {
			ctx, cancel := context.WithCancel(r.Context())
			defer cancel()
			defer context.AfterFunc(stop, cancel)()
			r = r.WithContext(ctx)
		}
		h.ServeHTTP(w, r)
	})
}
