package chdriver

import (
	"errors"
	"io/fs"
	"path/filepath"
	"sort"
	"strings"

	"github.com/sbxlog/sbxlog/executors"
	"github.com/sbxlog/sbxlog/executors/templates"
	"github.com/sbxlog/sbxlog/fsm"
)

// CheckPool reports, before anything is proposed, whether this driver can
// serve pool key k (the API's PoolSupport): an egress net needs the
// bridge, and the template must exist in the templates root, except under
// chsim for a configured pool (pooled), whose missing template the first
// golden build or cold boot synthesizes (templateConfig: the one rule of
// what exists).
func (d *Driver) CheckPool(k fsm.PoolKey, pooled bool) error {
	if err := d.netSupported(k); err != nil {
		return err
	}
	if pooled && d.hv == CHSim {
		return nil
	}
	dir, err := d.roots.TemplateDir(k.Template)
	if err != nil {
		return err
	}
	ok, err := templates.Exists(dir)
	if err != nil {
		return err
	}
	if !ok {
		return executors.UnknownTemplate(k.Template)
	}
	return nil
}

// netSupported: an egress net needs the bridge its taps attach to.
func (d *Driver) netSupported(k fsm.PoolKey) error {
	if k.Net == NetEgress && d.bridge == "" {
		return executors.ErrNoBridge
	}
	return nil
}

// Templates lists, sorted, the templates in the templates root (each dir
// holding a config.json, named by its path under the root, as a claim
// names it): what a claim of any net and size boots here. Under chsim a
// configured pool's template is made up on its first build and listed
// from then on. A dir it cannot read is logged and left out.
func (d *Driver) Templates() []string {
	var names []string
	root := d.roots.Templates
	err := filepath.WalkDir(root, func(path string, e fs.DirEntry, err error) error {
		if err != nil {
			if path == root && errors.Is(err, fs.ErrNotExist) {
				return fs.SkipAll
			}
			return err
		}
		if !e.IsDir() || path == root {
			return nil
		}
		name, err := filepath.Rel(root, path)
		// A name no claim may give (a hidden dir, too long a path) is
		// never a template: not walked into.
		if err != nil || strings.HasPrefix(e.Name(), ".") || fsm.ValidKey(fsm.PoolKey{Template: name, Net: "none", Size: "small"}) != nil {
			return fs.SkipDir
		}
		if ok, _ := templates.Exists(path); ok {
			names = append(names, name)
			return fs.SkipDir
		}
		return nil
	})
	if err != nil {
		d.log.Warn().Err(err).Str("dir", root).Msg("list templates")
	}
	sort.Strings(names)
	return names
}
