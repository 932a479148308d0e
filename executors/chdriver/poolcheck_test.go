package chdriver

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/rs/zerolog"

	"github.com/sbxlog/sbxlog/executors"
	"github.com/sbxlog/sbxlog/executors/layout"
	"github.com/sbxlog/sbxlog/executors/templates"
	"github.com/sbxlog/sbxlog/fsm"
)

// CheckPool is what exists on this node, asked before anything is
// proposed: a template directory with its config.json (under chsim, also
// a configured pool's template, which it makes up), and an egress net
// only with a bridge. No VMM runs.
func TestCheckPool(t *testing.T) {
	roots := layout.RootsIn(t.TempDir())
	if err := os.MkdirAll(filepath.Join(roots.Templates, "real"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(roots.Templates, "real", templates.ConfigFile), []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	// A directory without config.json is no template.
	if err := os.MkdirAll(filepath.Join(roots.Templates, "empty"), 0o755); err != nil {
		t.Fatal(err)
	}
	key := func(tpl, net string) fsm.PoolKey { return fsm.PoolKey{Template: tpl, Net: net, Size: "small"} }
	for _, tc := range []struct {
		name   string
		hv     Hypervisor
		bridge string
		key    fsm.PoolKey
		pooled bool
		want   error
	}{
		{"ch: existing template", CloudHypervisor, "", key("real", "none"), false, nil},
		{"ch: missing template", CloudHypervisor, "", key("nope", "none"), false, executors.ErrUnknownTemplate},
		{"ch: missing template of a pool", CloudHypervisor, "", key("nope", "none"), true, executors.ErrUnknownTemplate},
		{"ch: directory without config.json", CloudHypervisor, "", key("empty", "none"), false, executors.ErrUnknownTemplate},
		{"chsim: missing template", CHSim, "", key("nope", "none"), false, executors.ErrUnknownTemplate},
		{"chsim: a pool's template is made up", CHSim, "", key("nope", "none"), true, nil},
		{"egress without a bridge", CHSim, "", key("real", "egress"), true, executors.ErrNetUnsupported},
		{"egress with a bridge", CloudHypervisor, "br0", key("real", "egress"), false, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, err := New(Config{Roots: roots, Instance: testInstance, VMM: "/nonexistent/vmm", Hypervisor: tc.hv, Bridge: tc.bridge, Log: zerolog.Nop()})
			if err != nil {
				t.Fatal(err)
			}
			err = d.CheckPool(tc.key, tc.pooled)
			if (tc.want == nil) != (err == nil) || (tc.want != nil && !errors.Is(err, tc.want)) {
				t.Fatalf("CheckPool = %v, want %v", err, tc.want)
			}
		})
	}
}

// Templates lists what CheckPool takes without a pool: each dir of the
// templates root with a config.json, nested names by their path, and
// nothing a claim could not name (a hidden dir, a name the key rules
// refuse) nor a dir without config.json.
func TestTemplatesListsTemplateDirs(t *testing.T) {
	roots := layout.RootsIn(t.TempDir())
	d, err := New(Config{Roots: roots, Instance: testInstance, VMM: "/nonexistent/vmm", Hypervisor: CloudHypervisor, Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	if got := d.Templates(); len(got) != 0 {
		t.Fatalf("no templates root: %v", got)
	}
	for _, dir := range []string{"base", "team/app:v2", ".hidden", "bad name", "team/app:v2/inner"} {
		if err := os.MkdirAll(filepath.Join(roots.Templates, dir), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(roots.Templates, dir, templates.ConfigFile), []byte("{}"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(filepath.Join(roots.Templates, "empty"), 0o755); err != nil {
		t.Fatal(err)
	}
	got := d.Templates()
	if want := []string{"base", "team/app:v2"}; !slices.Equal(got, want) {
		t.Fatalf("Templates = %q, want %q", got, want)
	}
	for _, name := range got {
		if err := d.CheckPool(fsm.PoolKey{Template: name, Net: "none", Size: "small"}, false); err != nil {
			t.Errorf("listed %s, which CheckPool refuses: %v", name, err)
		}
	}
}
