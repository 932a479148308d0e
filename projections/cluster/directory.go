package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/sbxlog/sbxlog/eventlog/replication/stream"
)

// DefaultBucket is the KV bucket of node addresses.
const DefaultBucket = "sbx_nodes"

// DefaultTTL is how long a node stays reachable after its last heartbeat.
const DefaultTTL = 15 * time.Second

// NodeInfo is one node's entry in the bucket (key: the node id's subject
// token, stream.Token, which is the id itself for ids of letters, digits,
// '-' and '_').
type NodeInfo struct {
	Node string `json:"node"`
	// Addr is the node's owner_addr: where clients and other nodes reach
	// its HTTP API (host:port).
	Addr string `json:"addr"`
}

// DirectoryOptions configure Announce and WatchDirectory.
type DirectoryOptions struct {
	JS jetstream.JetStream
	// Bucket (default DefaultBucket).
	Bucket string
	// Replicas of the bucket: 1 embedded, 3 in a cluster (default 1).
	Replicas int
	// TTL: a node whose last heartbeat is older is left out (default
	// DefaultTTL). Announce beats every TTL/3.
	TTL time.Duration
	// Now is the clock liveness is judged by (default time.Now). Only the
	// watcher's own clock is used: heartbeats are timed on arrival, so
	// clock skew between nodes does not matter.
	Now    func() time.Time
	Logger zerolog.Logger
}

func (o *DirectoryOptions) defaults() error {
	if o.JS == nil {
		return errors.New("cluster: DirectoryOptions.JS is required")
	}
	if o.Bucket == "" {
		o.Bucket = DefaultBucket
	}
	if o.Replicas == 0 {
		o.Replicas = 1
	}
	if o.TTL <= 0 {
		o.TTL = DefaultTTL
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return nil
}

func (o *DirectoryOptions) bucket(ctx context.Context) (jetstream.KeyValue, error) {
	kv, err := o.JS.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:      o.Bucket,
		Description: "sbxlog node addresses (owner_addr), refreshed by heartbeats",
		History:     1,
		Storage:     jetstream.FileStorage,
		Replicas:    o.Replicas,
		// Entries of nodes gone for good disappear eventually; liveness is
		// judged by heartbeat arrival, not by this.
		TTL: 100 * o.TTL,
	})
	if err != nil {
		return nil, fmt.Errorf("cluster: bucket %s: %w", o.Bucket, err)
	}
	return kv, nil
}

// Announce writes node's address to the bucket every TTL/3 until ctx ends.
// Failures (NATS down) are logged and retried at the next beat; it returns
// nil when ctx ends, or an error for bad input.
func Announce(ctx context.Context, o DirectoryOptions, node, addr string) error {
	if err := o.defaults(); err != nil {
		return err
	}
	if err := stream.CheckNodeID(node); err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	if addr == "" {
		return errors.New("cluster: empty node address")
	}
	val, err := json.Marshal(NodeInfo{Node: node, Addr: addr})
	if err != nil {
		return err
	}
	log := o.Logger.With().Str("component", "announce").Str("node", node).Logger()
	var kv jetstream.KeyValue
	failing := false
	tick := time.NewTicker(o.TTL / 3)
	defer tick.Stop()
	for {
		if kv == nil {
			kv, err = o.bucket(ctx)
		}
		if kv != nil {
			pctx, cancel := context.WithTimeout(ctx, o.TTL/3)
			_, err = kv.Put(pctx, stream.Token(node), val)
			cancel()
		}
		switch {
		case err != nil && ctx.Err() == nil && !failing:
			log.Warn().Err(err).Msg("node address heartbeat failed; retrying")
			failing = true
		case err == nil && failing:
			log.Info().Msg("node address heartbeat resumed")
			failing = false
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// Directory is the live view of the bucket.
type Directory struct {
	o  DirectoryOptions
	mu sync.Mutex
	// seen maps node to its entry and the local time of its last heartbeat.
	seen map[string]seenNode
}

type seenNode struct {
	info NodeInfo
	at   time.Time
}

// WatchDirectory returns a directory and keeps it current until ctx ends:
// it creates the bucket if needed and watches it, retrying with backoff
// while NATS is unreachable, so a node can start before NATS does (the
// directory is empty until the first watch succeeds).
func WatchDirectory(ctx context.Context, o DirectoryOptions) (*Directory, error) {
	if err := o.defaults(); err != nil {
		return nil, err
	}
	d := &Directory{o: o, seen: map[string]seenNode{}}
	go d.watch(ctx)
	return d, nil
}

func (d *Directory) watch(ctx context.Context) {
	log := d.o.Logger.With().Str("component", "directory").Logger()
	backoff := 50 * time.Millisecond
	for ctx.Err() == nil {
		err := d.watchOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		log.Warn().Err(err).Msg("node address watch interrupted; retrying")
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

func (d *Directory) watchOnce(ctx context.Context) error {
	kv, err := d.o.bucket(ctx)
	if err != nil {
		return err
	}
	w, err := kv.WatchAll(ctx)
	if err != nil {
		return fmt.Errorf("cluster: watch %s: %w", d.o.Bucket, err)
	}
	defer func() { _ = w.Stop() }()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case e, ok := <-w.Updates():
			if !ok {
				return errors.New("cluster: watcher closed")
			}
			if e != nil {
				d.update(e)
			}
		}
	}
}

func (d *Directory) update(e jetstream.KeyValueEntry) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if e.Operation() != jetstream.KeyValuePut {
		if node, ok := stream.NodeOfToken(e.Key()); ok {
			delete(d.seen, node)
		}
		return
	}
	var ni NodeInfo
	if err := json.Unmarshal(e.Value(), &ni); err != nil || stream.Token(ni.Node) != e.Key() || ni.Addr == "" {
		d.o.Logger.Warn().Str("key", e.Key()).Msg("cluster: ignoring a malformed node address entry")
		return
	}
	// Heartbeats count from their arrival, except an entry replayed at
	// watch start whose server timestamp is already older than the TTL: a
	// node that stopped long ago must not look alive for another TTL.
	at := d.o.Now()
	if c := e.Created(); !c.IsZero() && at.Sub(c) > d.o.TTL {
		at = c
	}
	d.seen[ni.Node] = seenNode{info: ni, at: at}
}

// Addr returns a live node's address.
func (d *Directory) Addr(node string) (string, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	s, ok := d.seen[node]
	if !ok || d.o.Now().Sub(s.at) > d.o.TTL {
		return "", false
	}
	return s.info.Addr, true
}

// Live returns the live nodes' entries, sorted by node id.
func (d *Directory) Live() []NodeInfo {
	d.mu.Lock()
	defer d.mu.Unlock()
	now := d.o.Now()
	var out []NodeInfo
	for _, n := range slices.Sorted(maps.Keys(d.seen)) {
		if s := d.seen[n]; now.Sub(s.at) <= d.o.TTL {
			out = append(out, s.info)
		}
	}
	return out
}
