// Package apitest runs a real sandboxd API node in-process for tests and
// benchmarks: a real api.Server over a real engine and a real Pebble op log
// on disk, served by a real net/http server on loopback, with a real
// executors.Pool whose driver is an IN-PROCESS HYPERVISOR FAKE (FakeDriver):
// it answers every intent at once without starting any VMM, so pools fill
// and claims are served without chsim or Cloud Hypervisor.
//
// Everything but the hypervisor is the production path: claims are decided
// by the fsm, made durable by the eventlog (fsync included) and answered by
// the api handlers; executor results travel through the pool's Propose path
// with Meta.Cause = the intent's op id, as with a real driver. Figures taken
// with this package must say that the hypervisor was faked.
package apitest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/sbxlog/sbxlog/eventlog"
	"github.com/sbxlog/sbxlog/executors"
	"github.com/sbxlog/sbxlog/fsm"
	"github.com/sbxlog/sbxlog/fsm/engine"
	"github.com/sbxlog/sbxlog/projections/api"
	"github.com/sbxlog/sbxlog/projections/auth"
)

// FakeDriver is the in-process hypervisor fake: every intent succeeds at
// once, unless FailClones is set. It keeps per-kind call counts so tests can
// check what ran.
type FakeDriver struct {
	goldens, clones, hibernates, wakes, destroys atomic.Int64
	// FailClones makes every clone fail for good (an unrecoverable error).
	FailClones atomic.Bool
}

var _ executors.Driver = (*FakeDriver)(nil)

// BuildGolden implements executors.Driver: the golden "exists" at once.
func (f *FakeDriver) BuildGolden(_ context.Context, in fsm.BuildGolden) (executors.Result, error) {
	f.goldens.Add(1)
	return executors.Result{SnapshotDir: "golden/" + in.OpID.String()}, nil
}

// Clone implements executors.Driver: the VM is "running" at once.
func (f *FakeDriver) Clone(context.Context, fsm.CloneVM) (executors.Result, error) {
	f.clones.Add(1)
	if f.FailClones.Load() {
		return executors.Result{}, executors.Unrecoverablef("apitest: clone failed as asked")
	}
	return executors.Result{}, nil
}

// Hibernate implements executors.Driver.
func (f *FakeDriver) Hibernate(_ context.Context, in fsm.HibernateVM) (executors.Result, error) {
	f.hibernates.Add(1)
	return executors.Result{SnapshotDir: "hibernate/" + in.VM}, nil
}

// Wake implements executors.Driver.
func (f *FakeDriver) Wake(context.Context, fsm.WakeVM) (executors.Result, error) {
	f.wakes.Add(1)
	return executors.Result{}, nil
}

// Destroy implements executors.Driver.
func (f *FakeDriver) Destroy(context.Context, fsm.DestroyVM) (executors.Result, error) {
	f.destroys.Add(1)
	return executors.Result{}, nil
}

// Calls returns how many calls of each kind the fake answered.
func (f *FakeDriver) Calls() map[executors.Kind]int64 {
	return map[executors.Kind]int64{
		executors.KindGolden: f.goldens.Load(), executors.KindClone: f.clones.Load(),
		executors.KindHibernate: f.hibernates.Load(), executors.KindWake: f.wakes.Load(),
		executors.KindDestroy: f.destroys.Load(),
	}
}

// Options configure a Node. Dir is required.
type Options struct {
	// Dir is the node's data directory (the op log goes in Dir/log); it
	// should be on a real disk when latencies matter.
	Dir string
	// NodeID defaults to "n1".
	NodeID string
	// RootToken is the root token ("" disables root).
	RootToken string
	Tenants   []auth.TenantConfig
	// Pools are configured before the node serves.
	Pools []fsm.PoolSpec
	// MaxClaims is the node's max_claims (0 = unlimited).
	MaxClaims int
	// Concurrency bounds the executor pool (default 64: the fake is instant).
	Concurrency int
	// Config is passed to api.New; OwnerAddr defaults to the listen address.
	Config api.Config
	// Redirector is passed to the server (the cluster view in sandboxd).
	Redirector api.Redirector
	// RefillDelay is passed to the engine (0: its default).
	RefillDelay time.Duration
	// Metrics enables /metrics.
	Metrics bool
	// NoExecutors leaves intents unanswered (no executor pool): pools never
	// fill and clone-tier claims wait. For handler tests that must not pay
	// for the executors' background work.
	NoExecutors bool
	Log         zerolog.Logger
}

// Node is a running in-process node. Close it when done.
type Node struct {
	Log    *eventlog.Log
	Engine *engine.Engine
	Server *api.Server
	Pool   *executors.Pool
	Driver *FakeDriver
	Auth   *auth.Authenticator
	// URL is the loopback base URL, e.g. http://127.0.0.1:40123.
	URL string

	http *http.Server
	done chan error
}

// proposer adapts the engine to executors.Proposer, as sandboxd does.
type proposer struct{ eng *engine.Engine }

func (p proposer) Propose(ctx context.Context, cmd fsm.Command) error {
	_, err := p.eng.Propose(ctx, cmd)
	return err
}

// Start brings a node up in sandboxd's order (log, state, identity, pools,
// API and executors wired to commits, pending intents, loops, ready) and
// serves HTTP on a fresh loopback port.
func Start(opts Options) (n *Node, err error) {
	if opts.Dir == "" {
		return nil, errors.New("apitest: Options.Dir is required")
	}
	if opts.NodeID == "" {
		opts.NodeID = "n1"
	}
	if opts.Concurrency <= 0 {
		opts.Concurrency = 64
	}
	n = &Node{Driver: &FakeDriver{}, done: make(chan error, 1)}
	defer func() {
		if err != nil {
			n.Close()
			n = nil
		}
	}()
	secret, err := auth.LoadOrCreateSecret(filepath.Join(opts.Dir, "node.secret"))
	if err != nil {
		return n, err
	}
	if n.Auth, err = auth.New(opts.RootToken, opts.Tenants, secret); err != nil {
		return n, err
	}
	if n.Log, err = eventlog.Open(filepath.Join(opts.Dir, "log"), eventlog.Options{NodeID: opts.NodeID, Logger: opts.Log}); err != nil {
		return n, err
	}
	res, err := engine.Rebuild(n.Log, engine.RebuildOptions{})
	if err != nil {
		return n, err
	}
	var metrics *api.Metrics
	n.Engine = engine.New(n.Log, res.State, engine.Options{Log: opts.Log, RefillDelay: opts.RefillDelay, OnAppend: func(d time.Duration) { metrics.ObserveAppend(d) }})
	if opts.Metrics {
		metrics = api.NewMetrics(n.Engine)
	}
	ctx := context.Background()
	var node string
	n.Engine.View(func(st *fsm.State) { node = st.Node() })
	if node == "" {
		if _, err := n.Engine.Propose(ctx, fsm.ConfigureNode{Meta: n.Engine.Meta(), Node: opts.NodeID, Instance: "i-apitest"}); err != nil {
			return n, fmt.Errorf("apitest: configure node: %w", err)
		}
	}
	caps := map[string]int{}
	for _, t := range opts.Tenants {
		if t.MaxClaims > 0 {
			caps[t.Name] = t.MaxClaims
		}
	}
	if _, err := n.Engine.Propose(ctx, fsm.ConfigureLimits{Meta: n.Engine.Meta(), MaxClaims: opts.MaxClaims, TenantCaps: caps}); err != nil {
		return n, fmt.Errorf("apitest: configure limits: %w", err)
	}
	if len(opts.Pools) > 0 {
		if _, err := n.Engine.Propose(ctx, fsm.ConfigurePools{Meta: n.Engine.Meta(), Pools: opts.Pools}); err != nil {
			return n, fmt.Errorf("apitest: configure pools: %w", err)
		}
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return n, err
	}
	n.URL = "http://" + ln.Addr().String()
	cfg := opts.Config
	if cfg.OwnerAddr == "" {
		cfg.OwnerAddr = ln.Addr().String()
	}
	if cfg.Node == "" {
		cfg.Node = opts.NodeID
	}
	if cfg.Hypervisor == "" {
		cfg.Hypervisor = "in-process-fake"
	}
	n.Server = api.New(cfg, n.Engine, n.Log, n.Auth, api.Options{Log: opts.Log, Metrics: metrics, Redirector: opts.Redirector})
	if !opts.NoExecutors {
		n.Pool = executors.NewPool(n.Driver, proposer{n.Engine}, executors.PoolOptions{Concurrency: opts.Concurrency, Log: opts.Log, Observer: metrics})
	}
	n.Engine.SetOnCommit(func(c engine.Commit) {
		n.Server.OnCommit(c.Events)
		if n.Pool != nil && len(c.Intents) > 0 {
			n.Pool.Offer(c.Intents)
		}
	})
	if n.Pool != nil {
		n.Pool.Offer(n.Engine.Intents())
	}
	n.Engine.Start()
	n.Server.SetReady()
	n.http = &http.Server{Handler: n.Server, ReadHeaderTimeout: 10 * time.Second}
	go func() { n.done <- n.http.Serve(ln) }()
	return n, nil
}

// Close stops serving, the executors, the engine and the log, in
// sandboxd's order. It is safe on a partly started node.
func (n *Node) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var errs []error
	if n.http != nil {
		n.http.Close() // streams (SSE) would hold Shutdown for their lifetime
		if err := <-n.done; err != nil && !errors.Is(err, http.ErrServerClosed) {
			errs = append(errs, err)
		}
	}
	if n.Pool != nil {
		errs = append(errs, n.Pool.Shutdown(ctx))
	}
	if n.Engine != nil {
		n.Engine.Shutdown()
	}
	if n.Log != nil {
		errs = append(errs, n.Log.Close())
	}
	return errors.Join(errs...)
}

// WaitWarm waits until pool key has at least want warm VMs, polling the
// state (the fake answers at once, so this is bounded by the log's fsyncs).
func (n *Node) WaitWarm(ctx context.Context, key fsm.PoolKey, want int) error {
	for {
		warm := 0
		n.Engine.View(func(st *fsm.State) {
			if p, ok := st.Pool(key); ok {
				warm = len(p.WarmVMs())
			}
		})
		if warm >= want {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("apitest: pool %s has %d warm VMs, want %d: %w", key, warm, want, ctx.Err())
		case <-time.After(time.Millisecond):
		}
	}
}

// Settle waits until the node has nothing left to do: no intent pending, no
// pool short of its warm target, and everything applied also durable (the
// state runs ahead of the log by the fsync in flight). Needs the executors.
func (n *Node) Settle(ctx context.Context) error {
	for {
		var busy bool
		var applied uint64
		n.Engine.View(func(st *fsm.State) {
			busy = len(fsm.Intents(st)) > 0 || len(fsm.RefillsNeeded(st)) > 0
			applied = st.Applied()
		})
		if !busy && n.Log.LastSeq() >= applied {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("apitest: node did not settle: %w", ctx.Err())
		case <-time.After(time.Millisecond):
		}
	}
}

// LiveClaims returns the number of live claims in the state.
func (n *Node) LiveClaims() int {
	var live int
	n.Engine.View(func(st *fsm.State) { live = st.LiveClaims() })
	return live
}

// Do sends one request to the node; token "" sends no Authorization header.
func (n *Node) Do(ctx context.Context, method, path, token string, body []byte) (status int, resp []byte, err error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, n.URL+path, rd)
	if err != nil {
		return 0, nil, err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	r, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer r.Body.Close()
	resp, err = io.ReadAll(r.Body)
	return r.StatusCode, resp, err
}
