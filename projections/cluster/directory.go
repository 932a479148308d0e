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

// DefaultTTL is how long a node stays reachable after its last heartbeat
// (counted while the directory's watch delivers: see Directory). A node
// beats every TTL/4, so a dead node stops being a redirect target at most
// TTL after its last beat: the bound docs/operations.md states.
const DefaultTTL = 4 * time.Second

// NodeInfo is one node's entry in the bucket (key: the node id's subject
// token, stream.Token, which is the id itself for ids of letters, digits,
// '-' and '_').
type NodeInfo struct {
	Node string `json:"node"`
	// Addr is the node's owner_addr: where clients and other nodes reach
	// its HTTP API (host:port).
	Addr string `json:"addr"`
	// Seq is the node's log position at the heartbeat: a view that has
	// folded less of the node's log knows it is behind, even while the
	// node's events cannot reach the stream.
	Seq uint64 `json:"seq,omitempty"`
}

// DirectoryOptions configure Announce and WatchDirectory.
type DirectoryOptions struct {
	JS jetstream.JetStream
	// Bucket (default DefaultBucket).
	Bucket string
	// Replicas of the bucket: 1 embedded, 3 in a cluster (default 1).
	Replicas int
	// TTL: a node whose last heartbeat is older is left out (default
	// DefaultTTL). Announce beats every TTL/4.
	TTL time.Duration
	// Seq, when set, is the announcing node's log position, sent with
	// every heartbeat (NodeInfo.Seq).
	Seq func() uint64
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

// beat is the heartbeat period.
func (o *DirectoryOptions) beat() time.Duration { return o.TTL / 4 }

// gap is the longest silence of the watch that still counts as time
// passing for liveness: beyond it, the watch (not the nodes) is taken to
// have stalled. Above the beat, so a fleet of one node, whose own beat is
// all the watch delivers, never looks stalled.
func (o *DirectoryOptions) gap() time.Duration { return o.TTL * 3 / 8 }

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

// Announce writes node's address to the bucket every TTL/4 until ctx ends.
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
	info := NodeInfo{Node: node, Addr: addr}
	if _, err := json.Marshal(info); err != nil {
		return err
	}
	log := o.Logger.With().Str("component", "announce").Str("node", node).Logger()
	var kv jetstream.KeyValue
	var err error
	failing := false
	tick := time.NewTicker(o.beat())
	defer tick.Stop()
	for {
		if kv == nil {
			kv, err = o.bucket(ctx)
		}
		if kv != nil {
			if o.Seq != nil {
				info.Seq = o.Seq()
			}
			val, _ := json.Marshal(info)
			pctx, cancel := context.WithTimeout(ctx, o.beat())
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

// Withdraw removes node's address from the bucket: a stopping node calls
// it (after its Announce ended) so that every directory drops it at once,
// without waiting for its heartbeat to lapse.
func Withdraw(ctx context.Context, o DirectoryOptions, node string) error {
	if err := o.defaults(); err != nil {
		return err
	}
	kv, err := o.bucket(ctx)
	if err != nil {
		return err
	}
	if err := kv.Delete(ctx, stream.Token(node)); err != nil {
		return fmt.Errorf("cluster: withdraw %s: %w", node, err)
	}
	return nil
}

// Directory is the live view of the bucket.
//
// Liveness is judged by last-seen time with a grace for the watch itself:
// a node is live while its last heartbeat is at most TTL old, where age is
// counted on a clock that runs only while the watch delivers (any node's
// heartbeat, this node's own included, moves it). When the watch stalls
// (a KV leader change, the watch's NATS server lost) the clock advances by
// at most gap past the last delivery and then waits, so nobody is declared
// dead for heartbeats the directory could not receive; once deliveries
// resume, a node that really stopped lapses TTL after its last beat, as
// before. A withdrawn node (its key deleted by Withdraw) is out at once.
type Directory struct {
	o  DirectoryOptions
	mu sync.Mutex
	// seen maps node to its entry and the times of its last heartbeat.
	seen map[string]seenNode
	// vclock is the liveness clock at lastArrival, the local time of the
	// watch's last delivery.
	vclock      time.Duration
	lastArrival time.Time
}

type seenNode struct {
	info NodeInfo
	// at is the liveness clock's reading at the heartbeat; wall its local
	// time (for last_seen).
	at        time.Duration
	wall      time.Time
	withdrawn bool
}

// Entry is what the directory knows of one node.
type Entry struct {
	NodeInfo
	// Live: announcing (heartbeat within the TTL) and not withdrawn.
	Live bool
	// Withdrawn: the node took its address out (a clean stop).
	Withdrawn bool
	// LastSeen is the local time of its last heartbeat (or withdrawal).
	LastSeen time.Time
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
	// The watch first replays the bucket's entries, then a nil marks the
	// end of the replay.
	replay := true
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case e, ok := <-w.Updates():
			if !ok {
				return errors.New("cluster: watcher closed")
			}
			if e == nil {
				replay = false
				continue
			}
			d.update(e, replay)
		}
	}
}

// clock returns the liveness clock's reading at now (called with d.mu
// held): its value at the last delivery plus the wall time since, at most
// gap.
func (d *Directory) clock(now time.Time) time.Duration {
	if d.lastArrival.IsZero() {
		return d.vclock
	}
	return d.vclock + min(max(now.Sub(d.lastArrival), 0), d.o.gap())
}

func (d *Directory) update(e jetstream.KeyValueEntry, replay bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	now := d.o.Now()
	d.vclock = d.clock(now)
	d.lastArrival = now
	if e.Operation() != jetstream.KeyValuePut {
		if node, ok := stream.NodeOfToken(e.Key()); ok {
			if s, known := d.seen[node]; known {
				s.withdrawn, s.wall = true, now
				d.seen[node] = s
			}
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
	s := seenNode{info: ni, at: d.vclock, wall: now}
	if c := e.Created(); replay && !c.IsZero() && now.Sub(c) > d.o.TTL {
		s.at, s.wall = d.vclock-now.Sub(c), c
	}
	d.seen[ni.Node] = s
}

// entry is s as seen at liveness clock reading vnow.
func (d *Directory) entry(s seenNode, vnow time.Duration) Entry {
	return Entry{NodeInfo: s.info, Live: !s.withdrawn && vnow-s.at <= d.o.TTL, Withdrawn: s.withdrawn, LastSeen: s.wall}
}

// Lookup returns what the directory knows of node (ok false: never seen).
func (d *Directory) Lookup(node string) (Entry, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	s, ok := d.seen[node]
	if !ok {
		return Entry{}, false
	}
	return d.entry(s, d.clock(d.o.Now())), true
}

// Addr returns a live node's address.
func (d *Directory) Addr(node string) (string, bool) {
	e, ok := d.Lookup(node)
	if !ok || !e.Live {
		return "", false
	}
	return e.Addr, true
}

// Entries returns every node the directory has seen, sorted by node id.
func (d *Directory) Entries() []Entry {
	d.mu.Lock()
	defer d.mu.Unlock()
	vnow := d.clock(d.o.Now())
	out := make([]Entry, 0, len(d.seen))
	for _, n := range slices.Sorted(maps.Keys(d.seen)) {
		out = append(out, d.entry(d.seen[n], vnow))
	}
	return out
}

// Live returns the live nodes' entries, sorted by node id.
func (d *Directory) Live() []NodeInfo {
	var out []NodeInfo
	for _, e := range d.Entries() {
		if e.Live {
			out = append(out, e.NodeInfo)
		}
	}
	return out
}
