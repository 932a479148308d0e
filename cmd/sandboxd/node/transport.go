package node

import (
	"github.com/sbxlog/sbxlog/executors/layout"
	"github.com/sbxlog/sbxlog/executors/transport"
	"github.com/sbxlog/sbxlog/projections/api"
)

// Checkpoint transport (issue 24): both ends are configured here, from
// what only the node knows. The sending end is the API's blob route, which
// reads the node's store; the receiving end is the driver's import
// (transport.Receiver, which every driver embeds), which authenticates at
// its peers with the root token: a fleet shares one.

// transportDriver is a driver that imports checkpoints once configured.
type transportDriver interface {
	UseTransport(transport.Config)
}

// useTransport configures the driver's imports, if it has them.
func (n *Node) useTransport(hypervisor string, roots layout.Roots) {
	if td, ok := n.Driver.(transportDriver); ok {
		td.UseTransport(transport.Config{Roots: roots, Format: transport.FormatOf(hypervisor), Token: n.cfg.RootToken, Log: n.zl})
	}
}

// checkpointBlobs is where the blob route reads checkpoints.
func (n *Node) checkpointBlobs(hypervisor string, roots layout.Roots) *api.CheckpointBlobs {
	return &api.CheckpointBlobs{Roots: roots, Format: transport.FormatOf(hypervisor)}
}
