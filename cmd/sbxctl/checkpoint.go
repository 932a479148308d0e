package main

import (
	"context"
	"flag"
	"fmt"
	"io"

	"github.com/sbxlog/sbxlog/projections/api"
	"github.com/sbxlog/sbxlog/projections/apiclient"
)

func init() {
	register("checkpoint", command{summary: "checkpoint a sandbox (memory and disk; it runs on) (--name)", examples: `sbxctl checkpoint sb_0123456789abcdef --name v1      # memory and disk; the sandbox runs on
sbxctl checkpoint sb_0123456789abcdef --json | jq -r .checkpoint.id`, run: remoteCommand(remoteSpec{name: "checkpoint", args: []string{"ID"}, flags: checkpointFlags})})
	register("checkpoints", command{summary: "list checkpoints, newest first", examples: `sbxctl checkpoints                              # yours (root: every tenant's), newest first`, run: remoteCommand(remoteSpec{name: "checkpoints", flags: checkpointsFlags})})
	register("checkpoints rm", command{summary: "delete a checkpoint", examples: `sbxctl checkpoints rm ck_0123456789abcdef`, run: remoteCommand(remoteSpec{name: "checkpoints rm", args: []string{"CHECKPOINT"}, flags: checkpointRmFlags})})
	register("checkpoints claim", command{summary: "claim a sandbox cloned from a checkpoint (--ttl)", examples: `sbxctl checkpoints claim ck_0123456789abcdef --ttl 1h   # a new sandbox from its memory and disk`, run: remoteCommand(remoteSpec{name: "checkpoints claim", args: []string{"CHECKPOINT"}, flags: checkpointClaimFlags})})
	register("fork", command{summary: "fork a sandbox into --count children, all or none (--ttl, --ref-prefix)", examples: `sbxctl fork sb_0123456789abcdef --count 3        # three children, all or none
sbxctl fork sb_0123456789abcdef --count 2 --ttl 30m --ref-prefix job-7/`, run: remoteCommand(remoteSpec{name: "fork", args: []string{"ID"}, flags: forkFlags})})
}

func checkpointFlags(fs *flag.FlagSet) remoteBody {
	name := fs.String("name", "", "a label for the checkpoint")
	return func(ctx context.Context, c *apiclient.Client, cl *call) error {
		ck, err := c.Checkpoint(ctx, cl.args[0], api.CheckpointRequest{Name: *name})
		if err != nil {
			return err
		}
		if cl.json {
			return printJSON(cl.stdout, ck)
		}
		_, err = fmt.Fprintf(cl.stdout, "%s\n", ck.ID)
		return err
	}
}

func checkpointsFlags(*flag.FlagSet) remoteBody {
	return func(ctx context.Context, c *apiclient.Client, cl *call) error {
		list, err := c.Checkpoints(ctx)
		if err != nil {
			return err
		}
		return printTable(cl, api.CheckpointList{Checkpoints: list}, "ID\tNAME\tSANDBOX\tPOOL\tTENANT\tCREATED\tEXPIRES", func(tw io.Writer) {
			for _, ck := range list {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", ck.ID, orDash(ck.Name), ck.SandboxID, ck.Key, orDash(ck.Tenant),
					shortTime(ck.CreatedAt), orDash(shortTime(ck.ExpiresAt)))
			}
		})
	}
}

func checkpointRmFlags(*flag.FlagSet) remoteBody {
	return func(ctx context.Context, c *apiclient.Client, cl *call) error {
		if err := c.DeleteCheckpoint(ctx, cl.args[0]); err != nil {
			return err
		}
		if cl.json {
			return printJSON(cl.stdout, map[string]string{"id": cl.args[0], "action": "deleted"})
		}
		_, err := fmt.Fprintf(cl.stdout, "%s: deleted\n", cl.args[0])
		return err
	}
}

func checkpointClaimFlags(fs *flag.FlagSet) remoteBody {
	var ttl secondsFlag
	fs.Var(&ttl, "ttl", "time to live: a duration (10m) or seconds (default 5m, at most 24h)")
	return func(ctx context.Context, c *apiclient.Client, cl *call) error {
		res, err := c.ClaimCheckpoint(ctx, cl.args[0], api.CheckpointClaimRequest{TTLSeconds: ttl.n})
		if err != nil {
			return err
		}
		return printClaims(cl, res, []api.ClaimResponse{*res})
	}
}

func forkFlags(fs *flag.FlagSet) remoteBody {
	count := fs.Int("count", 1, "how many children")
	var ttl secondsFlag
	fs.Var(&ttl, "ttl", "each child's time to live: a duration (10m) or seconds (default 5m)")
	prefix := fs.String("ref-prefix", "", "claim_ref prefix: each child's claim_ref is the prefix and its id")
	return func(ctx context.Context, c *apiclient.Client, cl *call) error {
		kids, err := c.Fork(ctx, cl.args[0], api.ForkRequest{Count: *count, TTLSeconds: ttl.n, ClaimRefPrefix: *prefix})
		if err != nil {
			return err
		}
		return printClaims(cl, api.ForkResponse{Children: kids}, kids)
	}
}

// printClaims prints claim answers, one line each (JSON: v, the answer as
// the node gave it).
func printClaims(cl *call, v any, res []api.ClaimResponse) error {
	return printTable(cl, v, "ID\tTOKEN\tPOOL\tVM\tDEADLINE", func(tw io.Writer) {
		for _, r := range res {
			fmt.Fprintf(tw, "%s\t%s\t%s/%s/%s\t%s\t%s\n", r.ID, r.Token, r.Template, r.Net, r.Size, r.VM, shortTime(r.Deadline))
		}
	})
}
