package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"sort"
	"text/tabwriter"
	"time"

	"github.com/sbxlog/sbxlog/projections/api"
	"github.com/sbxlog/sbxlog/projections/apiclient"
)

func init() {
	register("claim", command{summary: "claim a sandbox (--template; waits until it runs)", examples: `sbxctl claim --template default                 # a sandbox of pool default/none/small
sbxctl claim --template default --ttl 1h --ref job-7
sbxctl claim --template default --json | jq -r .id`, run: remoteCommand(remoteSpec{name: "claim", flags: claimFlags})})
	register("release", command{summary: "release sandboxes (ID..., or --all: every live one you may see)", examples: `sbxctl release sb_0123456789abcdef
sbxctl release --all                            # every live sandbox of this node (root)`, run: remoteCommand(remoteSpec{name: "release", rest: "ID... | --all", flags: releaseFlags})})
	register("hibernate", command{summary: "hibernate a sandbox (returns once hibernated; --no-wait: once requested)", examples: `sbxctl hibernate sb_0123456789abcdef             # snapshot it and stop its VM
sbxctl hibernate --no-wait sb_0123456789abcdef`, run: remoteCommand(remoteSpec{name: "hibernate", args: []string{"ID"}, flags: lifecycleFlags("hibernate")})})
	register("wake", command{summary: "wake a hibernated sandbox (returns once running; --no-wait: once requested)", examples: `sbxctl wake sb_0123456789abcdef                  # exec and cp wake it by themselves too`, run: remoteCommand(remoteSpec{name: "wake", args: []string{"ID"}, flags: lifecycleFlags("wake")})})
	register("renew", command{summary: "extend a sandbox's deadline to now + --ttl", examples: `sbxctl renew sb_0123456789abcdef --ttl 30m      # deadline = now + 30 min`, run: remoteCommand(remoteSpec{name: "renew", args: []string{"ID"}, flags: renewFlags})})
	register("preview", command{summary: "mint a preview URL of a guest port (--port; --ttl)", examples: `sbxctl preview sb_0123456789abcdef --port 8000 --ttl 10m`, run: remoteCommand(remoteSpec{name: "preview", args: []string{"ID"}, flags: previewFlags})})
	register("ls", command{summary: "list sandboxes (--ref, --meta k=v, --state)", examples: `sbxctl ls                                       # live sandboxes, with EXPIRES IN
sbxctl ls --state all                           # ended ones too
sbxctl ls --ref job-7 --meta team=a`, run: remoteCommand(remoteSpec{name: "ls", flags: lsFlags})})
}

func claimFlags(fs *flag.FlagSet) remoteBody {
	fs.Lookup("timeout").Usage = "give up after this long (clone and cold claims wait for their VM)"
	template := fs.String("template", "", "pool template (required)")
	netMode := fs.String("net", "none", "network: none | egress")
	size := fs.String("size", "small", "small | medium | large | xlarge | 2xlarge")
	var ttl secondsFlag
	fs.Var(&ttl, "ttl", "time to live: a duration (10m) or seconds (default 5m, at most 24h)")
	ref := fs.String("ref", "", "claim_ref, for finding the sandbox again (ls --ref)")
	var meta kvFlag
	fs.Var(&meta, "meta", "metadata key=value (repeatable)")
	noRedirect := fs.Bool("no-redirect", false, "be served by this node (cloning if it has no warm VM) rather than redirected to one with warm VMs")
	return func(ctx context.Context, c *apiclient.Client, cl *call) error {
		if *template == "" {
			return usagef("--template is required")
		}
		res, err := c.Claim(ctx, api.ClaimRequest{
			Template: *template, Net: *netMode, Size: *size, TTLSeconds: ttl.n, ClaimRef: *ref, Metadata: meta.m,
			NoRedirect: *noRedirect,
		})
		if err != nil {
			return err
		}
		if cl.json {
			return printJSON(cl.stdout, res)
		}
		tw := tabwriter.NewWriter(cl.stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintf(tw, "ID\t%s\n", res.ID)
		fmt.Fprintf(tw, "TOKEN\t%s\n", res.Token)
		fmt.Fprintf(tw, "POOL\t%s/%s/%s\n", res.Template, res.Net, res.Size)
		fmt.Fprintf(tw, "TIER\t%s\n", res.Tier)
		fmt.Fprintf(tw, "VM\t%s\n", res.VM)
		fmt.Fprintf(tw, "DEADLINE\t%s (in %s; sbxctl renew %s --ttl 1h extends it)\n", shortTime(res.Deadline), untilDeadline(res.Deadline, timeNow()), res.ID)
		fmt.Fprintf(tw, "OWNER\t%s\n", res.OwnerAddr)
		return tw.Flush()
	}
}

// lifecycleFlags builds hibernate and wake: they return once the sandbox
// reached its new state (the server waits for it); with --no-wait once the
// request is durable, printing the state then; --wait then polls until the
// new state. release is teardown.go's.
func lifecycleFlags(action string) func(fs *flag.FlagSet) remoteBody {
	target := map[string]string{"hibernate": "hibernated", "wake": "running"}[action]
	return func(fs *flag.FlagSet) remoteBody {
		noWait := fs.Bool("no-wait", false, "return once the request is durable, not once the sandbox is "+target)
		wait := fs.Bool("wait", false, "poll until the sandbox is "+target+" (what the call does by itself, unless --no-wait)")
		return func(ctx context.Context, c *apiclient.Client, cl *call) error {
			id := cl.args[0]
			var err error
			state := target
			switch {
			case *noWait && action == "hibernate":
				state, err = c.HibernateNoWait(ctx, id)
			case *noWait:
				state, err = c.WakeNoWait(ctx, id)
			case action == "hibernate":
				err = c.Hibernate(ctx, id)
			default:
				err = c.Wake(ctx, id)
			}
			if err != nil {
				return err
			}
			if *wait {
				sb, err := waitState(ctx, c, id, target)
				if err != nil {
					return err
				}
				state = sb.State
			}
			if cl.json {
				return printJSON(cl.stdout, map[string]string{"id": id, "action": action, "state": state})
			}
			_, err = fmt.Fprintf(cl.stdout, "%s: %s\n", id, state)
			return err
		}
	}
}

// waitState polls the sandbox until it is in want; an ended claim, or one
// that fell back (a failed hibernate leaves it running), is an error.
func waitState(ctx context.Context, c *apiclient.Client, id, want string) (*api.Sandbox, error) {
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		sb, err := c.Sandbox(ctx, id)
		if err != nil {
			return nil, err
		}
		switch sb.State {
		case want:
			return sb, nil
		case "hibernating", "waking", "pending":
		default:
			return sb, fmt.Errorf("sandbox %s is %s, not %s%s", id, sb.State, want, reasonSuffix(sb.Reason))
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for %s to be %s (still %s): %w", id, want, sb.State, ctx.Err())
		case <-t.C:
		}
	}
}

func reasonSuffix(r string) string {
	if r == "" {
		return ""
	}
	return " (" + r + ")"
}

func renewFlags(fs *flag.FlagSet) remoteBody {
	var ttl secondsFlag
	fs.Var(&ttl, "ttl", "new time to live from now: a duration (10m) or seconds (required)")
	return func(ctx context.Context, c *apiclient.Client, cl *call) error {
		if !ttl.set {
			return usagef("--ttl is required")
		}
		id := cl.args[0]
		dl, err := c.Renew(ctx, id, ttl.n)
		if err != nil {
			return err
		}
		ds := dl.UTC().Format(time.RFC3339Nano)
		if cl.json {
			return printJSON(cl.stdout, map[string]string{"id": id, "deadline": ds})
		}
		_, err = fmt.Fprintf(cl.stdout, "%s: deadline %s\n", id, shortTime(ds))
		return err
	}
}

func previewFlags(fs *flag.FlagSet) remoteBody {
	port := fs.Int("port", 0, "guest TCP port the URL reaches (required)")
	var ttl secondsFlag
	fs.Var(&ttl, "ttl", "how long the URL works: a duration (10m) or seconds (default 1h; never past the claim's deadline)")
	return func(ctx context.Context, c *apiclient.Client, cl *call) error {
		if *port < 1 || *port > 65535 {
			return usagef("--port 1-65535 is required")
		}
		res, err := c.Preview(ctx, cl.args[0], api.PreviewRequest{Port: *port, TTLSeconds: int64(ttl.n)})
		if err != nil {
			return err
		}
		if cl.json {
			return printJSON(cl.stdout, res)
		}
		_, err = fmt.Fprintf(cl.stdout, "%s\t(until %s)\n", res.URL, shortTime(res.ExpiresAt))
		return err
	}
}

func lsFlags(fs *flag.FlagSet) remoteBody {
	ref := fs.String("ref", "", "only sandboxes with this claim_ref")
	var meta kvFlag
	fs.Var(&meta, "meta", "only sandboxes with metadata key=value (repeatable: all must match)")
	state := fs.String("state", "", "only sandboxes in this state (e.g. running, hibernated, released, expired), or all (ended ones are kept an hour); default: the live ones")
	tenant := fs.String("tenant", "", "only this tenant's sandboxes (root token)")
	return func(ctx context.Context, c *apiclient.Client, cl *call) error {
		out, err := c.Sandboxes(ctx, apiclient.ListOptions{ClaimRef: *ref, Metadata: meta.m, State: *state, Tenant: *tenant})
		if err != nil {
			return err
		}
		return printTable(cl, map[string]any{"sandboxes": out}, "ID\tSTATE\tPOOL\tTIER\tTENANT\tREF\tMETADATA\tEXPIRES IN", func(tw io.Writer) {
			now := timeNow()
			for _, sb := range out {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", sb.ID, sb.State, sb.Key, sb.Tier,
					orDash(sb.Tenant), orDash(sb.ClaimRef), orDash(metaString(sb.Metadata)), expiresIn(sb, now))
			}
		})
	}
}

// timeNow is the clock "expires in" is counted on (tests replace it).
var timeNow = time.Now

// expiresIn is how long a live sandbox has left, to the second; an ended
// one shows "-".
func expiresIn(sb api.Sandbox, now time.Time) string {
	if endedState(sb.State) {
		return "-"
	}
	return untilDeadline(sb.Deadline, now)
}

// untilDeadline renders the time from now to an RFC 3339 deadline ("4m12s";
// "overdue" once past it, until the node ends the claim).
func untilDeadline(deadline string, now time.Time) string {
	t, err := time.Parse(time.RFC3339Nano, deadline)
	if err != nil {
		return "-"
	}
	d := t.Sub(now).Truncate(time.Second)
	if d <= 0 {
		return "overdue"
	}
	return d.String()
}

func metaString(m map[string]string) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var f kvFlag
	for _, k := range keys {
		_ = f.Set(k + "=" + m[k])
	}
	return f.String()
}
