package chdriver

import (
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
