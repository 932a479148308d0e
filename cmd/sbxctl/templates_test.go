package main

import (
	"strings"
	"testing"

	"github.com/sbxlog/sbxlog/fsm"
	"github.com/sbxlog/sbxlog/projections/api"
)

// TestTemplateCommands: promote, templates ls / labels / rm and store,
// each checked against the node's state.
func TestTemplateCommands(t *testing.T) {
	n := startNode(t, 1)
	var cl api.ClaimResponse
	mustJSON(t, &cl, "claim", "--template", "default")
	if code, _, errs := sbx("promote", cl.ID); code != 2 || !strings.Contains(errs, "--template") {
		t.Fatalf("promote without --template: exit %d, %q", code, errs)
	}
	var pr api.PromoteResponse
	mustJSON(t, &pr, "promote", cl.ID, "--template", "app:v1", "--sandbox-token", cl.Token)
	k := fsm.PoolKey{Template: "app:v1", Net: "none", Size: "small"}
	var tr fsm.TemplateRec
	n.Engine.View(func(s *fsm.State) { tr, _ = s.Template(k) })
	if pr.Key.Template != "app:v1" || tr.Digest != pr.ContentDigest || pr.ContentDigest == "" {
		t.Fatalf("promote %+v, state %+v", pr, tr)
	}
	mustRun(t, "templates", "labels", "--template", "app:v1", "--label", "team=a")
	out := mustRun(t, "templates")
	if lines := strings.Split(strings.TrimSpace(out), "\n"); len(lines) != 2 || !strings.Contains(lines[1], "app:v1/none/small") || !strings.Contains(lines[1], "team=a") {
		t.Fatalf("templates:\n%s", out)
	}
	if out := mustRun(t, "store"); !strings.Contains(out, "template") || !strings.Contains(out, "golden") {
		t.Fatalf("store:\n%s", out)
	}
	if code, _, errs := sbx("templates", "rm", "--template", "app:v1", "--digest", "sha256:other"); code != 1 || !strings.Contains(errs, "412") {
		t.Fatalf("rm with another digest: exit %d, %q", code, errs)
	}
	mustRun(t, "templates", "rm", "--template", "app:v1")
	n.Engine.View(func(s *fsm.State) {
		if _, ok := s.Template(k); ok {
			t.Fatal("template kept after rm")
		}
	})
}
