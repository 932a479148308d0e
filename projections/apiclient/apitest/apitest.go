// Package apitest runs an in-process sandboxd for tests of API clients: the
// real op log (Pebble in a temp dir), engine, executor pool and api.Server
// behind an httptest server, with an in-memory hypervisor fake (Driver) in
// place of Cloud Hypervisor. Everything but the VMs is the production code
// path; the end-to-end test in e2e/ covers the real daemon with chsim.
package apitest

import (
	"context"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/sbxlog/sbxlog/engine"
	"github.com/sbxlog/sbxlog/eventlog"
	"github.com/sbxlog/sbxlog/executors"
	"github.com/sbxlog/sbxlog/fsm"
	"github.com/sbxlog/sbxlog/projections/api"
	"github.com/sbxlog/sbxlog/projections/auth"
)

// Driver is an instant hypervisor fake: every operation succeeds at once
// unless Hook says otherwise.
type Driver struct {
	// Hook, if set, runs before each operation; a non-nil error fails it
	// (wrap with executors.Unrecoverablef to stop retries). It may block
	// to hold an operation (honour ctx).
	Hook func(ctx context.Context, in fsm.Intent) error

	mu    sync.Mutex
	calls map[executors.Kind]int
}

var _ executors.Driver = (*Driver)(nil)

func (d *Driver) run(ctx context.Context, in fsm.Intent, snap string) (executors.Result, error) {
	d.mu.Lock()
	if d.calls == nil {
		d.calls = map[executors.Kind]int{}
	}
	d.calls[executors.KindOf(in)]++
	d.mu.Unlock()
	if d.Hook != nil {
		if err := d.Hook(ctx, in); err != nil {
			return executors.Result{}, err
		}
	}
	return executors.Result{SnapshotDir: snap}, nil
}

// Calls returns how many operations of kind ran (including failed ones).
func (d *Driver) Calls(kind executors.Kind) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.calls[kind]
}

// BuildGolden implements executors.Driver.
func (d *Driver) BuildGolden(ctx context.Context, in fsm.BuildGolden) (executors.Result, error) {
	return d.run(ctx, in, "golden/"+in.Key.Template+"-"+in.OpID.String())
}

// Clone implements executors.Driver.
func (d *Driver) Clone(ctx context.Context, in fsm.CloneVM) (executors.Result, error) {
	return d.run(ctx, in, "")
}

// Hibernate implements executors.Driver.
func (d *Driver) Hibernate(ctx context.Context, in fsm.HibernateVM) (executors.Result, error) {
	return d.run(ctx, in, "hibernate/"+in.VM)
}

// Wake implements executors.Driver.
func (d *Driver) Wake(ctx context.Context, in fsm.WakeVM) (executors.Result, error) {
	return d.run(ctx, in, "")
}

// Destroy implements executors.Driver.
func (d *Driver) Destroy(ctx context.Context, in fsm.DestroyVM) (executors.Result, error) {
	return d.run(ctx, in, "")
}

// Options configure a Node.
type Options struct {
	// RootToken is the root token (default "root-token").
	RootToken string
	// Tenants maps tenant names to their tokens.
	Tenants map[string]string
	// Pools are configured before the node serves (none by default).
	Pools []fsm.PoolSpec
	// Driver is the hypervisor fake (default an instant one).
	Driver *Driver
	// Heartbeat is the SSE heartbeat (default the server's 15 s).
	Heartbeat time.Duration
}

// Node is a running in-process sandboxd.
type Node struct {
	// URL is the base URL ("http://127.0.0.1:port").
	URL string
	// Root is the root token; Tenants maps tenant names to tokens.
	Root    string
	Tenants map[string]string

	Server *api.Server
	Engine *engine.Engine
	Log    *eventlog.Log
	Driver *Driver
	HTTP   *httptest.Server
}

// Start runs a node until the test ends.
func Start(t testing.TB, o Options) *Node {
	t.Helper()
	if o.RootToken == "" {
		o.RootToken = "root-token"
	}
	if o.Driver == nil {
		o.Driver = &Driver{}
	}
	var tenants []auth.TenantConfig
	for name, tok := range o.Tenants {
		tenants = append(tenants, auth.TenantConfig{Name: name, TokenSHA256: auth.HashToken(tok)})
	}
	authn, err := auth.New(o.RootToken, tenants, []byte("apitest-node-secret-0123456789"))
	if err != nil {
		t.Fatalf("apitest: auth: %v", err)
	}
	const node = "apitest"
	lg, err := eventlog.Open(t.TempDir(), eventlog.Options{NodeID: node, Logger: zerolog.Nop()})
	if err != nil {
		t.Fatalf("apitest: open log: %v", err)
	}
	eng := engine.New(lg, fsm.New(), engine.Options{Log: zerolog.Nop(), TickEvery: 100 * time.Millisecond})
	n := &Node{Root: o.RootToken, Tenants: o.Tenants, Engine: eng, Log: lg, Driver: o.Driver}
	ctx := context.Background()
	if _, err := eng.Propose(ctx, fsm.ConfigureNode{Meta: eng.Meta(), Node: node, Instance: "i-apitest"}); err != nil {
		t.Fatalf("apitest: configure node: %v", err)
	}
	if len(o.Pools) > 0 {
		if _, err := eng.Propose(ctx, fsm.ConfigurePools{Meta: eng.Meta(), Pools: o.Pools}); err != nil {
			t.Fatalf("apitest: configure pools: %v", err)
		}
	}
	n.HTTP = httptest.NewUnstartedServer(nil)
	n.URL = "http://" + n.HTTP.Listener.Addr().String()
	metrics := api.NewMetrics(eng)
	n.Server = api.New(api.Config{OwnerAddr: n.HTTP.Listener.Addr().String(), Node: node, Hypervisor: "apitest", Heartbeat: o.Heartbeat},
		eng, lg, authn, api.Options{Log: zerolog.Nop(), Metrics: metrics})
	pool := executors.NewPool(o.Driver, proposer{eng}, executors.PoolOptions{Concurrency: 4, Log: zerolog.Nop(), Observer: metrics})
	eng.SetOnCommit(func(c engine.Commit) {
		n.Server.OnCommit(c.Events)
		if len(c.Intents) > 0 {
			pool.Offer(c.Intents)
		}
	})
	pool.Offer(eng.Intents())
	eng.Start()
	n.Server.SetReady()
	n.HTTP.Config.Handler = n.Server
	n.HTTP.Start()
	t.Cleanup(func() {
		// Open event streams keep their handlers running: cut them first,
		// or Close waits for them.
		n.HTTP.CloseClientConnections()
		n.HTTP.Close()
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = pool.Shutdown(sctx)
		eng.Shutdown()
		_ = lg.Close()
	})
	return n
}

type proposer struct{ eng *engine.Engine }

func (p proposer) Propose(ctx context.Context, cmd fsm.Command) error {
	_, err := p.eng.Propose(ctx, cmd)
	return err
}

// Pool returns the state's info about one pool.
func (n *Node) Pool(key fsm.PoolKey) (fsm.PoolInfo, bool) {
	var out fsm.PoolInfo
	var ok bool
	n.Engine.View(func(st *fsm.State) {
		for _, p := range st.Info().Pools {
			if p.Key == key {
				out, ok = p, true
			}
		}
	})
	return out, ok
}

// WaitFilled waits until the pool has its warm target ready and nothing in
// flight (its golden built).
func (n *Node) WaitFilled(t testing.TB, key fsm.PoolKey) {
	t.Helper()
	n.WaitFor(t, 10*time.Second, "pool "+key.String()+" filled", func(st *fsm.State) bool {
		for _, p := range st.Info().Pools {
			if p.Key == key {
				return p.Golden == fsm.GoldenReady && p.Warm == p.Target && p.Refilling == 0
			}
		}
		return false
	})
}

// WaitFor polls cond on the state until it holds or d passes.
func (n *Node) WaitFor(t testing.TB, d time.Duration, what string, cond func(st *fsm.State) bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		var ok bool
		n.Engine.View(func(st *fsm.State) { ok = cond(st) })
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("apitest: timed out after %v waiting for %s", d, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
