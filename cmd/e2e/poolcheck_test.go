package e2e

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sbxlog/sbxlog/executors/guest/guesttest"
	"github.com/sbxlog/sbxlog/projections/api"
	"github.com/sbxlog/sbxlog/projections/apiclient"
)

// What a node cannot serve is a 4xx naming it at once, on the built
// sandboxd and every hypervisor, with no event appended and no pool left
// behind (issue 22 defect 4, issue 25): a template that does not exist
// (chsim cold-booted it and answered 500 provisioning failed; QEMU booted
// its one guest under any name and left a phantom pool) and an egress key
// on a node with no bridge (a late 500). The 404 names the templates
// there are, as GET /v1/templates lists them. No VM is booted: the refusals
// come before anything is proposed, so QEMU needs no guest image here.
func TestUnservableKeysRefusedAtOnce(t *testing.T) {
	for _, hv := range []string{"chsim", "qemu"} {
		t.Run(hv, func(t *testing.T) {
			cfg := map[string]any{"hypervisor": hv, "pools": []any{}, "nats": map[string]any{"disabled": true}}
			if hv == "qemu" {
				if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
					if guesttest.Required() {
						t.Fatalf("qemu-system-x86_64 not found (required: %s=1)", guesttest.RequireEnv)
					}
					t.Skip("qemu-system-x86_64 not found")
				}
				cfg["qemu"] = map[string]any{"accel": "tcg"}
			}
			dir := shortTempDir(t, "pc")
			data := filepath.Join(dir, "data")
			addr := freeAddr(t)
			cfg["listen"], cfg["data_dir"], cfg["node_id"], cfg["api_token"] = addr, data, "e2e", "pc-root"
			path := filepath.Join(dir, "sandboxd.json")
			writeJSON(t, path, cfg)
			if hv == "chsim" {
				// A template of the data dir's own (chsim makes up only a
				// configured pool's, and this node has none).
				if err := os.MkdirAll(filepath.Join(data, "templates", "mine"), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(data, "templates", "mine", "config.json"), []byte("{}"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			startDaemon(t, dir, data, addr, "-config", path)
			c, err := apiclient.New(addr, "pc-root", nil)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			before, err := c.Info(ctx)
			if err != nil {
				t.Fatal(err)
			}
			// What exists is listed (the driver's images: chsim's template
			// dir, QEMU's table) and named by the 404.
			listed, err := c.Templates(ctx)
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, e := range listed {
				if e.Kind != api.TemplateImage {
					t.Errorf("listed %+v: this node has no pools nor promoted templates", e)
				}
				names = append(names, e.Template)
			}
			if !slices.Contains(names, map[string]string{"chsim": "mine", "qemu": "default"}[hv]) {
				t.Errorf("GET /v1/templates: %+v", listed)
			}
			unknownNope := "unknown template nope; templates here: " + strings.Join(names, ", ") + " (sbxctl templates, GET /v1/templates)"
			// Both drivers run egress pools where a bridge is configured,
			// and refuse them alike where none is.
			egressMsg := "needs a bridge"
			for _, tc := range []struct {
				name   string
				call   func() error
				status int
				msg    string
			}{
				{"claim of an unknown template", func() error {
					_, err := c.Claim(ctx, api.ClaimRequest{Template: "nope"})
					return err
				}, 404, unknownNope},
				{"claim of an egress key", func() error {
					_, err := c.Claim(ctx, api.ClaimRequest{Template: "default", Net: "egress"})
					return err
				}, 409, egressMsg},
				{"egress pool", func() error {
					_, err := c.SetPools(ctx, api.PoolsRequest{Pools: []api.PoolSpec{{Template: "default", Net: "egress", Size: "small", Warm: 1}}})
					return err
				}, 409, egressMsg},
			} {
				err := tc.call()
				var e *apiclient.Error
				if !errors.As(err, &e) || e.Status != tc.status || !strings.Contains(e.Message, tc.msg) {
					t.Errorf("%s: %v, want %d containing %q", tc.name, err, tc.status, tc.msg)
				}
			}
			if hv == "qemu" {
				// Every template boots the one guest: what exists is what
				// qemu.templates names ("default" by default).
				_, err := c.SetPools(ctx, api.PoolsRequest{Pools: []api.PoolSpec{{Template: "nope", Net: "none", Size: "small", Warm: 1}}})
				var e *apiclient.Error
				if !errors.As(err, &e) || e.Status != 404 || e.Message != unknownNope {
					t.Errorf("pool of an unknown template: %v, want 404 %s", err, unknownNope)
				}
			}
			after, err := c.Info(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if after.LogSeq != before.LogSeq || len(after.Pools) != 0 || after.Live != 0 || after.Pending != 0 {
				t.Fatalf("after the refusals: log %d -> %d, pools %+v, live %d, pending %d: want nothing recorded",
					before.LogSeq, after.LogSeq, after.Pools, after.Live, after.Pending)
			}
		})
	}
}
