// Package natsembed runs a NATS server with JetStream inside the calling
// process: the default replication transport of sandboxd (one server, store
// under the node's data dir, loopback listener) and the building block of the
// loopback JetStream clusters the replication tests and benchmarks run.
//
// Contract:
//   - Start returns only when the server accepts client connections; with a
//     cluster configured, Cluster.WaitJetStream waits until JetStream has a
//     meta leader and accepts API calls.
//   - Port 0 picks a free port; the bound port is kept, so Restart comes back
//     on the same address and clients' reconnect logic finds it again.
//   - Shutdown is idempotent and returns once the server has fully stopped
//     (JetStream flushed its store, listeners closed).
//   - The server never installs signal handlers and never exits the process:
//     its fatal log lines go to the logger at error level.
//   - With NKeys set, only clients that sign the server's challenge with one
//     of those users' seeds connect; any other client is refused with an
//     authorization violation (sandboxd's embedded server always has one,
//     see package natsauth).
package natsembed

import (
	"cmp"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"
	"github.com/rs/zerolog"
)

// DefaultHost is where the embedded server listens unless told otherwise:
// replication traffic of a single node never needs to leave the host.
const DefaultHost = "127.0.0.1"

// MaxPayload is the embedded server's max_payload: room for the largest
// event (event.MaxPayload, 1 MiB, plus its envelope), which the server's
// 1 MiB default would refuse. An external cluster needs the same setting.
const MaxPayload = 2 << 20

// ErrNotReady means the server did not accept connections in time.
var ErrNotReady = errors.New("natsembed: server not ready for connections")

// Options configure one embedded server.
type Options struct {
	// StoreDir holds JetStream's file store (created if absent). Required.
	StoreDir string
	// Host is the client listener's address (default DefaultHost).
	Host string
	// Port is the client port; 0 picks a free one.
	Port int
	// ServerName must be unique within a cluster (default "sbx-<port>").
	ServerName string
	// SyncAlways makes JetStream fsync every write before acknowledging it.
	// Off by default: the replicator's resume point comes from the stream, so
	// a tail lost by a crashed server is published again.
	SyncAlways bool
	// MaxStore caps JetStream's file store in bytes (0: server default).
	MaxStore int64
	// MaxPayload is the largest message (default MaxPayload).
	MaxPayload int32
	// NKeys are the public keys of the users that may connect ("U...");
	// empty accepts every client (tests' servers).
	NKeys []string
	// Cluster joins the server to a route cluster; nil runs it standalone.
	Cluster *ClusterOptions
	// ReadyTimeout bounds Start's wait for the listener (default 10 s).
	ReadyTimeout time.Duration
	// Logger receives the server's log lines (default: discarded).
	Logger zerolog.Logger
}

// ClusterOptions describe the route cluster a server joins.
type ClusterOptions struct {
	// Name is the cluster's name, the same on every member.
	Name string
	// Host and Port are the route listener (Port 0 picks a free one).
	Host string
	Port int
	// Routes are the route URLs of every member (nats-route://host:port);
	// the server's own entry is ignored by the server.
	Routes []string
}

// Server is a running embedded NATS server.
type Server struct {
	mu   sync.Mutex
	opts Options // with the bound ports filled in after the first start
	srv  *server.Server
}

// Start validates opts and starts a server.
func Start(opts Options) (*Server, error) {
	if opts.StoreDir == "" {
		return nil, errors.New("natsembed: StoreDir is required")
	}
	if opts.Port < 0 || opts.Port > 65535 {
		return nil, fmt.Errorf("natsembed: port %d out of range [0, 65535]", opts.Port)
	}
	if opts.Host == "" {
		opts.Host = DefaultHost
	}
	if opts.ReadyTimeout <= 0 {
		opts.ReadyTimeout = 10 * time.Second
	}
	for _, k := range opts.NKeys {
		if !nkeys.IsValidPublicUserKey(k) {
			return nil, fmt.Errorf("natsembed: %q is not a public user NKey", k)
		}
	}
	opts.NKeys = append([]string(nil), opts.NKeys...)
	if c := opts.Cluster; c != nil {
		if c.Name == "" {
			return nil, errors.New("natsembed: cluster name is required")
		}
		if c.Port < 0 || c.Port > 65535 {
			return nil, fmt.Errorf("natsembed: cluster port %d out of range [0, 65535]", c.Port)
		}
		if c.Host == "" {
			c.Host = opts.Host
		}
		cc := *c
		cc.Routes = append([]string(nil), c.Routes...)
		opts.Cluster = &cc
	}
	if err := os.MkdirAll(opts.StoreDir, 0o755); err != nil {
		return nil, fmt.Errorf("natsembed: store dir: %w", err)
	}
	s := &Server{opts: opts}
	if err := s.start(); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *Server) start() error {
	so, err := s.serverOptions()
	if err != nil {
		return err
	}
	srv, err := server.NewServer(so)
	if err != nil {
		return fmt.Errorf("natsembed: %w", err)
	}
	// The server reports a failed listen only through its logger (Fatalf),
	// so watch for that instead of waiting out the whole timeout.
	fatal := make(chan string, 1)
	srv.SetLoggerV2(logAdapter{l: s.opts.Logger, fatal: fatal}, false, false, false)
	srv.Start()
	deadline := time.Now().Add(s.opts.ReadyTimeout)
	for !srv.ReadyForConnections(20 * time.Millisecond) {
		var why string
		select {
		case why = <-fatal:
		default:
			if time.Now().Before(deadline) {
				continue
			}
			why = fmt.Sprintf("not listening after %s", s.opts.ReadyTimeout)
		}
		srv.Shutdown()
		srv.WaitForShutdown()
		return fmt.Errorf("%w: %s:%d: %s", ErrNotReady, s.opts.Host, s.opts.Port, why)
	}
	// Keep the bound ports so a restart comes back on the same addresses.
	if a, ok := srv.Addr().(*net.TCPAddr); ok {
		s.opts.Port = a.Port
	}
	if s.opts.Cluster != nil {
		if a := srv.ClusterAddr(); a != nil {
			s.opts.Cluster.Port = a.Port
		}
	}
	if s.opts.ServerName == "" {
		s.opts.ServerName = srv.Name()
	}
	s.srv = srv
	return nil
}

func (s *Server) serverOptions() (*server.Options, error) {
	o := s.opts
	port := o.Port
	if port == 0 {
		port = server.RANDOM_PORT
	}
	name := o.ServerName
	if name == "" && o.Port != 0 {
		name = "sbx-" + strconv.Itoa(o.Port)
	}
	so := &server.Options{
		ServerName:        name,
		Host:              o.Host,
		Port:              port,
		JetStream:         true,
		StoreDir:          o.StoreDir,
		SyncAlways:        o.SyncAlways,
		JetStreamMaxStore: o.MaxStore,
		MaxPayload:        cmp.Or(o.MaxPayload, MaxPayload),
		NoSigs:            true,
		// A missing HTTP monitor port must not default to anything.
		HTTPPort: 0,
	}
	for _, k := range o.NKeys {
		so.Nkeys = append(so.Nkeys, &server.NkeyUser{Nkey: k})
	}
	if c := o.Cluster; c != nil {
		cport := c.Port
		if cport == 0 {
			cport = server.RANDOM_PORT
		}
		so.Cluster = server.ClusterOpts{Name: c.Name, Host: c.Host, Port: cport}
		for _, r := range c.Routes {
			u, err := url.Parse(r)
			if err != nil || u.Host == "" {
				return nil, fmt.Errorf("natsembed: bad route URL %q", r)
			}
			so.Routes = append(so.Routes, u)
		}
	}
	return so, nil
}

// ClientURL is the nats:// URL clients connect to.
func (s *Server) ClientURL() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return (&url.URL{Scheme: "nats", Host: net.JoinHostPort(s.opts.Host, strconv.Itoa(s.opts.Port))}).String()
}

// Port is the bound client port.
func (s *Server) Port() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.opts.Port
}

// RouteURL is the server's route URL (empty when not clustered).
func (s *Server) RouteURL() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.opts.Cluster == nil {
		return ""
	}
	return routeURL(s.opts.Cluster.Host, s.opts.Cluster.Port)
}

func routeURL(host string, port int) string {
	return (&url.URL{Scheme: "nats-route", Host: net.JoinHostPort(host, strconv.Itoa(port))}).String()
}

// Name is the server's name.
func (s *Server) Name() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.opts.ServerName
}

// StoreDir is the JetStream store directory.
func (s *Server) StoreDir() string { return s.opts.StoreDir }

// Running reports whether the server is up.
func (s *Server) Running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.srv != nil && s.srv.Running()
}

// NATS exposes the underlying server for diagnostics (JetStream state in
// tests); callers must not shut it down behind this wrapper's back.
func (s *Server) NATS() *server.Server {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.srv
}

// Shutdown stops the server and waits until it has stopped. Idempotent.
func (s *Server) Shutdown() {
	s.mu.Lock()
	srv := s.srv
	s.srv = nil
	s.mu.Unlock()
	if srv == nil {
		return
	}
	srv.Shutdown()
	srv.WaitForShutdown()
}

// Restart starts the server again on the same ports and store (shutting it
// down first if it is running): what a host sees when nats comes back.
func (s *Server) Restart() error {
	s.Shutdown()
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.start()
}

// SetRoutes replaces the route list used by the next Restart, so a restarted
// cluster member can find peers whose ports it did not know at first start.
func (s *Server) SetRoutes(routes []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.opts.Cluster != nil {
		s.opts.Cluster.Routes = append([]string(nil), routes...)
	}
}

// DefaultStoreDir is where sandboxd keeps the embedded server's store.
func DefaultStoreDir(dataDir string) string { return filepath.Join(dataDir, "nats") }

// logAdapter routes the server's log lines to zerolog. Fatalf is logged, not
// acted on (an embedded server must never exit its host process), and
// passed to Start, which is waiting for the server to come up.
type logAdapter struct {
	l     zerolog.Logger
	fatal chan<- string
}

func (a logAdapter) Noticef(f string, v ...any) { a.l.Info().Str("component", "nats").Msgf(f, v...) }
func (a logAdapter) Warnf(f string, v ...any)   { a.l.Warn().Str("component", "nats").Msgf(f, v...) }
func (a logAdapter) Fatalf(f string, v ...any) {
	a.l.Error().Str("component", "nats").Msgf(f, v...)
	select {
	case a.fatal <- fmt.Sprintf(f, v...):
	default:
	}
}
func (a logAdapter) Errorf(f string, v ...any) { a.l.Error().Str("component", "nats").Msgf(f, v...) }
func (a logAdapter) Debugf(f string, v ...any) { a.l.Debug().Str("component", "nats").Msgf(f, v...) }
func (a logAdapter) Tracef(f string, v ...any) { a.l.Trace().Str("component", "nats").Msgf(f, v...) }
