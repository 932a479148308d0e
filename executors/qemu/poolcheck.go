package qemu

import (
	"github.com/sbxlog/sbxlog/executors"
	"github.com/sbxlog/sbxlog/fsm"
)

// CheckPool reports whether this driver can serve pool key k (the API's
// PoolSupport, asked before anything is proposed, and every boot's own
// check): its template must be in the template table (Config.Templates),
// and an egress net needs the bridge (Config.Egress). pooled changes
// nothing here: this driver makes no template up.
func (d *Driver) CheckPool(k fsm.PoolKey, _ bool) error {
	if k.Template == "" {
		return d.unknownTemplate(k.Template)
	}
	return d.checkPool(k)
}

// checkPool is CheckPool that checks only the net when k names no
// template (a clone from a golden).
func (d *Driver) checkPool(k fsm.PoolKey) error {
	if k.Net == NetEgress && (d.egress == nil || d.egress.Lane == nil) {
		return executors.ErrNoBridge
	}
	if _, ok := d.templates[k.Template]; !ok && k.Template != "" {
		return d.unknownTemplate(k.Template)
	}
	return nil
}
