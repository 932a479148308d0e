package apiclient_test

import (
	"testing"

	"github.com/sbxlog/sbxlog/fsm/egress"
	"github.com/sbxlog/sbxlog/projections/api"
	"github.com/sbxlog/sbxlog/projections/apiclient"
)

func TestEnvAndEgressClasses(t *testing.T) {
	_, c := startNode(t, 1)
	ctx := ctxT(t)
	if err := c.PutEgressClass(ctx, "desk", api.PolicyJSON{Allow: []egress.Rule{{Host: "*.example.com"}}}); err != nil {
		t.Fatal(err)
	}
	cls, err := c.EgressClasses(ctx)
	if err != nil || len(cls) != 1 || cls[0].Name != "desk" || cls[0].Egress.Allow[0].Host != "*.example.com" {
		t.Fatalf("classes %+v, %v", cls, err)
	}
	if err := c.DeleteEgressClass(ctx, "desk"); err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteEgressClass(ctx, "desk"); apiclient.StatusOf(err) != 404 {
		t.Fatalf("second delete: %v", err)
	}

	sb, err := c.Claim(ctx, api.ClaimRequest{Template: "default"})
	if err != nil {
		t.Fatal(err)
	}
	f := false
	if err := c.SetEnv(ctx, sb.ID, map[string]*api.EnvVar{"MODE": {Value: "m"}, "KEY": {Value: "k", Guest: &f}}); err != nil {
		t.Fatal(err)
	}
	if err := c.PatchEnv(ctx, sb.ID, map[string]*api.EnvVar{"MODE": nil, "REGION": {Value: "eu"}}); err != nil {
		t.Fatal(err)
	}
	env, err := c.Env(ctx, sb.ID)
	if err != nil || len(env) != 2 || env["REGION"].Value != "eu" || env["KEY"].Value != "" || env["KEY"].Guest == nil || *env["KEY"].Guest {
		t.Fatalf("env %+v, %v", env, err)
	}
	if err := c.SetEnv(ctx, sb.ID, nil); err != nil {
		t.Fatal(err)
	}
	if env, err := c.Env(ctx, sb.ID); err != nil || len(env) != 0 {
		t.Fatalf("cleared env %+v, %v", env, err)
	}
}
