// Package follower keeps a verified replica of one node's op log in a local
// eventlog (Pebble), fed from the node's subject through a durable consumer.
//
// Contract: the replica holds exactly the node's events, byte for byte, with
// their original sequences, contiguous from 1. Every record's checksum, node
// and message id are checked (package feed) and the replica refuses anything
// that does not continue it exactly (eventlog.AppendReplica), so replaying
// the replica yields the node's state. The replica's LastSeq is the resume
// point: a restarted follower, a redelivery or a rebuilt consumer never
// appends an event twice. A gap or a corrupt record stops the follower with
// *feed.GapError or *feed.CorruptError.
package follower

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/sbxlog/sbxlog/eventlog"
	"github.com/sbxlog/sbxlog/eventlog/event"
	"github.com/sbxlog/sbxlog/eventlog/replication/feed"
	"github.com/sbxlog/sbxlog/eventlog/replication/stream"
)

// Options configure a Follower.
type Options struct {
	JS jetstream.JetStream
	// Stream (default stream.DefaultName).
	Stream string
	// SubjectPrefix of the node subjects (default stream.DefaultSubjectPrefix).
	SubjectPrefix string
	// Replica is the local log, opened with NodeID = the followed node.
	Replica *eventlog.Log
	// Durable names the consumer (default "follower-<node's token>");
	// followers of one node on different hosts need different names.
	Durable string
	// Batch bounds the events per replica write (default 256).
	Batch  int
	Logger zerolog.Logger
}

// Follower replicates one node's log.
type Follower struct {
	replica *eventlog.Log
	feed    *feed.Feed
}

// New checks opts.
func New(opts Options) (*Follower, error) {
	if opts.Replica == nil {
		return nil, errors.New("follower: Options.Replica is required")
	}
	node := opts.Replica.NodeID()
	if err := stream.CheckNodeID(node); err != nil {
		return nil, fmt.Errorf("follower: replica's node: %w", err)
	}
	if opts.Durable == "" {
		opts.Durable = "follower-" + stream.Token(node)
	}
	f := &Follower{replica: opts.Replica}
	fd, err := feed.New(feed.Options{
		JS:            opts.JS,
		Stream:        opts.Stream,
		SubjectPrefix: opts.SubjectPrefix,
		Durable:       opts.Durable,
		Nodes:         []string{node},
		Batch:         opts.Batch,
		Logger:        opts.Logger.With().Str("follows", node).Logger(),
	}, handler{opts.Replica})
	if err != nil {
		return nil, fmt.Errorf("follower: %w", err)
	}
	f.feed = fd
	return f, nil
}

// Run follows until ctx ends (nil) or a fatal error.
func (f *Follower) Run(ctx context.Context) error { return f.feed.Run(ctx) }

// Attached is the feed's (feed.Feed.Attached).
func (f *Follower) Attached() <-chan struct{} { return f.feed.Attached() }

// Status of the underlying feed.
func (f *Follower) Status() feed.Status { return f.feed.Status() }

// Replica is the replica log.
func (f *Follower) Replica() *eventlog.Log { return f.replica }

// LastSeq is the replica's last durable sequence.
func (f *Follower) LastSeq() uint64 { return f.replica.LastSeq() }

// WaitFor returns once the replica holds seq.
func (f *Follower) WaitFor(ctx context.Context, seq uint64) error {
	if seq == 0 || f.replica.LastSeq() >= seq {
		return nil
	}
	sub, err := f.replica.Subscribe(max(seq, f.replica.FirstSeq()))
	if err != nil {
		return err
	}
	defer sub.Close()
	_, err = sub.Next(ctx)
	return err
}

type handler struct{ l *eventlog.Log }

func (h handler) Position(string) uint64 { return h.l.LastSeq() }

func (h handler) Apply(ctx context.Context, evs []event.Event) error {
	return h.l.AppendReplica(ctx, evs)
}
