package main

import (
	"context"
	"flag"

	"github.com/sbxlog/sbxlog/projections/apiclient"
)

// drain and uncordon take the root token; both print the node's info.

func init() {
	register("drain", command{summary: "drain the node: refuse new claims, destroy warm VMs (survives restarts)", examples: `sbxctl drain                                    # refuse claims; undo with sbxctl uncordon`, run: remoteCommand(remoteSpec{name: "drain", flags: drainFlags(true)})})
	register("uncordon", command{summary: "end a drain: take claims and refill again", examples: `sbxctl uncordon`, run: remoteCommand(remoteSpec{name: "uncordon", flags: drainFlags(false)})})
}

func drainFlags(drain bool) func(*flag.FlagSet) remoteBody {
	return func(*flag.FlagSet) remoteBody {
		return func(ctx context.Context, c *apiclient.Client, cl *call) error {
			call := c.Uncordon
			if drain {
				call = c.Drain
			}
			in, err := call(ctx)
			if err != nil {
				return err
			}
			return printInfo(cl, in)
		}
	}
}
