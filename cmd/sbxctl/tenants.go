package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"strings"

	"github.com/sbxlog/sbxlog/projections/api"
	"github.com/sbxlog/sbxlog/projections/apiclient"
)

// The tenant commands take the root token. A tenant's token is sent once,
// hashed by the node and never shown again: tenants put --generate mints
// one and prints it, the only time it is seen.

func init() {
	ls := command{summary: "list the tenant set (--after, --limit)", examples: "sbxctl tenants\nsbxctl tenants ls --json", run: remoteCommand(remoteSpec{name: "tenants", flags: tenantsLsFlags})}
	register("tenants", ls)
	register("tenants ls", ls)
	register("tenants put", command{summary: "create or change a tenant (--tenant-token, --generate, --max-claims)", examples: `sbxctl tenants put acme --generate --max-claims 10`, run: remoteCommand(remoteSpec{name: "tenants put", args: []string{"NAME"}, flags: tenantsPutFlags})})
	register("tenants set", command{summary: "replace the whole tenant set from --file", examples: `sbxctl tenants set --file tenants.json`, run: remoteCommand(remoteSpec{name: "tenants set", flags: tenantsSetFlags})})
	register("tenants rm", command{summary: "remove a tenant (its token stops at once; its claims run on)", examples: `sbxctl tenants rm acme`, run: remoteCommand(remoteSpec{name: "tenants rm", args: []string{"NAME"}, flags: tenantsRmFlags})})
}

func tenantsLsFlags(fs *flag.FlagSet) remoteBody {
	after := fs.String("after", "", "start after this name (a previous page's next)")
	limit := fs.Int("limit", 0, "at most this many tenants (1 to 10000; default the node's, 1000)")
	return func(ctx context.Context, c *apiclient.Client, cl *call) error {
		l, err := c.Tenants(ctx, apiclient.TenantPage{After: *after, Limit: *limit})
		if err != nil {
			return err
		}
		return printTenants(cl, l)
	}
}

func printTenants(cl *call, l *api.TenantList) error {
	if cl.json {
		return printJSON(cl.stdout, l)
	}
	tw := newTable(cl.stdout, "NAME\tMAX_CLAIMS\tEGRESS_CLASS\tCLAIMS\tFLAGS")
	for _, t := range l.Tenants {
		maxClaims, flags := "-", "-"
		if t.MaxClaims > 0 {
			maxClaims = fmt.Sprint(t.MaxClaims)
		}
		if t.Removed {
			flags = "removed"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\n", t.Name, maxClaims, orDash(t.EgressClass), t.Claims, flags)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(cl.stdout, "digest %s\n", l.Digest)
	if l.Next != "" {
		fmt.Fprintf(cl.stdout, "more: sbxctl tenants --after %s\n", l.Next)
	}
	return nil
}

// tenantsPutFlags: like PUT /v1/tenants/{name}, a token left out keeps
// the stored one, and --max-claims and --egress-class are set to what is
// given (left out: none).
func tenantsPutFlags(fs *flag.FlagSet) remoteBody {
	token := fs.String("tenant-token", "", "the tenant's token (visible in ps; prefer --tenant-token-file or --generate)")
	tokenFile := fs.String("tenant-token-file", "", "read the tenant's token from the first line of this file; - reads stdin")
	generate := fs.Bool("generate", false, "mint a random token, set it and print it (it is shown only this once)")
	maxClaims := fs.Int("max-claims", 0, "cap on the tenant's live claims (0: none)")
	class := fs.String("egress-class", "", "the tenant's egress class")
	return func(ctx context.Context, c *apiclient.Client, cl *call) error {
		set := 0
		for _, on := range []bool{*token != "", *tokenFile != "", *generate} {
			if on {
				set++
			}
		}
		if set > 1 {
			return usagef("--tenant-token, --tenant-token-file and --generate exclude each other")
		}
		req := api.TenantRequest{Token: *token, MaxClaims: *maxClaims, EgressClass: *class}
		switch {
		case *tokenFile != "":
			t, err := readTenantToken(*tokenFile)
			if err != nil {
				return err
			}
			req.Token = t
		case *generate:
			var b [24]byte
			if _, err := rand.Read(b[:]); err != nil {
				return err
			}
			req.Token = "sbxt_" + hex.EncodeToString(b[:])
		}
		if err := c.PutTenant(ctx, cl.args[0], req); err != nil {
			return err
		}
		switch {
		case *generate && cl.json:
			return printJSON(cl.stdout, map[string]string{"name": cl.args[0], "token": req.Token})
		case *generate:
			fmt.Fprintf(cl.stdout, "tenant %s: token %s (shown only now)\n", cl.args[0], req.Token)
		case !cl.json:
			fmt.Fprintf(cl.stdout, "tenant %s put\n", cl.args[0])
		}
		return nil
	}
}

func readTenantToken(path string) (string, error) {
	data, err := readFileArg(path)
	if err != nil {
		return "", err
	}
	tok, _, _ := strings.Cut(string(data), "\n")
	if tok = strings.TrimSpace(tok); tok == "" {
		return "", fmt.Errorf("tenant token file %s is empty", path)
	}
	return tok, nil
}

func tenantsSetFlags(fs *flag.FlagSet) remoteBody {
	file := fs.String("file", "", `JSON file {"tenants": [{"name": ..., "token": ..., "max_claims": N}, ...]} replacing the whole set (an entry without token keeps the stored one); - reads stdin`)
	return func(ctx context.Context, c *apiclient.Client, cl *call) error {
		if *file == "" {
			return usagef("--file is required")
		}
		var req api.TenantsRequest
		if err := decodeFileArg(*file, &req); err != nil {
			return fmt.Errorf("%s: %w (want {\"tenants\": [{\"name\": ..., \"token\": ...}, ...]})", *file, err)
		}
		if req.Tenants == nil {
			return fmt.Errorf("%s: no \"tenants\" list (an empty list removes every tenant)", *file)
		}
		l, err := c.SetTenants(ctx, req)
		if err != nil {
			return err
		}
		return printTenants(cl, l)
	}
}

func tenantsRmFlags(*flag.FlagSet) remoteBody {
	return func(ctx context.Context, c *apiclient.Client, cl *call) error {
		if err := c.DeleteTenant(ctx, cl.args[0]); err != nil {
			return err
		}
		if !cl.json {
			fmt.Fprintf(cl.stdout, "tenant %s removed\n", cl.args[0])
		}
		return nil
	}
}
