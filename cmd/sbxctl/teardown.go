package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"time"

	"github.com/sbxlog/sbxlog/projections/api"
	"github.com/sbxlog/sbxlog/projections/apiclient"
)

// Teardown: release (of some sandboxes, or --all) and down. sandboxd keeps
// its VMs running when it stops (a restart adopts them), so stopping it is
// no teardown; down is: release every live sandbox, then drain the node,
// which destroys its warm VMs and refills none, so no VM of this node is
// left running and sandboxd can be stopped. The drain is state: the node
// stays drained across restarts until sbxctl uncordon (claims meanwhile
// answer 429 saying so).

func init() {
	register("down", command{summary: "tear the node down: release every sandbox and drain it (no VM left running; uncordon undoes it)",
		examples: `sbxctl down                 # then stop sandboxd (Ctrl-C where make run runs)
sbxctl uncordon             # later: take claims again (the drain survives restarts)`,
		run: remoteCommand(remoteSpec{name: "down", flags: downFlags})})
}

func releaseFlags(fs *flag.FlagSet) remoteBody {
	all := fs.Bool("all", false, "release every live sandbox the token may see (root: all of this node's; a tenant: its own)")
	return func(ctx context.Context, c *apiclient.Client, cl *call) error {
		ids := cl.args
		switch {
		case *all && len(ids) > 0:
			return usagef("give IDs or --all, not both")
		case !*all && len(ids) == 0:
			return usagef("want at least one ID, or --all")
		case *all:
			var err error
			if ids, err = liveIDs(ctx, c); err != nil {
				return err
			}
		}
		results := make([]map[string]string, 0, len(ids))
		var errs []error
		for _, id := range ids {
			state, err := releaseOne(ctx, c, id)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", id, err))
				continue
			}
			results = append(results, map[string]string{"id": id, "action": "release", "state": state})
			if !cl.json {
				fmt.Fprintf(cl.stdout, "%s: %s\n", id, state)
			}
		}
		if cl.json {
			if err := printJSON(cl.stdout, map[string]any{"released": results}); err != nil {
				return err
			}
		} else if *all {
			fmt.Fprintf(cl.stdout, "%d sandbox(es) released\n", len(results))
		}
		return errors.Join(errs...)
	}
}

// releaseOne releases id and says what became of it: "released", or, for a
// sandbox that had already ended, what ended it and when (release of one
// is an idempotent 204, which alone would not say so).
func releaseOne(ctx context.Context, c *apiclient.Client, id string) (string, error) {
	before, err := c.Sandbox(ctx, id)
	if err == nil && endedState(before.State) {
		return "already " + before.State + endedSuffix(before), nil
	}
	if err := c.Release(ctx, id); err != nil {
		return "", err
	}
	return "released", nil
}

// endedState says whether a sandbox in state s has ended (ls shows no
// time left for it; release says it had nothing to release).
func endedState(s string) bool { return s == "released" || s == "expired" || s == "failed" }

// endedSuffix says when an ended sandbox ended, as far as its row tells:
// an expired one at its deadline; a failed one why.
func endedSuffix(sb *api.Sandbox) string {
	switch {
	case sb.State == "expired":
		return " at " + shortTime(sb.Deadline) + " (nothing to release)"
	case sb.Reason != "":
		return ": " + sb.Reason + " (nothing to release)"
	}
	return " (nothing to release)"
}

// liveIDs lists the live sandboxes the client may see.
func liveIDs(ctx context.Context, c *apiclient.Client) ([]string, error) {
	sbs, err := c.Sandboxes(ctx, apiclient.ListOptions{})
	if err != nil {
		return nil, err
	}
	ids := make([]string, len(sbs))
	for i, sb := range sbs {
		ids[i] = sb.ID
	}
	return ids, nil
}

// downPoll is how often down reads the node's info while VMs go away.
var downPoll = 100 * time.Millisecond

func downFlags(*flag.FlagSet) remoteBody {
	return func(ctx context.Context, c *apiclient.Client, cl *call) error {
		ids, err := liveIDs(ctx, c)
		if err != nil {
			return err
		}
		for _, id := range ids {
			if _, err := releaseOne(ctx, c, id); err != nil {
				return fmt.Errorf("release %s: %w", id, err)
			}
		}
		if _, err := c.Drain(ctx); err != nil {
			return fmt.Errorf("drain: %w", err)
		}
		// Released claims' VMs are destroyed after the release answers:
		// wait until the node holds none, live or warm.
		t := time.NewTicker(downPoll)
		defer t.Stop()
		for {
			in, err := c.Info(ctx)
			if err != nil {
				return err
			}
			if vmsLeft(in) == 0 {
				break
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("waiting for the node's VMs to go (%d left): %w", vmsLeft(in), ctx.Err())
			case <-t.C:
			}
		}
		if cl.json {
			return printJSON(cl.stdout, map[string]any{"released": len(ids), "draining": true})
		}
		fmt.Fprintf(cl.stdout, "%d sandbox(es) released, node drained: no VM of this node is left running.\n", len(ids))
		fmt.Fprintln(cl.stdout, "Stop sandboxd now (Ctrl-C where make run runs). It stays drained across restarts: sbxctl uncordon takes claims again.")
		return nil
	}
}

// vmsLeft counts the node's VMs: live claims' and warm or refilling ones.
func vmsLeft(in *api.Info) int {
	n := in.Live
	for _, p := range in.Pools {
		n += p.Warm + p.Refilling
	}
	return n
}
