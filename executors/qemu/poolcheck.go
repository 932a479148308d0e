package qemu

import (
	"github.com/sbxlog/sbxlog/executors"
	"github.com/sbxlog/sbxlog/fsm"
)

// errNoNIC: the guest's only NIC is the agent network.
var errNoNIC = executors.NetUnsupported("net egress is not supported by the QEMU driver (the guest has no NIC)")

// CheckPool reports whether this driver can serve pool key k (the API's
// PoolSupport, asked before anything is proposed, and every boot's own
// check): its template must be in the template table (Config.Templates)
// and its net not egress. pooled changes nothing here: this driver makes no
// template up.
func (d *Driver) CheckPool(k fsm.PoolKey, _ bool) error {
	if k.Net == NetEgress {
		return errNoNIC
	}
	if _, ok := d.templates[k.Template]; !ok {
		return d.unknownTemplate(k.Template)
	}
	return nil
}
