package campaign

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/sbxlog/sbxlog/projections/api"
)

// storeMatches reports whether the store holds exactly the snapshot dirs
// GET /v1/store references, none retired, and no temp or trash entry.
func (n *node) storeMatches() bool {
	st, err := n.c.Store(n.ctx)
	if err != nil {
		return false
	}
	var refs []string
	for _, s := range st.Snapshots {
		if s.Kind == "retired" {
			return false
		}
		refs = append(refs, s.Dir)
	}
	store := filepath.Join(n.d.DataDir, "store")
	var held []string
	ents, _ := os.ReadDir(store)
	for _, e := range ents {
		if !e.IsDir() || e.Name()[0] == '.' {
			return false // a temp or trash entry
		}
		sub, _ := os.ReadDir(filepath.Join(store, e.Name()))
		for _, s := range sub {
			held = append(held, e.Name()+"/"+s.Name())
		}
	}
	slices.Sort(held)
	return slices.Equal(held, refs)
}

// TestCrashAtPromote is issue 24's acceptance 2 for promote and collect:
// sandboxd killed at each step of a promote (SBX_CRASH_AT=promote:<step>)
// or of the collection of a deleted template's golden
// (collect:discard) recovers after a restart: the promote is done (the
// template stands, its sandbox runs) or rolled back and redone, and once
// the template is deleted and collected the store holds exactly what the
// state references.
func TestCrashAtPromote(t *testing.T) {
	run := func(crashAt string) func(t *testing.T) {
		return func(t *testing.T) {
			t.Parallel()
			n, cr := claimedThenStopped(t)
			key := api.TemplateKey{Template: "promoted", Net: "none", Size: "small"}
			templates := func() []api.TemplateInfo {
				in, err := n.c.Info(n.ctx)
				if err != nil {
					return nil
				}
				return in.Templates
			}
			if crashAt == "collect:discard" {
				n.start()
				if _, err := n.c.Promote(n.ctx, cr.ID, cr.Token, key.Template); err != nil {
					t.Fatal(err)
				}
				n.stop()
				n.start("SBX_CRASH_AT=" + crashAt)
				if err := n.c.DeleteTemplate(n.ctx, key, ""); err != nil && !droppedByCrash(err) {
					t.Fatal(err)
				}
			} else {
				n.start("SBX_CRASH_AT=" + crashAt)
				go func() { _, _ = n.c.Promote(n.ctx, cr.ID, cr.Token, key.Template) }()
			}
			n.crashed()
			n.start()
			if crashAt != "collect:discard" {
				n.waitFor("the template", func() bool { return len(templates()) == 1 })
				n.waitFor("the sandbox running", func() bool { return n.state(cr.ID) == "running" })
				n.clean()
				if err := n.c.DeleteTemplate(n.ctx, key, ""); err != nil {
					t.Fatal(err)
				}
			}
			n.waitFor("the store holding what the state references", n.storeMatches)
			if len(templates()) != 0 {
				t.Fatalf("templates after the delete: %+v", templates())
			}
			n.clean()
		}
	}
	for _, step := range []string{"pause", "snapshot", "clone_disk", "sync_files", "write_meta", "rename", "sync_tree", "resume", "digest"} {
		t.Run("promote at "+step, run("promote:"+step))
	}
	t.Run("collect at discard", run("collect:discard"))
}
