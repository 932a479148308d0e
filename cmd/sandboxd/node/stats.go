package node

import (
	"context"
	"errors"
	"fmt"

	"github.com/sbxlog/sbxlog/executors/procstat"
	"github.com/sbxlog/sbxlog/fsm"
	"github.com/sbxlog/sbxlog/projections/api"
)

// vmmStats is the API's api.StatsFunc: the state names the VM's run dir,
// the driver finds its VMM and reads its usage.
func (n *Node) vmmStats(ctx context.Context, vm string) (api.VMMStats, error) {
	var rec fsm.VMRec
	var ok bool
	n.Engine.View(func(st *fsm.State) { rec, ok = st.VM(vm) })
	if !ok || rec.RunDir == "" {
		return api.VMMStats{}, fmt.Errorf("%w: VM %s has no run dir", api.ErrNoVMM, vm)
	}
	u, err := n.Driver.VMMUsage(ctx, vm, rec.RunDir)
	if errors.Is(err, procstat.ErrNoProcess) {
		return api.VMMStats{}, fmt.Errorf("%w: %v", api.ErrNoVMM, err)
	}
	if err != nil {
		return api.VMMStats{}, err
	}
	return api.VMMStats{Pid: u.Pid, RSSBytes: u.RSSBytes, CPUSeconds: u.CPUSeconds}, nil
}
