package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/sbxlog/sbxlog/projections/api"
	"github.com/sbxlog/sbxlog/projections/apiclient"
)

// stdin is what a "-" file argument, exec -i and cp from - read (tests
// replace it).
var stdin io.Reader = os.Stdin

func init() {
	register("info", command{summary: "show the node's pools and claim counts", examples: `sbxctl info
sbxctl info --json`, run: remoteCommand(remoteSpec{name: "info", flags: infoFlags})})
	register("get", command{summary: "show one sandbox", examples: `sbxctl get sb_0123456789abcdef
sbxctl get --json sb_0123456789abcdef           # root: includes the sandbox token`, run: remoteCommand(remoteSpec{name: "get", args: []string{"ID"}, flags: getFlags})})
	register("pools get", command{summary: "print the pool configuration (--json output is pools set --file input)", examples: `sbxctl pools get --json > pools.json`, run: remoteCommand(remoteSpec{name: "pools get", flags: poolsGetFlags})})
	register("pools set", command{summary: "replace the pools (--file) or add/change/drain one (--template ...)", examples: `sbxctl pools set --template default --warm 4
sbxctl pools set --file pools.json`, run: remoteCommand(remoteSpec{name: "pools set", flags: poolsSetFlags})})
}

func infoFlags(*flag.FlagSet) remoteBody {
	return func(ctx context.Context, c *apiclient.Client, cl *call) error {
		in, err := c.Info(ctx)
		if err != nil {
			return err
		}
		return printInfo(cl, in)
	}
}

func printInfo(cl *call, in *api.Info) error {
	if cl.json {
		return printJSON(cl.stdout, in)
	}
	maxClaims := "no cap"
	if in.MaxClaims > 0 {
		maxClaims = fmt.Sprint(in.MaxClaims)
	}
	fmt.Fprintf(cl.stdout, "node %s at %s, hypervisor %s, log seq %d\n", in.Node, in.OwnerAddr, in.Hypervisor, in.LogSeq)
	fmt.Fprintf(cl.stdout, "claims: %d live (%d claimed, %d pending, %d hibernated), max_claims %s", in.Live, in.Claimed, in.Pending, in.Hibernated, maxClaims)
	if in.AtCapacity {
		fmt.Fprint(cl.stdout, ", AT CAPACITY")
	}
	if in.Draining {
		fmt.Fprint(cl.stdout, ", DRAINING (sbxctl uncordon)")
	}
	fmt.Fprintln(cl.stdout)
	if len(in.Peers) > 0 {
		fmt.Fprintf(cl.stdout, "peers: %s\n", strings.Join(in.Peers, ", "))
	}
	if len(in.Pools) == 0 {
		_, err := fmt.Fprintln(cl.stdout, "no pools (sbxctl pools set --template NAME --warm N)")
		return err
	}
	tw := newTable(cl.stdout, "POOL\tWARM\tTARGET\tREFILLING\tWARM_MAX\tGOLDEN\tLIVE\tFLAGS")
	for _, p := range in.Pools {
		var flags []string
		if p.Draining {
			flags = append(flags, "draining")
		}
		if p.AtCapacity {
			flags = append(flags, "at-capacity")
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%s\t%d\t%s\n", p.Key, p.Warm, p.Target, p.Refilling, p.WarmMax, p.GoldenState, p.Live, orDash(strings.Join(flags, ",")))
	}
	return tw.Flush()
}

func getFlags(*flag.FlagSet) remoteBody {
	return func(ctx context.Context, c *apiclient.Client, cl *call) error {
		sb, err := c.Sandbox(ctx, cl.args[0])
		if err != nil {
			return err
		}
		if cl.json {
			return printJSON(cl.stdout, sb)
		}
		tw := tabwriter.NewWriter(cl.stdout, 0, 4, 2, ' ', 0)
		for _, kv := range [][2]string{
			{"ID", sb.ID}, {"STATE", sb.State + reasonSuffix(sb.Reason)}, {"POOL", sb.Key.String()},
			{"TIER", sb.Tier}, {"VM", orDash(sb.VM)}, {"TENANT", orDash(sb.Tenant)}, {"REF", orDash(sb.ClaimRef)},
			{"METADATA", orDash(metaString(sb.Metadata))}, {"CREATED", shortTime(sb.Created)}, {"DEADLINE", shortTime(sb.Deadline)},
			{"OWNER", sb.OwnerAddr},
		} {
			fmt.Fprintf(tw, "%s\t%s\n", kv[0], kv[1])
		}
		return tw.Flush()
	}
}

func poolsGetFlags(*flag.FlagSet) remoteBody {
	return func(ctx context.Context, c *apiclient.Client, cl *call) error {
		p, err := c.Pools(ctx)
		if err != nil {
			return err
		}
		return printTable(cl, p, "TEMPLATE\tNET\tSIZE\tWARM\tWARM_MAX\tIDLE_HIBERNATE", func(tw io.Writer) {
			for _, s := range p.Pools {
				idle := "-"
				if s.IdleHibernateSeconds > 0 {
					idle = fmt.Sprintf("%ds", s.IdleHibernateSeconds)
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%s\n", s.Template, s.Net, s.Size, s.Warm, s.WarmMax, idle)
			}
		})
	}
}

// poolsSetFlags: --file replaces the whole set (pools left out drain, as
// PUT /v1/pools does); the per-pool flags read the current set, change or
// add the one pool they name (or drop it with --drain) and put the result,
// so the other pools (and the named pool's egress policy) are kept. The read-modify-write is not atomic: two
// operators editing at once can lose one edit, so scripts should use
// --file.
func poolsSetFlags(fs *flag.FlagSet) remoteBody {
	file := fs.String("file", "", "JSON file {\"pools\": [...]} (as pools get --json prints) replacing every pool; - reads stdin")
	template := fs.String("template", "", "the pool to add or change (instead of --file)")
	netMode := fs.String("net", "none", "with --template: none | egress")
	size := fs.String("size", "small", "with --template: small | medium | large | xlarge | 2xlarge")
	warm := fs.Int("warm", -1, "with --template: warm VMs to keep ready (required unless --drain)")
	warmMax := fs.Int("warm-max", 0, "with --template: upper bound of warm VMs (0: --warm)")
	var idle secondsFlag
	fs.Var(&idle, "idle-hibernate", "with --template: hibernate claims idle this long (duration or seconds; 0: never)")
	drain := fs.Bool("drain", false, "with --template: remove the pool (its warm VMs are destroyed)")
	return func(ctx context.Context, c *apiclient.Client, cl *call) error {
		var req api.PoolsRequest
		switch {
		case *file != "" && *template != "":
			return usagef("--file and --template exclude each other")
		case *file != "":
			if err := decodeFileArg(*file, &req); err != nil {
				return fmt.Errorf("%s: %w (want {\"pools\": [{\"template\": ..., \"warm\": N}, ...]})", *file, err)
			}
			if req.Pools == nil {
				return fmt.Errorf("%s: no \"pools\" list (an empty list drains every pool)", *file)
			}
		case *template != "":
			if *warm < 0 && !*drain {
				return usagef("--warm is required with --template (or --drain)")
			}
			cur, err := c.Pools(ctx)
			if err != nil {
				return err
			}
			spec := api.PoolSpec{Template: *template, Net: *netMode, Size: *size, Warm: *warm, WarmMax: *warmMax, IdleHibernateSeconds: idle.n}
			req.Pools = []api.PoolSpec{}
			found := false
			for _, p := range cur.Pools {
				if p.Template != spec.Template || p.Net != spec.Net || p.Size != spec.Size {
					req.Pools = append(req.Pools, p)
					continue
				}
				found = true
				if !*drain {
					if !idle.set {
						spec.IdleHibernateSeconds = p.IdleHibernateSeconds
					}
					// The flags do not set a policy: the pool keeps its own.
					spec.Egress = p.Egress
					req.Pools = append(req.Pools, spec)
				}
			}
			switch {
			case *drain && !found:
				return fmt.Errorf("no pool %s/%s/%s to drain", spec.Template, spec.Net, spec.Size)
			case !*drain && !found:
				req.Pools = append(req.Pools, spec)
			}
		default:
			return usagef("give --file or --template")
		}
		in, err := c.SetPools(ctx, req)
		if err != nil {
			return err
		}
		return printInfo(cl, in)
	}
}
