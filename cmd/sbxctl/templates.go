package main

import (
	"context"
	"flag"
	"fmt"
	"io"

	"github.com/sbxlog/sbxlog/projections/api"
	"github.com/sbxlog/sbxlog/projections/apiclient"
)

// promote and templates: a sandbox made a template, and the node's
// templates listed (GET /v1/templates), deleted and labelled.

func init() {
	register("promote", command{summary: "make a sandbox a template (--template NAME; --sandbox-token, or root acts by id)", examples: `sbxctl promote sb_0123456789abcdef --template py-warm   # claim it later with --template py-warm
sbxctl promote sb_0123456789abcdef --template py-warm --sandbox-token "$SB_TOKEN"   # a tenant's proof`, run: remoteCommand(remoteSpec{name: "promote", args: []string{"ID"}, flags: promoteFlags})})
	ls := command{summary: "list the templates you may claim here: configured pools, the hypervisor's images, promoted templates", examples: `sbxctl templates                                # every template, with its kind (configured, image, promoted)
sbxctl templates ls --json`, run: remoteCommand(remoteSpec{name: "templates ls", flags: templatesLsFlags})}
	register("templates", ls)
	register("templates ls", ls)
	register("templates rm", command{summary: "delete a promoted template (--template; --net, --size, --digest)", examples: `sbxctl templates rm --template py-warm
sbxctl templates rm --template py-warm --net egress --size large --digest sha256:...`, run: remoteCommand(remoteSpec{name: "templates rm", flags: templatesRmFlags})})
	register("templates labels", command{summary: "replace a template's labels (--template, --label k=v repeatable; none clears)", examples: `sbxctl templates labels --template py-warm --label team=a --label tier=gold
sbxctl templates labels --template py-warm      # no --label: clears them`, run: remoteCommand(remoteSpec{name: "templates labels", flags: templatesLabelsFlags})})
	register("store", command{summary: "list the snapshot dirs the state references, with their owners (root)", examples: `sbxctl store                                    # every snapshot dir and its owner (root)`, run: remoteCommand(remoteSpec{name: "store", flags: storeFlags})})
}

func promoteFlags(fs *flag.FlagSet) remoteBody {
	name := fs.String("template", "", "the template name (required)")
	sbTok := fs.String("sandbox-token", "", "the sandbox's own token, the ownership proof a tenant token needs (root may act by id)")
	return func(ctx context.Context, c *apiclient.Client, cl *call) error {
		if *name == "" {
			return usagef("--template is required")
		}
		// The sandbox's token goes in the body, as the old SDKs send it.
		res, err := c.Promote(ctx, cl.args[0], *sbTok, *name)
		if err != nil {
			return err
		}
		if cl.json {
			return printJSON(cl.stdout, res)
		}
		_, err = fmt.Fprintf(cl.stdout, "%s/%s/%s\t%s\n", res.Key.Template, res.Key.Net, res.Key.Size, res.ContentDigest)
		return err
	}
}

// keyFlags are a template's key as flags (net and size default like a
// claim's on the server).
func keyFlags(fs *flag.FlagSet) func() (api.TemplateKey, error) {
	name := fs.String("template", "", "the template name (required)")
	net := fs.String("net", "", "its net (default none)")
	size := fs.String("size", "", "its size (default small)")
	return func() (api.TemplateKey, error) {
		if *name == "" {
			return api.TemplateKey{}, usagef("--template is required")
		}
		return api.TemplateKey{Template: *name, Net: *net, Size: *size}, nil
	}
}

// templatesLsFlags lists GET /v1/templates: an image has no net or size
// of its own (any is claimed), shown as "*".
func templatesLsFlags(*flag.FlagSet) remoteBody {
	return func(ctx context.Context, c *apiclient.Client, cl *call) error {
		ts, err := c.Templates(ctx)
		if err != nil {
			return err
		}
		return printTable(cl, api.TemplatesResponse{Templates: ts}, "TEMPLATE\tKIND\tNET\tSIZE\tTENANT\tDIGEST\tLABELS", func(tw io.Writer) {
			for _, t := range ts {
				net, size := t.Net, t.Size
				if t.Kind == api.TemplateImage {
					net, size = "*", "*"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", t.Template, t.Kind, net, size, orDash(t.Tenant), orDash(t.ContentDigest), orDash(metaString(t.Labels)))
			}
		})
	}
}

func templatesRmFlags(fs *flag.FlagSet) remoteBody {
	key := keyFlags(fs)
	digest := fs.String("digest", "", "delete only while the template has this content digest")
	return func(ctx context.Context, c *apiclient.Client, cl *call) error {
		k, err := key()
		if err != nil {
			return err
		}
		if err := c.DeleteTemplate(ctx, k, *digest); err != nil {
			return err
		}
		_, err = fmt.Fprintf(cl.stdout, "%s: deleted\n", k.Template)
		return err
	}
}

func templatesLabelsFlags(fs *flag.FlagSet) remoteBody {
	key := keyFlags(fs)
	digest := fs.String("digest", "", "write only while the template has this content digest")
	var labels kvFlag
	fs.Var(&labels, "label", "a label key=value (repeatable; none clears the labels)")
	return func(ctx context.Context, c *apiclient.Client, cl *call) error {
		k, err := key()
		if err != nil {
			return err
		}
		if err := c.SetTemplateLabels(ctx, k, labels.m, *digest); err != nil {
			return err
		}
		_, err = fmt.Fprintf(cl.stdout, "%s: %d labels\n", k.Template, len(labels.m))
		return err
	}
}

func storeFlags(*flag.FlagSet) remoteBody {
	return func(ctx context.Context, c *apiclient.Client, cl *call) error {
		st, err := c.Store(ctx)
		if err != nil {
			return err
		}
		return printTable(cl, st, "DIR\tKIND\tOWNER\tMAPPERS", func(tw io.Writer) {
			for _, s := range st.Snapshots {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%d\n", s.Dir, s.Kind, s.Owner, s.Mappers)
			}
		})
	}
}
