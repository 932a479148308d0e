package natsembed

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
)

// Cluster is a JetStream cluster of embedded servers on loopback, for tests
// and benchmarks that need replicas (R3) and a server to kill.
type Cluster struct {
	Servers []*Server
}

// ClusterConfig configures StartCluster.
type ClusterConfig struct {
	// Name of the route cluster (default "sbx").
	Name string
	// SyncAlways is passed to every server.
	SyncAlways bool
	Logger     zerolog.Logger
}

// StartCluster starts n clustered JetStream servers on free loopback ports,
// each storing under dir/s<i>, and waits until JetStream accepts API calls.
// Every server is given the full route list up front so each one expects an
// n-member meta group from the start.
func StartCluster(ctx context.Context, dir string, n int, cfg ClusterConfig) (*Cluster, error) {
	if n < 1 {
		return nil, fmt.Errorf("natsembed: cluster of %d servers", n)
	}
	if cfg.Name == "" {
		cfg.Name = "sbx"
	}
	ports, err := FreePorts(2 * n)
	if err != nil {
		return nil, err
	}
	routes := make([]string, n)
	for i := range n {
		routes[i] = routeURL(DefaultHost, ports[n+i])
	}
	c := &Cluster{}
	for i := range n {
		s, err := Start(Options{
			StoreDir:   filepath.Join(dir, fmt.Sprintf("s%d", i)),
			Port:       ports[i],
			ServerName: fmt.Sprintf("%s-%d", cfg.Name, i),
			SyncAlways: cfg.SyncAlways,
			Cluster:    &ClusterOptions{Name: cfg.Name, Port: ports[n+i], Routes: routes},
			Logger:     cfg.Logger.With().Int("server", i).Logger(),
		})
		if err != nil {
			c.Shutdown()
			return nil, fmt.Errorf("natsembed: cluster server %d: %w", i, err)
		}
		c.Servers = append(c.Servers, s)
	}
	if err := c.WaitJetStream(ctx); err != nil {
		c.Shutdown()
		return nil, err
	}
	return c, nil
}

// URLs is the comma-separated client URL list of all members (the form
// nats.Connect takes), so a client survives the loss of any one server.
func (c *Cluster) URLs() string {
	urls := make([]string, len(c.Servers))
	for i, s := range c.Servers {
		urls[i] = s.ClientURL()
	}
	return strings.Join(urls, ",")
}

// WaitJetStream waits until the cluster has a JetStream meta leader and
// answers account info through a running member.
func (c *Cluster) WaitJetStream(ctx context.Context) error {
	var last error
	for {
		for _, s := range c.Servers {
			if !s.Running() {
				continue
			}
			if last = probeJetStream(ctx, s.ClientURL()); last == nil {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("natsembed: JetStream not ready: %w (last: %v)", ctx.Err(), last)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func probeJetStream(ctx context.Context, url string) error {
	nc, err := nats.Connect(url, nats.Timeout(time.Second), nats.NoReconnect())
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	pctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	_, err = js.AccountInfo(pctx)
	return err
}

// Shutdown stops every member.
func (c *Cluster) Shutdown() {
	for _, s := range c.Servers {
		s.Shutdown()
	}
}

// FreePorts returns n distinct free TCP ports on loopback. The listeners are
// closed before returning, so another process could take a port in between;
// callers that cannot retry should pass port 0 instead.
func FreePorts(n int) ([]int, error) {
	ls := make([]net.Listener, 0, n)
	defer func() {
		for _, l := range ls {
			_ = l.Close()
		}
	}()
	ports := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", net.JoinHostPort(DefaultHost, "0"))
		if err != nil {
			return nil, errors.Join(errors.New("natsembed: no free port"), err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}
