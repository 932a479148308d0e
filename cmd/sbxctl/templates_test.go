package main

import (
	"slices"
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
	// Every template, with its kind: the node's configured pool, the
	// driver's images (any net and size: "*"), the promoted one.
	n.Driver.SetTemplates("default", "busybox")
	out := mustRun(t, "templates")
	var rows []string
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		rows = append(rows, strings.Join(strings.Fields(l), " "))
	}
	want := []string{
		"TEMPLATE KIND NET SIZE TENANT DIGEST LABELS",
		"app:v1 promoted none small - " + pr.ContentDigest + " team=a",
		"busybox image * * - - -",
		"default configured none small - - -",
		"default image * * - - -",
	}
	if !slices.Equal(rows, want) {
		t.Fatalf("templates:\n%s\nwant rows\n%s", out, strings.Join(want, "\n"))
	}
	var ls api.TemplatesResponse
	mustJSON(t, &ls, "templates", "ls")
	if len(ls.Templates) != 4 || ls.Templates[0].Kind != api.TemplatePromoted || ls.Templates[0].Labels["team"] != "a" {
		t.Fatalf("templates ls --json: %+v", ls)
	}
	// A claim of a template not among them names them.
	if code, _, errs := sbx("claim", "--template", "nope"); code != 1 || !strings.Contains(errs, "unknown template nope; templates here: app:v1, busybox, default") {
		t.Fatalf("claim of an unknown template: exit %d, %q", code, errs)
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
