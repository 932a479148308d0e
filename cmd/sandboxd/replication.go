package main

// Replication wiring (DESIGN.md §6, issue 7): the replication service next
// to the op log, the API's view of other nodes (redirects, owners) over its
// cluster view, /v1/info's replication line and the synchronous mode.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/rs/zerolog"

	"github.com/sbxlog/sbxlog/cmd/sandboxd/replservice"
	"github.com/sbxlog/sbxlog/eventlog"
	"github.com/sbxlog/sbxlog/eventlog/replication/natsembed"
	"github.com/sbxlog/sbxlog/fsm"
	"github.com/sbxlog/sbxlog/fsm/engine"
	"github.com/sbxlog/sbxlog/projections/api"
)

// natsPortOffset places the embedded server's default port next to the
// API's (7777 -> 8777), so a node's replication address is predictable
// (sbxctl follow --nats) without configuration.
const natsPortOffset = 1000

// defaultSyncTimeout bounds an API write's wait for the JetStream ack in
// synchronous mode.
const defaultSyncTimeout = 5 * time.Second

// shutdownFlush bounds how long a stopping daemon waits for the replicator
// to publish the log's tail, so a clean stop leaves the stream complete
// when NATS is reachable and is not held up when it is not.
const shutdownFlush = 5 * time.Second

// defaultNATSPort is the embedded server's port when none is configured:
// the listen port + natsPortOffset, or 0 (a free one) when that is out of
// range.
func defaultNATSPort(listen string) int {
	_, p, err := net.SplitHostPort(listen)
	if err != nil {
		return 0
	}
	n, err := strconv.Atoi(p)
	if err != nil || n == 0 || n+natsPortOffset > 65535 {
		return 0
	}
	return n + natsPortOffset
}

// startReplication starts the replication service of log. With the embedded
// server on its default port, a port already taken (a second local daemon)
// falls back to a free one instead of failing; an explicitly configured
// port must be free.
func startReplication(cfg Config, dataDir string, log *eventlog.Log, zl zerolog.Logger) (*service.Service, error) {
	// The replication packages name their components themselves; the
	// embedded server's notices (its banner) are debug material.
	base := zerolog.New(os.Stderr).Level(zl.GetLevel()).With().Timestamp().Logger()
	server := base
	if zl.GetLevel() > zerolog.DebugLevel {
		server = base.Level(max(zl.GetLevel(), zerolog.WarnLevel))
	}
	o := service.Options{
		Log: log, DataDir: dataDir, OwnerAddr: cfg.OwnerAddr,
		URL: cfg.NATS.URL, Port: cfg.NATS.Port, Replicas: cfg.NATS.Replicas,
		Logger: base, ServerLogger: &server,
	}
	defaulted := cfg.NATS.URL == "" && cfg.NATS.Port == 0
	if defaulted {
		o.Port = defaultNATSPort(cfg.Listen)
	}
	svc, err := service.Start(o)
	if err != nil && defaulted && o.Port != 0 && errors.Is(err, natsembed.ErrNotReady) {
		zl.Warn().Err(err).Int("port", o.Port).Msg("embedded NATS: default port unavailable, using a free one (set nats.port to fix it)")
		o.Port = 0
		svc, err = service.Start(o)
	}
	if err != nil {
		return nil, err
	}
	ev := zl.Info().Str("nats_url", svc.URL).Bool("embedded", svc.Server != nil).Bool("sync", cfg.NATS.Sync)
	if svc.Server != nil {
		ev = ev.Str("store", filepath.Join(dataDir, "nats"))
	}
	ev.Str("audit", filepath.Join(dataDir, "audit.jsonl")).Str("usage", filepath.Join(dataDir, "usage.jsonl")).
		Msg("replication started")
	return svc, nil
}

// flushReplication waits (bounded) until JetStream holds the whole log:
// called on SIGTERM after the engine stopped and before the service closes.
func flushReplication(svc *service.Service, log *eventlog.Log, zl zerolog.Logger) {
	last := log.LastSeq()
	ctx, cancel := context.WithTimeout(context.Background(), shutdownFlush)
	defer cancel()
	if err := svc.WaitReplicated(ctx, last); err != nil {
		st := svc.Status().Replicator
		zl.Warn().Err(err).Uint64("log_seq", last).Uint64("replicated", st.Replicated).
			Msg("replication: the log's tail is not in the stream yet; it is published at the next start")
	}
}

// replicatedGauge keeps /metrics' sbx_replicated_seq current until stop.
func replicatedGauge(stop <-chan struct{}, svc *service.Service, m *api.Metrics) {
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
	svc  *service.Service
	self string
}

var _ api.Redirector = redirector{}

func (r redirector) WarmElsewhere(key fsm.PoolKey) []string {
	return r.svc.Redirect(key).Redirect
}

// OwnerOf names a sandbox's owner only when it is another node with a live
// address: a sandbox this node once held but forgot stays a plain 404.
func (r redirector) OwnerOf(id string) (string, bool) {
	node, addr, ok, err := r.svc.View.OwnerAddr(id)
	if !ok || err != nil || node == r.self {
		return "", false
	}
	return addr, true
}

// syncEngine is the engine as the API sees it in synchronous mode: a write
// answers only once JetStream acknowledged its last event. The events are
// durable and applied locally either way; a missing ack is a 503 (the
// client may retry or look the result up), never a rollback. The engine is
// a field, not embedded, so no write method of the engine reaches the API
// without the wait.
type syncEngine struct {
	eng     *engine.Engine
	svc     *service.Service
	timeout time.Duration
}

var _ api.Engine = syncEngine{}

func (s syncEngine) View(fn func(st *fsm.State)) { s.eng.View(fn) }

func (s syncEngine) ProposeNew(ctx context.Context, build func(fsm.Meta) fsm.Command, hooks engine.Hooks) (engine.Result, error) {
	// Durable means confirmed here: it runs once JetStream acknowledged.
	res, err := s.eng.ProposeNew(ctx, build, engine.Hooks{Prepare: hooks.Prepare})
	if err != nil || len(res.Events) == 0 {
		return res, err
	}
	seq := res.Events[len(res.Events)-1].Seq
	wctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	if err := s.svc.WaitReplicated(wctx, seq); err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			err = fmt.Errorf("no acknowledgement within %s", s.timeout)
		}
		return res, fmt.Errorf("%w: event %d is committed on this node but not replicated: %v", api.ErrUnavailable, seq, err)
	}
	if hooks.Durable != nil {
		hooks.Durable()
	}
	return res, nil
}
