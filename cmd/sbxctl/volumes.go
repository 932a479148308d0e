package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/sbxlog/sbxlog/projections/api"
	"github.com/sbxlog/sbxlog/projections/apiclient"
)

// volumes list, attach and detach: the catalog (the caller's share of it)
// and a running sandbox's read-only volumes (GET /v1/volumes, POST
// /v1/sandboxes/{id}/volumes/attach|detach).

func init() {
	register("volumes list", command{summary: "list the volume catalog entries the token may use", examples: `sbxctl volumes list                             # the catalog volumes your token may use`, run: remoteCommand(remoteSpec{name: "volumes list", flags: volumesListFlags})})
	register("volumes attach", command{summary: "attach read-only volumes to a running sandbox: ID NAME[:MOUNT]...", examples: `sbxctl volumes attach sb_0123456789abcdef weights:/models   # mounted read-only at /models
sbxctl volumes attach sb_0123456789abcdef data  # at /volumes/data`, run: remoteCommand(remoteSpec{name: "volumes attach", args: []string{"ID", "NAME[:MOUNT]"}, rest: "NAME[:MOUNT]...", flags: volumesAttachFlags})})
	register("volumes detach", command{summary: "unmount and detach a sandbox's read-only volumes: ID NAME...", examples: `sbxctl volumes detach sb_0123456789abcdef weights`, run: remoteCommand(remoteSpec{name: "volumes detach", args: []string{"ID", "NAME"}, rest: "NAME...", flags: volumesDetachFlags})})
}

func volumesListFlags(*flag.FlagSet) remoteBody {
	return func(ctx context.Context, c *apiclient.Client, cl *call) error {
		vs, err := c.Volumes(ctx)
		if err != nil {
			return err
		}
		return printTable(cl, map[string][]api.VolumeInfo{"volumes": vs}, "NAME\tDEFAULT MOUNT\tSIZE\tAVAILABLE\tWRITABLE", func(tw io.Writer) {
			for _, v := range vs {
				fmt.Fprintf(tw, "%s\t%s\t%d\t%v\t%v\n", v.Name, v.DefaultMount, v.SizeBytes, v.Available, v.Writable)
			}
		})
	}
}

func volumesAttachFlags(*flag.FlagSet) remoteBody {
	return func(ctx context.Context, c *apiclient.Client, cl *call) error {
		var vs []api.VolumeJSON
		for _, a := range cl.args[1:] {
			name, mount, _ := strings.Cut(a, ":")
			vs = append(vs, api.VolumeJSON{Name: name, Mount: mount})
		}
		set, err := c.AttachVolumes(ctx, cl.args[0], vs)
		if err != nil {
			return err
		}
		return printVolumes(cl, cl.args[0], set)
	}
}

func volumesDetachFlags(*flag.FlagSet) remoteBody {
	return func(ctx context.Context, c *apiclient.Client, cl *call) error {
		set, err := c.DetachVolumes(ctx, cl.args[0], cl.args[1:])
		if err != nil {
			return err
		}
		return printVolumes(cl, cl.args[0], set)
	}
}

// printVolumes prints a sandbox's volumes after an attach or detach.
func printVolumes(cl *call, id string, vs []api.VolumeJSON) error {
	if cl.json {
		return printJSON(cl.stdout, api.SandboxVolumes{Volumes: vs})
	}
	for _, v := range vs {
		mode := "ro"
		if v.Mode == "rw" {
			mode = "rw"
		}
		mount := v.Mount
		if mount == "" {
			mount = "(attach only)"
		}
		if _, err := fmt.Fprintf(cl.stdout, "%s %s %s %s\n", id, v.Name, mount, mode); err != nil {
			return err
		}
	}
	return nil
}
