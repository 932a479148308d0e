package main

// The nats section of the config as the node's replication (package
// cmd/sandboxd/node runs it).

import (
	"net"
	"strconv"

	"github.com/rs/zerolog"

	"github.com/sbxlog/sbxlog/cmd/sandboxd/node"
	"github.com/sbxlog/sbxlog/cmd/sandboxd/node/replication"
)

// natsPortOffset places the embedded server's default port next to the
// API's (7777 -> 8777), so a node's replication address is predictable
// (sbxctl follow --nats) without configuration.
const natsPortOffset = 1000

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

// replicationConfig is the node's replication from the nats section. With
// the embedded server on its default port, a port already taken (a second
// local daemon) falls back to a free one instead of failing; an explicitly
// configured port must be free.
func replicationConfig(cfg Config, zl zerolog.Logger) *node.Replication {
	// The replication packages name their components themselves (the
	// node's logger names none); the embedded server's notices (its
	// banner) are debug material.
	base := zl
	server := base
	if zl.GetLevel() > zerolog.DebugLevel {
		server = base.Level(max(zl.GetLevel(), zerolog.WarnLevel))
	}
	r := &node.Replication{
		Options: replication.Options{
			OwnerAddr: cfg.OwnerAddr, URL: cfg.NATS.URL, Port: cfg.NATS.Port, Replicas: cfg.NATS.Replicas,
			Auth: cfg.NATS.Config, Stream: cfg.NATS.Stream, SubjectPrefix: cfg.NATS.SubjectPrefix,
			Logger: base, ServerLogger: &server,
		},
		Sync: cfg.NATS.Sync, SyncTimeout: cfg.NATS.syncTimeout(),
	}
	if cfg.NATS.URL == "" && cfg.NATS.Port == 0 {
		r.Options.Port = defaultNATSPort(cfg.Listen)
		r.RetryFreePort = true
	}
	return r
}
