// Package replication runs one node's replication the way sandboxd needs it:
// the embedded NATS server (unless an external URL is given), the
// replicator of the node's log, the audit and usage journals of the node,
// the node-address heartbeat and the cluster view. It is the wiring of the
// other replication packages, in their start order, behind one Start and one
// Close.
//
// The embedded server authenticates its clients: on the first start Start
// generates a user NKey seed into <data_dir>/nats.nk (mode 0600; package
// natsauth says why an NKey), the server accepts that user only, and the
// service's clients (and sbxctl, reading the same file) sign in with it.
// An external server's credentials come from Options.Auth.
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
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/sbxlog/sbxlog/eventlog"
	"github.com/sbxlog/sbxlog/eventlog/event"
	"github.com/sbxlog/sbxlog/eventlog/replication/feed"
	"github.com/sbxlog/sbxlog/eventlog/replication/natsauth"
	"github.com/sbxlog/sbxlog/eventlog/replication/natsembed"
	"github.com/sbxlog/sbxlog/eventlog/replication/replicator"
	"github.com/sbxlog/sbxlog/eventlog/replication/stream"
	"github.com/sbxlog/sbxlog/executors/fsx"
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
	// Auth is the credentials and TLS settings for URL (ignored for the
	// embedded server, which uses its generated seed).
	Auth natsauth.Config
	// NATSOptions are extra client options, after Auth's.
	NATSOptions []nats.Option
	// Stream and SubjectPrefix locate the op logs (defaults
	// stream.DefaultName and stream.DefaultSubjectPrefix).
	Stream, SubjectPrefix string
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
	// URL is the NATS URL in use (without credentials).
	URL string
	// SeedFile is the embedded server's user seed ("" with Options.URL).
	SeedFile string

	node  string
	dopts cluster.DirectoryOptions
	scfg  stream.Config
	// stopAnnounce ends the heartbeat (Withdraw); announced is closed
	// once it returned.
	stopAnnounce context.CancelFunc
	announced    chan struct{}
	creds        string
	nc           *nats.Conn
	cancel       context.CancelFunc
	wg           sync.WaitGroup
	log          zerolog.Logger

	mu      sync.Mutex
	stopped map[string]error
}

// Status is the service's line for /v1/info.
type Status struct {
	URL      string `json:"url"`
	Embedded bool   `json:"embedded"`
	// Credentials says how the service authenticates (a file, a user
	// name; never a secret).
	Credentials string               `json:"credentials"`
	Stream      string               `json:"stream"`
	Subject     string               `json:"subject"`
	Replicator  replicator.Status    `json:"replicator"`
	Nodes       []cluster.NodeStatus `json:"nodes"`
	Addresses   []cluster.NodeInfo   `json:"addresses"`
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
	scfg := stream.Config{Name: o.Stream, SubjectPrefix: o.SubjectPrefix, Replicas: o.Replicas}
	if err := scfg.Validate(); err != nil {
		return nil, fmt.Errorf("replication: %w", err)
	}
	s := &Service{node: node, scfg: scfg, log: o.Logger.With().Str("component", "replication").Logger(), stopped: map[string]error{}}
	var auth []nats.Option
	if o.URL == "" {
		seedFile := natsauth.SeedFile(o.DataDir)
		pub, created, err := loadOrCreateSeed(seedFile)
		if err != nil {
			return nil, fmt.Errorf("replication: embedded NATS credentials: %w", err)
		}
		if created {
			s.log.Info().Str("seed_file", seedFile).Msg("embedded NATS: generated the credentials clients need (an NKey seed, mode 0600); sbxctl reads data/nats.nk from its working directory, or --nkey")
		}
		if auth, err = (natsauth.Config{NKeySeedFile: seedFile}).Options(); err != nil {
			return nil, fmt.Errorf("replication: embedded NATS credentials: %w", err)
		}
		slog := o.Logger
		if o.ServerLogger != nil {
			slog = *o.ServerLogger
		}
		srv, err := natsembed.Start(natsembed.Options{StoreDir: natsembed.DefaultStoreDir(o.DataDir), Port: o.Port, ServerName: stream.Token(node), NKeys: []string{pub}, Logger: slog})
		if err != nil {
			return nil, fmt.Errorf("replication: embedded NATS: %w", err)
		}
		s.Server, s.URL, s.SeedFile, s.creds = srv, srv.ClientURL(), seedFile, "nkey seed file "+seedFile
	} else {
		var err error
		if auth, err = o.Auth.Options(); err != nil {
			return nil, fmt.Errorf("replication: nats credentials: %w", err)
		}
		s.URL, s.creds = replicator.RedactURL(o.URL), o.Auth.Describe()
	}
	url := o.URL
	if url == "" {
		url = s.URL
	}
	nopts := append(auth, o.NATSOptions...)
	rep, err := replicator.New(replicator.Options{Log: o.Log, URL: url, NATSOptions: nopts, Stream: scfg, Logger: o.Logger})
	if err == nil {
		s.Replicator = rep
		copts := append([]nats.Option{nats.Name("sbxlog-consumers-" + node), nats.MaxReconnects(-1),
			nats.ReconnectWait(250 * time.Millisecond), nats.RetryOnFailedConnect(true)}, nopts...)
		s.nc, err = nats.Connect(url, copts...)
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
	feedOpts := func(durable string, nodes []string) feed.Options {
		return feed.Options{JS: js, Stream: scfg.Name, SubjectPrefix: scfg.SubjectPrefix, Durable: durable, Nodes: nodes, Logger: o.Logger}
	}
	own := func(name string) feed.Options { return feedOpts(name+"-"+stream.Token(node), []string{node}) }
	if !o.NoAudit {
		s.run("audit", func() error { return audit.Run(ctx, filepath.Join(o.DataDir, "audit.jsonl"), own("audit")) })
	}
	if !o.NoUsage {
		s.run("usage", func() error { return usage.Run(ctx, filepath.Join(o.DataDir, "usage.jsonl"), own("usage")) })
	}
	s.dopts = cluster.DirectoryOptions{JS: js, Replicas: o.Replicas, TTL: o.TTL, Logger: o.Logger, Seq: o.Log.LastSeq}
	actx, stopAnnounce := context.WithCancel(ctx)
	s.stopAnnounce, s.announced = stopAnnounce, make(chan struct{})
	s.run("announce", func() error {
		defer close(s.announced)
		return cluster.Announce(actx, s.dopts, node, o.OwnerAddr)
	})
	s.run("cluster-view", func() error { return s.View.Follow(ctx, feedOpts("", nil)) })
	return s, nil
}

// loadOrCreateSeed returns the public key of the embedded server's user,
// generating its seed into path (mode 0600, written atomically) when there
// is none. The op log is open, and locked, before this runs: no other
// process of this data dir races the creation.
func loadOrCreateSeed(path string) (pub string, created bool, err error) {
	pub, err = natsauth.PublicKey(path)
	if err == nil || !errors.Is(err, os.ErrNotExist) {
		return pub, false, err
	}
	seed, pub, err := natsauth.NewUserSeed()
	if err != nil {
		return "", false, err
	}
	if err := fsx.WriteFileAtomic(path, seed, 0o600); err != nil {
		return "", false, err
	}
	return pub, true, nil
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

// Withdraw takes this node out of every node's directory: the heartbeat
// stops and its address is deleted, so no redirect names it from now on.
// A stopping node calls it before it stops serving; bounded by ctx (NATS
// unreachable: the address then lapses after the TTL).
func (s *Service) Withdraw(ctx context.Context) error {
	s.stopAnnounce()
	select {
	case <-s.announced:
	case <-ctx.Done():
		return ctx.Err()
	}
	return cluster.Withdraw(ctx, s.dopts, s.node)
}

// Status returns a snapshot.
func (s *Service) Status() Status {
	st := Status{URL: s.URL, Embedded: s.Server != nil, Credentials: s.creds, Stream: s.scfg.StreamName(), Subject: s.scfg.Subject(s.node),
		Replicator: s.Replicator.Status(), Nodes: s.View.Nodes(), Addresses: s.Directory.Live()}
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
