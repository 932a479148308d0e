package e2e

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sbxlog/sbxlog/projections/api"
	"github.com/sbxlog/sbxlog/projections/apiclient"
)

// listStore lists the snapshot dirs in a data dir's store (relative to it,
// one level under each of its directories) and its top-level temp entries.
func listStore(t *testing.T, data string) (snaps, temps []string) {
	t.Helper()
	store := filepath.Join(data, "store")
	ents, err := os.ReadDir(store)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if !e.IsDir() || strings.HasPrefix(e.Name(), ".") {
			temps = append(temps, e.Name())
			continue
		}
		sub, err := os.ReadDir(filepath.Join(store, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range sub {
			snaps = append(snaps, e.Name()+"/"+s.Name())
		}
	}
	slices.Sort(snaps)
	return snaps, temps
}

// awaitInfo polls GET /v1/info until ok says yes.
func awaitInfo(t *testing.T, ctx context.Context, c *apiclient.Client, what string, ok func(*api.Info) bool) {
	t.Helper()
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		in, err := c.Info(ctx)
		if err == nil && ok(in) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 60 s (last %+v, %v)", what, in, err)
		}
	}
}

func poolReady(in *api.Info, template string, warm int) bool {
	for _, p := range in.Pools {
		if p.Key.Template == template {
			return p.Golden && p.Warm >= warm && p.Refilling == 0
		}
	}
	return false
}

// Acceptance 3 of issue 24, on chsim through sandboxd: drain a pool, rebuild
// another's golden, promote a sandbox to a template and delete it; once the
// collections ran, the store holds exactly the snapshot dirs the state
// references (GET /v1/store), and no temp or trash entry.
func TestStoreRefs(t *testing.T) {
	n := startChsimNode(t, "e2e-root-token")
	c := n.c
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	if _, err := c.SetPools(ctx, api.PoolsRequest{Pools: []api.PoolSpec{{Template: "e2e-a", Warm: 1}, {Template: "e2e-b", Warm: 1}}}); err != nil {
		t.Fatalf("PUT pools: %v", err)
	}
	awaitInfo(t, ctx, c, "both pools warm", func(in *api.Info) bool { return poolReady(in, "e2e-a", 1) && poolReady(in, "e2e-b", 1) })
	claim := func(tpl string) *api.ClaimResponse {
		t.Helper()
		cr, err := c.Claim(ctx, api.ClaimRequest{Template: tpl})
		if err != nil {
			t.Fatalf("claim %s: %v", tpl, err)
		}
		return cr
	}
	a, b := claim("e2e-a"), claim("e2e-b")
	if err := c.Hibernate(ctx, b.ID); err != nil {
		t.Fatalf("hibernate: %v", err)
	}
	// Promote a (running) into a template and claim from it.
	pr, err := c.Promote(ctx, a.ID, a.Token, "e2e-t")
	if err != nil {
		t.Fatalf("promote: %v", err)
	}
	tc := claim("e2e-t")
	before, err := c.Store(ctx)
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]int{}
	for _, s := range before.Snapshots {
		kinds[s.Kind]++
	}
	if kinds["golden"] != 2 || kinds["template"] != 1 || kinds["hibernate"] != 1 {
		t.Fatalf("referenced snapshots before: %+v", before.Snapshots)
	}

	// Drain e2e-a (its warm VM destroyed, its claim released: the record
	// goes, and its golden with it); rebuild e2e-b's golden (the old one
	// waits for the warm clone that maps it, claimed and released here);
	// delete the template (its claim released).
	if _, err := c.SetPools(ctx, api.PoolsRequest{Pools: []api.PoolSpec{{Template: "e2e-b", Warm: 1}}}); err != nil {
		t.Fatalf("PUT pools: %v", err)
	}
	if err := c.RebuildGolden(ctx, api.TemplateKey{Template: "e2e-b"}); err != nil {
		t.Fatalf("rebuild: %v", err)
	}
	awaitInfo(t, ctx, c, "the rebuilt golden", func(in *api.Info) bool { return poolReady(in, "e2e-b", 1) })
	for _, id := range []string{a.ID, tc.ID} {
		if err := c.Release(ctx, id); err != nil {
			t.Fatalf("release %s: %v", id, err)
		}
	}
	if err := c.DeleteTemplate(ctx, pr.Key, pr.ContentDigest); err != nil {
		t.Fatalf("delete template: %v", err)
	}
	// The warm VM cloned from the old golden, claimed and released.
	old := claim("e2e-b")
	if err := c.Release(ctx, old.ID); err != nil {
		t.Fatal(err)
	}

	// After collection: exactly the referenced dirs, nothing else.
	var refs []string
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		st, err := c.Store(ctx)
		if err != nil {
			t.Fatal(err)
		}
		refs = refs[:0]
		retired := 0
		for _, s := range st.Snapshots {
			refs = append(refs, s.Dir)
			if s.Kind == "retired" {
				retired++
			}
		}
		snaps, temps := listStore(t, n.data)
		if retired == 0 && slices.Equal(snaps, refs) && len(temps) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the store holds %v (temps %v), the state references %+v", snaps, temps, st.Snapshots)
		}
	}
	if len(refs) != 2 {
		t.Fatalf("left: %v, want e2e-b's new golden and b's hibernate image", refs)
	}
	for _, s := range before.Snapshots {
		if s.Kind != "hibernate" && slices.Contains(refs, s.Dir) {
			t.Fatalf("%s (%s %s) outlived its owner", s.Dir, s.Kind, s.Owner)
		}
	}
}
