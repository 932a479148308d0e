// Package nodetest runs a real sandboxd node in-process for tests and
// benchmarks, started by the one composition root (node.Start) exactly as
// sandboxd starts: a real Pebble op log on disk, the state rebuilt from it,
// the engine, the start-up reconcile, the API served by a real net/http
// server on loopback, the executors. Only the hypervisor is replaced, by an
// IN-PROCESS HYPERVISOR FAKE (FakeDriver): it answers every intent at once
// without starting any VMM (and, for the reconcile, finds every VM alive),
// so pools fill and claims are served without chsim or Cloud Hypervisor.
// Its guests are in-process too: DialAgent hands the data plane one end of
// a unix socketpair and an Agent serves the other: by default a SIMULATED
// GUEST AGENT speaking the silkd protocol over package silkagent's
// simulated guest (an in-memory file tree, a few simulated commands and an
// echo port), running nothing on the host (SetAgent picks another, e.g.
// EchoAgent for raw byte relays).
//
// Claims are decided by the fsm, made durable by the eventlog (fsync
// included) and answered by the api handlers; executor results travel
// through the executors' Propose path with Meta.Cause = the intent's op id,
// as with a real driver. Figures taken with this package must say that the
// hypervisor was faked.
package nodetest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"slices"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/sbxlog/sbxlog/cmd/sandboxd/node"
	"github.com/sbxlog/sbxlog/eventlog/event"
	"github.com/sbxlog/sbxlog/executors"
	"github.com/sbxlog/sbxlog/executors/layout"
	"github.com/sbxlog/sbxlog/executors/procstat"
	"github.com/sbxlog/sbxlog/executors/reconcile"
	"github.com/sbxlog/sbxlog/executors/transport"
	"github.com/sbxlog/sbxlog/fsm"
	"github.com/sbxlog/sbxlog/projections/api"
	"github.com/sbxlog/sbxlog/projections/auth"
)

// FakeHypervisor is the fake's name in /v1/info and the log.
const FakeHypervisor = "in-process-fake"

// FakeDriver is the in-process hypervisor fake: every intent succeeds at
// once, unless a Fail* switch is set, the template is not one SetTemplates
// named, SetDelay slows hibernates or wakes down (or it holds intents,
// Options.NoExecutors).
// It keeps per-kind call counts so tests can check what ran. It is its own
// node.Hypervisor, and a reconcile.Driver that finds every VM alive and no
// run dir.
type FakeDriver struct {
	goldens, clones, hibernates, wakes, destroys atomic.Int64
	checkpoints, ckRemovals                      atomic.Int64
	// FailCheckpoints makes every capture fail for good, the VM still
	// running.
	FailCheckpoints    atomic.Bool
	promotes, collects atomic.Int64
	// FailPromotes makes every promote fail for good, the VM as it was.
	FailPromotes       atomic.Bool
	attaches, detaches atomic.Int64
	// FailAttaches makes every volume attach fail for good.
	FailAttaches         atomic.Bool
	archives, unarchives atomic.Int64 // archive.go
	// FailClones makes every clone fail for good (an unrecoverable error).
	FailClones atomic.Bool
	// FailHibernates and FailWakes make every hibernate and wake fail for
	// good, the VM still running or the snapshot intact (an unrecoverable
	// error that is not Lost).
	FailHibernates, FailWakes atomic.Bool
	// hibernateDelay and wakeDelay (nanoseconds): see SetDelay.
	hibernateDelay, wakeDelay atomic.Int64
	hold                      atomic.Bool
	instance                  string
	// templates, when set (SetTemplates), are the only templates the fake
	// has; nil: every template exists.
	templates atomic.Pointer[map[string]bool]
	// NoBridge makes egress pools unsupported (CheckPool), as on a node
	// with no bridge.
	NoBridge atomic.Bool

	guests // the guest agents, for the data plane (guest.go)

	// Checkpoint imports are real (the node configures them): a fake's
	// checkpoints have no files, so its peers' blob routes answer 404.
	transport.Receiver
}

// SetTemplates makes names the only templates the fake has: a golden build
// or a cold boot of any other fails for good, as with a hypervisor whose
// templates directory lacks it. Without a call every template exists.
func (f *FakeDriver) SetTemplates(names ...string) {
	m := make(map[string]bool, len(names))
	for _, n := range names {
		m[n] = true
	}
	f.templates.Store(&m)
}

// missing reports whether the fake lacks template name.
func (f *FakeDriver) missing(name string) bool {
	m := f.templates.Load()
	return m != nil && !(*m)[name]
}

// CheckPool implements api.PoolSupport as a real driver does: a template
// SetTemplates left out is unknown, an egress net needs a bridge
// (NoBridge).
func (f *FakeDriver) CheckPool(k fsm.PoolKey, _ bool) error {
	if k.Net == "egress" && f.NoBridge.Load() {
		return executors.NetUnsupported("net egress needs a bridge (nodetest: NoBridge)")
	}
	if f.missing(k.Template) {
		return executors.UnknownTemplate(k.Template)
	}
	return nil
}

// Templates implements api.PoolSupport: the names SetTemplates gave,
// sorted (none before SetTemplates, when every template is taken).
func (f *FakeDriver) Templates() []string {
	m := f.templates.Load()
	if m == nil {
		return nil
	}
	return slices.Sorted(maps.Keys(*m))
}

var _ api.PoolSupport = (*FakeDriver)(nil)

// ErrFakeFailure is the error of a call the fake was told to fail
// (FailHibernates, FailWakes, FailCheckpoints, FailPromotes, FailAttaches).
const ErrFakeFailure = "nodetest: failed as asked"

// SetDelay makes every later hibernate (kind fsm.KindHibernate) or wake
// (fsm.KindWake) take d before it answers, so a test can act while one is
// in flight; 0 answers at once again.
func (f *FakeDriver) SetDelay(kind fsm.IntentKind, d time.Duration) {
	switch kind {
	case fsm.KindHibernate:
		f.hibernateDelay.Store(int64(d))
	case fsm.KindWake:
		f.wakeDelay.Store(int64(d))
	default:
		panic("nodetest: SetDelay takes hibernate or wake, not " + string(kind))
	}
}

// delay waits d nanoseconds, or until ctx ends.
func delay(ctx context.Context, d int64) error {
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(time.Duration(d))
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

var (
	_ executors.AgentDialer = (*FakeDriver)(nil)
	_ node.Driver           = (*FakeDriver)(nil)
	_ node.Hypervisor       = (*FakeDriver)(nil)
	_ reconcile.Driver      = (*FakeDriver)(nil)
)

var _ executors.Checkpointer = (*FakeDriver)(nil)

// Name implements node.Hypervisor.
func (f *FakeDriver) Name() string { return FakeHypervisor }

// Open implements node.Hypervisor: the fake is its own driver.
func (f *FakeDriver) Open(_ layout.Roots, instance string) (node.Driver, error) {
	f.instance = instance
	return f, nil
}

// Prepare implements node.Driver: there is nothing on disk to prepare.
func (f *FakeDriver) Prepare(context.Context) (node.Prepared, error) { return node.Prepared{}, nil }

// OnExit implements node.Driver: fake VMs never exit.
func (f *FakeDriver) OnExit(func(vm, detail string)) {}

// Close implements node.Driver: the guest agents' connections end.
func (f *FakeDriver) Close() { f.closeGuests() }

// VMMUsage implements node.Driver: a fake VM has no VMM process, so it
// reports the usage of the process the fake runs in (the test binary), a
// real reading of /proc without one.
func (f *FakeDriver) VMMUsage(context.Context, string, string) (procstat.Usage, error) {
	return procstat.Read(os.Getpid())
}

// Instance, VMMBinary, InstanceRoot, RunDirs, GoldenRunDir, AdoptVM and
// RemoveRunDir implement reconcile.Driver: every VM the state says runs is
// alive, and there are no run dirs.
func (f *FakeDriver) Instance() string                           { return f.instance }
func (f *FakeDriver) VMMBinary() string                          { return "/nonexistent/fake-vmm" }
func (f *FakeDriver) InstanceRoot() string                       { return "/nonexistent/run/" + f.instance }
func (f *FakeDriver) RunDirs() ([]string, error)                 { return nil, nil }
func (f *FakeDriver) GoldenRunDir(op event.OpID) string          { return "golden-" + op.String() }
func (f *FakeDriver) RemoveRunDir(context.Context, string) error { return nil }
func (f *FakeDriver) AdoptVM(context.Context, string, string) (reconcile.Liveness, error) {
	return reconcile.Liveness{Alive: true}, nil
}

// held makes a call wait until the node stops when the fake holds intents.
func (f *FakeDriver) held(ctx context.Context) error {
	if !f.hold.Load() {
		return nil
	}
	<-ctx.Done()
	return ctx.Err()
}

// answer is the start of every call of a kind that does nothing else: it
// waits while the fake holds intents (held), counts the call in calls, and
// fails it for good (ErrFakeFailure) when fail (nil: never) is set.
func (f *FakeDriver) answer(ctx context.Context, calls *atomic.Int64, fail *atomic.Bool) error {
	if err := f.held(ctx); err != nil {
		return err
	}
	calls.Add(1)
	if fail != nil && fail.Load() {
		return executors.Unrecoverablef("%s", ErrFakeFailure)
	}
	return nil
}

// BuildGolden implements executors.Driver: the golden "exists" at once.
func (f *FakeDriver) BuildGolden(ctx context.Context, in fsm.BuildGolden) (executors.Result, error) {
	if err := f.held(ctx); err != nil {
		return executors.Result{}, err
	}
	f.goldens.Add(1)
	if f.missing(in.Key.Template) {
		return executors.Result{}, executors.Unrecoverablef("nodetest: no template %q", in.Key.Template)
	}
	return executors.Result{SnapshotDir: "golden/" + in.OpID.String()}, nil
}

// Clone implements executors.Driver: the VM is "running" at once.
func (f *FakeDriver) Clone(ctx context.Context, in fsm.CloneVM) (executors.Result, error) {
	if err := f.held(ctx); err != nil {
		return executors.Result{}, err
	}
	f.clones.Add(1)
	if f.FailClones.Load() {
		return executors.Result{}, executors.Unrecoverablef("nodetest: clone failed as asked")
	}
	if in.Cold && f.missing(in.Key.Template) {
		return executors.Result{}, executors.Unrecoverablef("nodetest: cold boot: no template %q", in.Key.Template)
	}
	return executors.Result{}, nil
}

// Hibernate implements executors.Driver.
func (f *FakeDriver) Hibernate(ctx context.Context, in fsm.HibernateVM) (executors.Result, error) {
	if err := f.held(ctx); err != nil {
		return executors.Result{}, err
	}
	if err := delay(ctx, f.hibernateDelay.Load()); err != nil {
		return executors.Result{}, err
	}
	f.hibernates.Add(1)
	if f.FailHibernates.Load() {
		return executors.Result{}, executors.Unrecoverablef("%s", ErrFakeFailure)
	}
	return executors.Result{SnapshotDir: "hibernate/" + in.VM}, nil
}

// Wake implements executors.Driver.
func (f *FakeDriver) Wake(ctx context.Context, _ fsm.WakeVM) (executors.Result, error) {
	if err := f.held(ctx); err != nil {
		return executors.Result{}, err
	}
	if err := delay(ctx, f.wakeDelay.Load()); err != nil {
		return executors.Result{}, err
	}
	f.wakes.Add(1)
	if f.FailWakes.Load() {
		return executors.Result{}, executors.Unrecoverablef("%s", ErrFakeFailure)
	}
	return executors.Result{}, nil
}

// Destroy implements executors.Driver.
func (f *FakeDriver) Destroy(ctx context.Context, _ fsm.DestroyVM) (executors.Result, error) {
	return executors.Result{}, f.answer(ctx, &f.destroys, nil)
}

// Checkpoint implements executors.Checkpointer: the checkpoint "exists" at
// once, named as the real drivers name it.
func (f *FakeDriver) Checkpoint(ctx context.Context, in fsm.CaptureCheckpoint) (executors.Result, error) {
	if err := f.answer(ctx, &f.checkpoints, &f.FailCheckpoints); err != nil {
		return executors.Result{}, err
	}
	return executors.Result{SnapshotDir: layout.CheckpointRel(in.Checkpoint)}, nil
}

// RemoveCheckpoint implements executors.Checkpointer.
func (f *FakeDriver) RemoveCheckpoint(ctx context.Context, _ fsm.RemoveCheckpoint) (executors.Result, error) {
	return executors.Result{}, f.answer(ctx, &f.ckRemovals, nil)
}

// Promote implements executors.Driver: the template's golden "exists" at
// once, named like a real driver names it.
func (f *FakeDriver) Promote(ctx context.Context, in fsm.PromoteVM) (executors.Result, error) {
	if err := f.answer(ctx, &f.promotes, &f.FailPromotes); err != nil {
		return executors.Result{}, err
	}
	rel := layout.GoldenRel(in.Target, in.OpID)
	return executors.Result{SnapshotDir: rel, Digest: fmt.Sprintf("sha256:%x", sha256.Sum256([]byte(rel)))}, nil
}

// CollectSnapshot implements executors.Driver: there is nothing to remove.
func (f *FakeDriver) CollectSnapshot(ctx context.Context, _ fsm.CollectSnapshot) (executors.Result, error) {
	return executors.Result{}, f.answer(ctx, &f.collects, nil)
}

// Calls returns how many calls of each kind the fake answered.
func (f *FakeDriver) Calls() map[fsm.IntentKind]int64 {
	return map[fsm.IntentKind]int64{
		fsm.KindGolden: f.goldens.Load(), fsm.KindClone: f.clones.Load(),
		fsm.KindHibernate: f.hibernates.Load(), fsm.KindWake: f.wakes.Load(),
		fsm.KindDestroy: f.destroys.Load(),
		// Checkpoints.
		fsm.KindCheckpoint: f.checkpoints.Load(), fsm.KindCheckpointDelete: f.ckRemovals.Load(),
		fsm.KindPromote: f.promotes.Load(), fsm.KindCollect: f.collects.Load(),
		fsm.KindAttachVolume: f.attaches.Load(), fsm.KindDetachVolume: f.detaches.Load(),
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
	// Tenants are the config's tenants (node.Config.Tenants): they seed the
	// tenant table until the API changes it.
	Tenants []auth.TenantConfig
	// Pools are configured on the node's first start.
	Pools []fsm.PoolSpec
	// MaxClaims is the node's max_claims (0 = unlimited).
	MaxClaims int
	// Volumes is the node's volume catalog (node.Config.Volumes).
	Volumes []fsm.VolumeSpec
	// Concurrency bounds the executors (default 64: the fake is instant).
	Concurrency int
	// Config is passed to api.New; OwnerAddr defaults to the listen address.
	Config api.Config
	// Redirector replaces the node's (the cluster view in sandboxd).
	Redirector api.Redirector
	// RefillDelay is passed to the engine (0: its default).
	RefillDelay time.Duration
	// NoExecutors makes the fake hold every intent (each call waits until
	// the node stops): pools never fill and clone-tier claims wait. For
	// handler tests that must not pay for the executors' background work.
	NoExecutors bool
	Log         zerolog.Logger
	// Tune, when set, adjusts the node's configuration before it starts
	// (connection timeouts, snapshot cadence, ...).
	Tune func(*node.Config)
}

// Node is a running in-process node. Close it when done.
type Node struct {
	*node.Node
	Driver *FakeDriver
	// URL is the loopback base URL, e.g. http://127.0.0.1:40123.
	URL string
}

// Start brings a node up through node.Start and serves HTTP on a fresh
// loopback port.
func Start(opts Options) (*Node, error) {
	if opts.Dir == "" {
		return nil, errors.New("nodetest: Options.Dir is required")
	}
	if opts.NodeID == "" {
		opts.NodeID = "n1"
	}
	if opts.Concurrency <= 0 {
		opts.Concurrency = 64
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	drv := &FakeDriver{}
	drv.hold.Store(opts.NoExecutors)
	cfg := opts.Config
	if cfg.Hypervisor == "" {
		cfg.Hypervisor = FakeHypervisor
	}
	nc := node.Config{
		DataDir: opts.Dir, NodeID: opts.NodeID, Listener: ln, Instance: "i-nodetest",
		RootToken: opts.RootToken, Tenants: opts.Tenants, MaxClaims: opts.MaxClaims, Pools: opts.Pools, Volumes: opts.Volumes,
		RestartPolicy: fsm.DefaultRestartPolicy, Concurrency: opts.Concurrency, RefillDelay: opts.RefillDelay,
		Redirector: opts.Redirector, API: cfg, Log: opts.Log,
	}
	if opts.Tune != nil {
		opts.Tune(&nc)
	}
	n, err := node.Start(context.Background(), nc, drv)
	if err != nil {
		return nil, err
	}
	return &Node{Node: n, Driver: drv, URL: n.URL()}, nil
}

// Close stops the node as SIGTERM stops sandboxd (node.Stop).
func (n *Node) Close() error { return n.Stop() }

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
			return fmt.Errorf("nodetest: pool %s has %d warm VMs, want %d: %w", key, warm, want, ctx.Err())
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
			return fmt.Errorf("nodetest: node did not settle: %w", ctx.Err())
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
	return Call(ctx, method, n.URL, path, token, body)
}

// Call sends one request to the API at base (http://host:port) and returns
// its status and body: the one raw HTTP call of the node tests and the e2e
// tests. token "" sends no Authorization header; a non-nil body is sent as
// JSON.
func Call(ctx context.Context, method, base, path, token string, body []byte) (status int, resp []byte, err error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, base+path, rd)
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

// CountEvents counts the events of type typ about aggregate agg in n's op
// log (e.g. how many imports a checkpoint's claims asked for).
func CountEvents(n *node.Node, typ event.Type, agg string) (int, error) {
	count := 0
	err := n.Log.Iterate(1, n.Log.LastSeq(), func(ev *event.Event) error {
		if ev.Type == typ && ev.AggID == agg {
			count++
		}
		return nil
	})
	return count, err
}
