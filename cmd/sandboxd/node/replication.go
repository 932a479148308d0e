package node

// The claim path's replication-dependent parts: the replication service
// started next to the op log (step 3), the API's view of other nodes
// (redirects, owners, peers) over its cluster view, /v1/info's replication
// line and the synchronous mode.

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"github.com/sbxlog/sbxlog/cmd/sandboxd/node/replication"
	"github.com/sbxlog/sbxlog/eventlog"
	"github.com/sbxlog/sbxlog/eventlog/replication/natsembed"
	"github.com/sbxlog/sbxlog/fsm"
	"github.com/sbxlog/sbxlog/fsm/engine"
	"github.com/sbxlog/sbxlog/projections/api"
	"github.com/sbxlog/sbxlog/projections/origin"
)

// DefaultSyncTimeout bounds an API write's wait for the JetStream ack in
// synchronous mode.
const DefaultSyncTimeout = 5 * time.Second

// DefaultShutdownFlush bounds how long a stopping node waits for the
// replicator to publish the log's tail, so a clean stop leaves the stream
// complete when NATS is reachable and is not held up when it is not.
const DefaultShutdownFlush = 5 * time.Second

func (r Replication) syncTimeout() time.Duration {
	if r.SyncTimeout <= 0 {
		return DefaultSyncTimeout
	}
	return r.SyncTimeout
}

// startReplication starts the replication service of the node's log. With
// RetryFreePort, an embedded server whose port is taken (a second local
// daemon on the default port) falls back to a free one instead of failing.
func (n *Node) startReplication(r Replication) (*replication.Service, error) {
	o := r.Options
	o.Log, o.DataDir = n.Log, n.cfg.DataDir
	if o.OwnerAddr == "" {
		o.OwnerAddr = n.cfg.OwnerAddr
	}
	if o.OwnerAddr == "" {
		o.OwnerAddr = n.listenAddr()
	}
	svc, err := replication.Start(o)
	if err != nil && r.RetryFreePort && o.URL == "" && o.Port != 0 && errors.Is(err, natsembed.ErrNotReady) {
		n.zl.Warn().Err(err).Int("port", o.Port).Msg("embedded NATS: default port unavailable, using a free one (set nats.port to fix it)")
		o.Port = 0
		svc, err = replication.Start(o)
	}
	if err != nil {
		return nil, err
	}
	ev := n.zl.Info().Str("nats_url", svc.URL).Bool("embedded", svc.Server != nil).Bool("sync", r.Sync)
	if svc.Server != nil {
		ev = ev.Str("store", filepath.Join(n.cfg.DataDir, "nats")).Str("seed_file", svc.SeedFile)
	}
	st := svc.Status()
	ev = ev.Str("credentials", st.Credentials).Str("stream", st.Stream).Str("subject", st.Subject)
	if !o.NoAudit {
		ev = ev.Str("audit", filepath.Join(n.cfg.DataDir, "audit.jsonl"))
	}
	if !o.NoUsage {
		ev = ev.Str("usage", filepath.Join(n.cfg.DataDir, "usage.jsonl"))
	}
	ev.Msg("replication started")
	return svc, nil
}

// flushReplication waits (bounded) until JetStream holds the whole log:
// called by Stop after the engine stopped and before the service closes.
func (n *Node) flushReplication() {
	last := n.Log.LastSeq()
	d := n.cfg.Replication.ShutdownFlush
	if d <= 0 {
		d = DefaultShutdownFlush
	}
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	if err := n.Repl.WaitReplicated(ctx, last); err != nil {
		st := n.Repl.Status().Replicator
		n.zl.Warn().Err(err).Uint64("log_seq", last).Uint64("replicated", st.Replicated).Bool("confirmed", st.Confirmed).
			Msg("replication: the log's tail is not in the stream yet; it is published at the next start")
	}
}

// replicatedGauge keeps /metrics' sbx_replicated_seq current until stop.
func replicatedGauge(stop <-chan struct{}, svc *replication.Service, m *api.Metrics) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		m.SetReplicated(svc.Replicator.Replicated())
		select {
		case <-stop:
			return
		case <-t.C:
		}
	}
}

// redirector answers the API's questions about other nodes from the
// service's cluster view.
type redirector struct {
	svc  *replication.Service
	self string
}

var (
	_ api.Redirector    = redirector{}
	_ api.PeerLister    = redirector{}
	_ api.OwnerLocator  = redirector{}
	_ api.OriginLocator = redirector{}
)

// Peers lists the other live nodes' addresses from the directory of the
// cluster view (GET /v1/peers).
func (r redirector) Peers() []string {
	var out []string
	for _, n := range r.svc.Directory.Live() {
		if n.Node != r.self && n.Addr != "" {
			out = append(out, n.Addr)
		}
	}
	return out
}

func (r redirector) WarmElsewhere(key fsm.PoolKey) []string {
	return r.svc.Redirect(key).Redirect
}

// OwnerOf names a sandbox's owner only when it is another node with a live
// address: a sandbox this node once held but forgot stays a plain 404.
func (r redirector) OwnerOf(id string) (string, bool) {
	o, ok := r.svc.View.OwnerOf(id)
	if !ok || !o.Live || o.Node == r.self {
		return "", false
	}
	return o.Addr, true
}

// LocateOwner tells the API about an owner that is not live (stopped,
// dead, not seen yet), and whether the view can vouch for "nobody".
func (r redirector) LocateOwner(id string) api.OwnerLocation {
	var loc api.OwnerLocation
	if o, ok := r.svc.View.OwnerOf(id); ok && o.Node != r.self {
		loc = api.OwnerLocation{Node: o.Node, Addr: o.Addr, LastSeen: o.LastSeen, Withdrawn: o.Withdrawn}
	}
	loc.ViewBehind, loc.ViewSince = r.svc.View.Behind(r.self)
	return loc
}

// Origins names the other nodes of the view (its logs and directory)
// whose claim ids carry tag.
func (r redirector) Origins(tag string) []api.OwnerLocation {
	var out []api.OwnerLocation
	for _, n := range r.svc.View.Nodes() {
		if n.Node == r.self || origin.NodeTag(n.Node) != tag {
			continue
		}
		loc := api.OwnerLocation{Node: n.Node, Addr: n.Addr, Withdrawn: n.Withdrawn}
		loc.LastSeen, _ = time.Parse(time.RFC3339Nano, n.LastSeen)
		out = append(out, loc)
	}
	return out
}

// syncEngine is the engine as the API sees it in synchronous mode: a write
// answers only once JetStream acknowledged its last event. The events are
// durable and applied locally either way; a missing ack is a 503 (the
// client may retry or look the result up), never a rollback. The engine is
// a field, not embedded, so no write method of the engine reaches the API
// without the wait.
type syncEngine struct {
	eng  *engine.Engine
	repl replicatedWait
}

var _ api.Engine = syncEngine{}

func (s syncEngine) View(fn func(st *fsm.State)) { s.eng.View(fn) }

func (s syncEngine) ProposeNew(ctx context.Context, build func(fsm.Meta) fsm.Command, hooks engine.Hooks) (engine.Result, error) {
	// Durable means confirmed here: it runs once JetStream acknowledged.
	res, err := s.eng.ProposeNew(ctx, build, engine.Hooks{Prepare: hooks.Prepare})
	if err != nil {
		return res, err
	}
	// A no-op reports the state at res.Seq: it is confirmed only once that
	// is replicated too.
	if err := s.repl.wait(ctx, res.Seq); err != nil {
		return res, fmt.Errorf("%w: %w", api.ErrUnavailable, err)
	}
	if hooks.Durable != nil && len(res.Events) > 0 {
		hooks.Durable()
	}
	return res, nil
}

// syncLog is the op log as the API sees it in synchronous mode: WaitDurable
// returns once the events up to seq are durable here and acknowledged by
// JetStream. The API waits on it before every answer it builds from the
// state rather than from its own command (a clone or cold claim's 200 once
// served, a hibernate's or wake's outcome, drain's info once its VMs are
// gone), so those confirm no more than syncEngine's answers do: nothing a
// lost node could take back.
type syncLog struct {
	*eventlog.Log
	repl replicatedWait
}

var _ api.Log = syncLog{}

func (l syncLog) WaitDurable(ctx context.Context, seq uint64) error {
	if err := l.Log.WaitDurable(ctx, seq); err != nil {
		return err
	}
	if err := l.repl.wait(ctx, seq); err != nil {
		// A caller that gave up is answered as by the local wait.
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return err
	}
	return nil
}

// syncAPI returns the engine and the op log the API gets in synchronous
// mode: both wait for the JetStream ack the same way (replicatedWait).
func (n *Node) syncAPI(timeout time.Duration) (api.Engine, api.Log) {
	w := replicatedWait{svc: n.Repl, timeout: timeout}
	return syncEngine{eng: n.Engine, repl: w}, syncLog{Log: n.Log, repl: w}
}

// replicatedWait is synchronous mode's one wait for JetStream: until it
// acknowledged event seq, at most timeout.
type replicatedWait struct {
	svc     *replication.Service
	timeout time.Duration
}

// wait returns nil once seq is replicated, else a *notReplicatedError.
func (w replicatedWait) wait(ctx context.Context, seq uint64) error {
	wctx, cancel := context.WithTimeout(ctx, w.timeout)
	defer cancel()
	err := w.svc.WaitReplicated(wctx, seq)
	if err == nil {
		return nil
	}
	if errors.Is(err, context.DeadlineExceeded) {
		err = fmt.Errorf("no acknowledgement within %s", w.timeout)
	}
	return &notReplicatedError{seq: seq, reason: err}
}

// notReplicatedError is a wait for the JetStream ack of event seq that
// ended without it: the events are committed on this node all the same. It
// is an api.ErrUnavailable (a 503 with its text). It keeps the reason as
// text only: a timeout is not a context.DeadlineExceeded for the API, which
// answers those as its own waits' bounds.
type notReplicatedError struct {
	seq    uint64
	reason error
}

func (e *notReplicatedError) Error() string {
	return fmt.Sprintf("event %d is committed on this node but not replicated: %v", e.seq, e.reason)
}

func (e *notReplicatedError) Is(target error) bool { return target == api.ErrUnavailable }
