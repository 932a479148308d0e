package campaign

// The end checks of the store recipes (snapshots.go), each failure a
// Violation:
//   - every acked checkpoint no delete may have removed is listed, and one
//     an acked delete removed is not; listed ones are claimable and their
//     clones hold the checkpoint's data;
//   - every acked promote's template (no delete sent) survives to the end,
//     every acked delete's is gone;
//   - a fork is all or none: its children were all served, or every one
//     of them ended;
//   - after collection the store holds exactly the snapshot dirs the state
//     references (GET /v1/store), with no temp or trash entry left: no half
//     snapshot;
//   - the archive store holds one archive per archived VM and nothing
//     else (no half archive), and an archived claim's archive holds the
//     content its hibernate stored.

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/sbxlog/sbxlog/projections/api"
	"github.com/sbxlog/sbxlog/projections/apiclient"
)

// archiveDir is daemon a's archive store.
func (c *campaign) archiveDir() string { return filepath.Join(c.opt.Dir, "archive") }

// archivesOf lists the complete archives of vm in the archive store.
func (c *campaign) archivesOf(vm string) []string {
	found, _ := filepath.Glob(filepath.Join(c.archiveDir(), "*", vm+"-*", "MANIFEST.json"))
	for i, f := range found {
		found[i] = filepath.Dir(f)
	}
	return found
}

// archivedClaims are the claims the log shows archived at least once: the
// archive sets their deadline anew (the pool's archive_delete_after), and a
// wake from it grants a fresh lease.
func archivedClaims(log []logEvent) map[string]bool {
	out := map[string]bool{}
	for _, ev := range log {
		if ev.Type == "archived" {
			out[ev.Aggregate.ID] = true
		}
	}
	return out
}

// checkStoreRecipes runs the end checks of the store recipes.
func (c *campaign) checkStoreRecipes(ctx context.Context, cl *apiclient.Client, log []logEvent) {
	for _, ev := range log {
		switch ev.Type {
		case "archived", "unarchived", "archive_failed", "unarchive_failed":
			c.checked("archive events in the log: "+ev.Type, 1)
		}
	}
	c.checkForks(log)
	c.checkTemplates(ctx, cl)
	c.checkStore(ctx, cl)
	c.checkArchives(ctx, cl)
	// Last: it claims.
	c.checkCheckpoints(ctx, cl)
}

// checkForks: every fork's children were all served, or all ended.
func (c *campaign) checkForks(log []logEvent) {
	children := map[string][]string{} // fork -> children
	served, ended := map[string]bool{}, map[string]bool{}
	for _, ev := range log {
		switch ev.Type {
		case "claim_created":
			var p struct {
				Claim string `json:"claim"`
				Fork  string `json:"fork"`
			}
			if json.Unmarshal(ev.Payload, &p) == nil && p.Fork != "" {
				children[p.Fork] = append(children[p.Fork], p.Claim)
			}
		case "claim_served":
			served[ev.Aggregate.ID] = true
		case "claim_failed", "claim_released", "claim_expired":
			ended[ev.Aggregate.ID] = true
		}
	}
	whole, none := 0, 0
	for fork, kids := range children {
		n, e := 0, 0
		for _, k := range kids {
			if served[k] {
				n++
			}
			if ended[k] {
				e++
			}
		}
		switch {
		case n == len(kids):
			whole++
		case e == len(kids):
			none++
		default:
			c.violate("fork %s: %d of its %d children served and %d ended: neither all nor none", fork, n, len(kids), e)
		}
	}
	c.checked("forks with every child served", whole)
	c.checked("forks with every child ended (none ran on)", none)
}

// checkTemplates: acked promotes survive every restart until deleted.
func (c *campaign) checkTemplates(ctx context.Context, cl *apiclient.Client) {
	in, err := cl.Info(ctx)
	if err != nil {
		c.violate("GET /v1/info: %v", err)
		return
	}
	have := map[string]bool{}
	for _, t := range in.Templates {
		have[t.Key.Template] = true
	}
	c.mu.Lock()
	tmpls := slices.Clone(c.tmpls)
	c.mu.Unlock()
	kept, deleted := 0, 0
	for _, t := range tmpls {
		if t.outcome != outAcked {
			continue
		}
		acked, maybe := gone(t.deletes)
		switch {
		case !maybe && !have[t.key.Template]:
			c.violate("acked promote's template %s is gone (never deleted)", t.key.Template)
		case acked && have[t.key.Template]:
			c.violate("template %s is listed after an acked delete", t.key.Template)
		case !maybe:
			kept++
		case acked:
			deleted++
		}
	}
	c.checked("promoted templates kept", kept)
	c.checked("promoted templates deleted", deleted)
}

// checkStore: after collection the store holds exactly what the state
// references, and no temp or trash entry.
func (c *campaign) checkStore(ctx context.Context, cl *apiclient.Client) {
	store := filepath.Join(c.a.DataDir, "store")
	var last string
	var refs int
	err := waitFor(ctx, time.Minute, func() bool {
		st, err := cl.Store(ctx)
		if err != nil {
			last = err.Error()
			return false
		}
		want := map[string]bool{}
		for _, s := range st.Snapshots {
			if s.Kind == "retired" && s.Mappers == 0 {
				last = fmt.Sprintf("retired %s not collected", s.Dir)
				return false
			}
			want[s.Dir] = true
		}
		refs = len(want)
		held, junk := storeEntries(store)
		if len(junk) > 0 {
			last = fmt.Sprintf("temp or trash entries left: %v", junk)
			return false
		}
		for _, h := range held {
			if !want[h] {
				last = fmt.Sprintf("%s is in the store, the state does not reference it", h)
				return false
			}
			delete(want, h)
		}
		if len(want) > 0 {
			last = fmt.Sprintf("the state references %v, not in the store", sortedKeys(want))
			return false
		}
		return true
	})
	if err != nil {
		c.violate("store a minute after quiescence: %s", last)
	}
	c.checked("store dirs, each referenced by the state", refs)
}

// storeEntries lists the store's snapshot dirs (kind/name) and its temp or
// trash entries (any dot entry).
func storeEntries(store string) (held, junk []string) {
	kinds, _ := os.ReadDir(store)
	for _, k := range kinds {
		if strings.HasPrefix(k.Name(), ".") || !k.IsDir() {
			junk = append(junk, k.Name())
			continue
		}
		ents, _ := os.ReadDir(filepath.Join(store, k.Name()))
		for _, e := range ents {
			rel := k.Name() + "/" + e.Name()
			if strings.HasPrefix(e.Name(), ".") {
				junk = append(junk, rel)
				continue
			}
			held = append(held, rel)
		}
	}
	return held, junk
}

// checkArchives: one complete archive per archived VM and nothing else in
// the instance's part of the archive store; an archived claim's archive
// holds what its hibernate stored. The alt pool's archive timer runs on
// after quiescence, so the VM view is read afresh until the two agree (a
// minute at most).
func (c *campaign) checkArchives(ctx context.Context, cl *apiclient.Client) {
	var problems []string
	var archived map[string]bool
	var per map[string][]string
	_ = waitFor(ctx, time.Minute, func() bool {
		vms, err := vmView(ctx, cl)
		if err != nil {
			problems = []string{fmt.Sprintf("VM view: %v", err)}
			return false
		}
		problems, archived, per = c.archiveProblems(vms)
		return len(problems) == 0
	})
	for _, p := range problems {
		c.violate("%s", p)
	}
	c.checked("archived VMs, one archive each", len(archived))
	// The content: what the hibernate of each archived claim stored.
	c.mu.Lock()
	var claims []*claim
	for _, x := range c.claims {
		if x.snap != nil && archived[x.vm] && len(per[x.vm]) == 1 {
			claims = append(claims, x)
		}
	}
	c.mu.Unlock()
	for _, x := range claims {
		dir := per[x.vm][0]
		s, err := sumsOf(dir, filepath.Join(dir, diskFile))
		if err != nil || s != *x.snap {
			c.violate("archived claim %s: archive %s does not hold what its hibernate stored (%v)", x.id, dir, err)
			continue
		}
		c.checked("archives holding their hibernate's content", 1)
	}
}

// archiveProblems compares the instance's archives with the VMs the view
// shows archived; it returns what disagrees, the archived VMs and their
// archives.
func (c *campaign) archiveProblems(vms []api.VM) (problems []string, archived map[string]bool, per map[string][]string) {
	root := filepath.Join(c.archiveDir(), c.instance())
	ents, _ := os.ReadDir(root)
	archived, per = map[string]bool{}, map[string][]string{}
	var names []string
	for _, v := range vms {
		names = append(names, v.Name)
		if v.State == "archived" {
			archived[v.Name] = true
		}
	}
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".") {
			problems = append(problems, fmt.Sprintf("archive store: temp entry %s left after the recovery (a half archive)", e.Name()))
			continue
		}
		vm := ""
		for _, n := range names {
			if strings.HasPrefix(e.Name(), n+"-") {
				vm = n
			}
		}
		if !archived[vm] {
			problems = append(problems, fmt.Sprintf("archive %s left in the archive store: its VM %q is not archived", e.Name(), vm))
			continue
		}
		if _, err := os.Stat(filepath.Join(root, e.Name(), "MANIFEST.json")); err != nil {
			problems = append(problems, fmt.Sprintf("archive %s has no manifest: %v", e.Name(), err))
		}
		per[vm] = append(per[vm], filepath.Join(root, e.Name()))
	}
	for vm := range archived {
		if len(per[vm]) != 1 {
			problems = append(problems, fmt.Sprintf("archived VM %s has %d archives: %v", vm, len(per[vm]), per[vm]))
		}
	}
	return problems, archived, per
}

// checkCheckpoints: acked checkpoints are listed until deleted, and
// claimable with their data.
func (c *campaign) checkCheckpoints(ctx context.Context, cl *apiclient.Client) {
	list, err := cl.Checkpoints(ctx)
	if err != nil {
		c.violate("GET /v1/checkpoints: %v", err)
		return
	}
	listed := map[string]bool{}
	for _, k := range list {
		listed[k.ID] = true
	}
	c.mu.Lock()
	ckpts := slices.Clone(c.ckpts)
	c.mu.Unlock()
	kept, deleted, claimed := 0, 0, 0
	for _, k := range ckpts {
		acked, maybe := gone(k.deletes)
		switch {
		case !maybe && !listed[k.id]:
			c.violate("acked checkpoint %s is not listed (never deleted)", k.id)
		case acked && listed[k.id]:
			c.violate("checkpoint %s is listed after an acked delete", k.id)
		case acked:
			deleted++
		case !maybe:
			kept++
			if claimed >= 2 {
				continue
			}
			claimed++
			cr, err := cl.ClaimCheckpoint(ctx, k.id, api.CheckpointClaimRequest{TTLSeconds: 600})
			if err != nil {
				c.violate("acked checkpoint %s is not claimable at the end: %v", k.id, err)
				continue
			}
			c.checkCloneData("checkpoint "+k.id+" (at the end)", cr, k.marker)
			c.checked("acked checkpoints claimed at the end", 1)
		}
	}
	c.checked("acked checkpoints listed", kept)
	c.checked("acked checkpoint deletes honoured", deleted)
}
