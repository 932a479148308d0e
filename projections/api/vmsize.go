package api

import "github.com/sbxlog/sbxlog/fsm"

// VMSizer says what a VM of a pool size gets on this node's hypervisor:
// fsm.Sizes' row as Cloud Hypervisor gives it, less under QEMU's TCG
// (fsm.Size.UnderTCG). The hypervisor driver implements it (the node wires
// it, Options.Sizes); without one a VM gets its row as it is.
type VMSizer interface {
	VMSize(size string) (fsm.Size, bool)
}

// vmSize is what a VM of pool size name is given here: the cpu_count and
// mem_total_bytes of every sandbox, template and stats answer.
func (s *Server) vmSize(name string) (fsm.Size, bool) {
	if s.sizes != nil {
		return s.sizes.VMSize(name)
	}
	return fsm.SizeNamed(name)
}
