// Package replication runs one node's replication the way sandboxd needs it:
// the embedded NATS server (unless an external URL is given), the
// replicator of the node's log, the audit and usage journals of the node,
// the node-address heartbeat and the cluster view. It is the wiring of the
// other replication packages, in their start order, behind one Start and one
// Close.
//
// Contract:
//   - Start fails only for bad options or an embedded server that cannot
//     start (its port taken, its store unusable). NATS being unreachable is
//     not an error: every component retries in the background and local
//     operation never waits for it (unless the caller uses WaitReplicated).
//   - A component that stops for good (the replicator refusing a second
//     writer, a consumer finding a gap) logs at error level and shows in
//     Status; the others keep running.
//   - Close stops the components, then the client connection, then the
//     embedded server, and waits for all of them.
package replication

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/sbxlog/sbxlog/eventlog"
	"github.com/sbxlog/sbxlog/eventlog/event"
	"github.com/sbxlog/sbxlog/eventlog/replication/feed"
	"github.com/sbxlog/sbxlog/eventlog/replication/natsembed"
	"github.com/sbxlog/sbxlog/eventlog/replication/replicator"
	"github.com/sbxlog/sbxlog/eventlog/replication/stream"
	"github.com/sbxlog/sbxlog/projections/audit"
	"github.com/sbxlog/sbxlog/projections/cluster"
	"github.com/sbxlog/sbxlog/projections/usage"
)

// Options configure Start.
type Options struct {
	// Log is the node's op log; its node id names the subject. Required.
	Log *eventlog.Log
	// DataDir holds the embedded server's store (DataDir/nats) and the
	// journals (DataDir/audit.jsonl, DataDir/usage.jsonl). Required.
	DataDir string
	// OwnerAddr is announced as this node's address (redirect target).
	// Required.
	OwnerAddr string
	// URL of an existing NATS cluster; empty embeds a server on loopback.
	URL string
	// Port of the embedded server (0 picks a free one).
	Port int
	// Replicas of the stream and the address bucket (default 1 embedded,
	// 3 with URL).
	Replicas int
	// NATSOptions are extra client options (credentials, TLS) for URL.
	NATSOptions []nats.Option
	// NoAudit and NoUsage turn the node's journals off (a central sbxctl
	// consumer may write them instead).
	NoAudit, NoUsage bool
	// TTL of the node-address heartbeat (default cluster.DefaultTTL).
	TTL    time.Duration
	Logger zerolog.Logger
	// ServerLogger, when set, receives the embedded server's own lines
	// instead of Logger (sandboxd keeps its start-up banner at debug).
	ServerLogger *zerolog.Logger
}

// Service is one node's running replication.
type Service struct {
	// Server is the embedded server, nil with Options.URL.
	Server     *natsembed.Server
	Replicator *replicator.Replicator
	Directory  *cluster.Directory
	View       *cluster.View
	// URL is the NATS URL in use.
	URL string

	node   string
	nc     *nats.Conn
	cancel context.CancelFunc
	wg     sync.WaitGroup
	log    zerolog.Logger

	mu      sync.Mutex
	stopped map[string]error
}

// Status is the service's line for /v1/info.
type Status struct {
	URL        string               `json:"url"`
	Embedded   bool                 `json:"embedded"`
	Replicator replicator.Status    `json:"replicator"`
	Nodes      []cluster.NodeStatus `json:"nodes"`
	Addresses  []cluster.NodeInfo   `json:"addresses"`
	// Stopped lists components that stopped for good, with their error.
	Stopped map[string]string `json:"stopped,omitempty"`
}

// Start starts the node's replication.
func Start(o Options) (*Service, error) {
	switch {
	case o.Log == nil:
		return nil, errors.New("replication: Options.Log is required")
	case o.DataDir == "":
		return nil, errors.New("replication: Options.DataDir is required")
	case o.OwnerAddr == "":
		return nil, errors.New("replication: Options.OwnerAddr is required")
	}
	node := o.Log.NodeID()
	if err := stream.CheckNodeID(node); err != nil {
		return nil, fmt.Errorf("replication: %w", err)
	}
	if o.Replicas == 0 {
		o.Replicas = 1
		if o.URL != "" {
			o.Replicas = 3
		}
	}
	s := &Service{node: node, log: o.Logger.With().Str("component", "replication").Logger(), stopped: map[string]error{}}
	s.URL = o.URL
	if o.URL == "" {
		slog := o.Logger
		if o.ServerLogger != nil {
			slog = *o.ServerLogger
		}
		srv, err := natsembed.Start(natsembed.Options{StoreDir: natsembed.DefaultStoreDir(o.DataDir), Port: o.Port, ServerName: node, Logger: slog})
		if err != nil {
			return nil, fmt.Errorf("replication: embedded NATS: %w", err)
		}
		s.Server, s.URL = srv, srv.ClientURL()
	}
	scfg := stream.Config{Replicas: o.Replicas}
	rep, err := replicator.New(replicator.Options{Log: o.Log, URL: s.URL, NATSOptions: o.NATSOptions, Stream: scfg, Logger: o.Logger})
	if err == nil {
		s.Replicator = rep
		nopts := append([]nats.Option{nats.Name("sbxlog-consumers-" + node), nats.MaxReconnects(-1),
			nats.ReconnectWait(250 * time.Millisecond), nats.RetryOnFailedConnect(true)}, o.NATSOptions...)
		s.nc, err = nats.Connect(s.URL, nopts...)
	}
	var js jetstream.JetStream
	if err == nil {
		js, err = jetstream.New(s.nc)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	if err == nil {
		s.Directory, err = cluster.WatchDirectory(ctx, cluster.DirectoryOptions{JS: js, Replicas: o.Replicas, TTL: o.TTL, Logger: o.Logger})
	}
	if err != nil {
		cancel()
		if s.nc != nil {
			s.nc.Close()
		}
		if s.Server != nil {
			s.Server.Shutdown()
		}
		return nil, fmt.Errorf("replication: %w", err)
	}
	s.View = cluster.NewView(s.Directory, o.Logger)

	// Start order: the replicator first (it creates or checks the stream),
	// then the node's consumers, then the heartbeat and the view.
	s.run("replicator", func() error { return rep.Run(ctx) })
	own := func(name string) feed.Options {
		return feed.Options{JS: js, Durable: name + "-" + node, Nodes: []string{node}, Logger: o.Logger}
	}
	if !o.NoAudit {
		s.run("audit", func() error { return audit.Run(ctx, filepath.Join(o.DataDir, "audit.jsonl"), own("audit")) })
	}
	if !o.NoUsage {
		s.run("usage", func() error { return usage.Run(ctx, filepath.Join(o.DataDir, "usage.jsonl"), own("usage")) })
	}
	s.run("announce", func() error {
		return cluster.Announce(ctx, cluster.DirectoryOptions{JS: js, Replicas: o.Replicas, TTL: o.TTL, Logger: o.Logger}, node, o.OwnerAddr)
	})
	s.run("cluster-view", func() error { return s.View.Follow(ctx, feed.Options{JS: js, Logger: o.Logger}) })
	return s, nil
}

// run starts a component; an error it returns stops only that component.
func (s *Service) run(name string, fn func() error) {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		if err := fn(); err != nil {
			s.log.Error().Err(err).Str("part", name).Msg("replication component stopped")
			s.mu.Lock()
			s.stopped[name] = err
			s.mu.Unlock()
		}
	}()
}

// WaitReplicated blocks until JetStream acknowledged seq: the synchronous
// replication mode of the API path.
func (s *Service) WaitReplicated(ctx context.Context, seq uint64) error {
	return s.Replicator.WaitReplicated(ctx, seq)
}

// Redirect returns the answer to a claim for key this node cannot serve:
// the addresses of other live nodes with warm VMs for it (empty: none).
func (s *Service) Redirect(key event.PoolKey) cluster.Redirect {
	return cluster.Redirect{Redirect: s.View.RedirectTargets(key, s.node)}
}

// Status returns a snapshot.
func (s *Service) Status() Status {
	st := Status{URL: s.URL, Embedded: s.Server != nil, Replicator: s.Replicator.Status(), Nodes: s.View.Nodes(), Addresses: s.Directory.Live()}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.stopped) > 0 {
		st.Stopped = map[string]string{}
		for k, err := range maps.All(s.stopped) {
			st.Stopped[k] = err.Error()
		}
	}
	return st
}

// Close stops everything and waits. Idempotent.
func (s *Service) Close() error {
	if s.cancel == nil {
		return nil
	}
	s.cancel()
	s.wg.Wait()
	s.nc.Close()
	if s.Server != nil {
		s.Server.Shutdown()
	}
	s.cancel = nil
	s.mu.Lock()
	defer s.mu.Unlock()
	var errs []error
	for _, k := range []string{"replicator", "audit", "usage", "announce", "cluster-view"} {
		if err := s.stopped[k]; err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", k, err))
		}
	}
	return errors.Join(errs...)
}
