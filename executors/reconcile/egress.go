package reconcile

import (
	"context"

	"github.com/rs/zerolog"

	"github.com/sbxlog/sbxlog/executors/egress/nft"
)

// EgressLane is what LockEgress needs of an egress lane (nft.Lane).
type EgressLane interface {
	Reconcile(members []nft.Member) (nft.Report, error)
}

// LockEgress is the body of every driver's EgressLocker: the locks of the
// VMs among vms whose net is egressNet are checked and repaired through
// lane, every other lock removed (after its tap). member names a VM's tap
// and MAC. A VM whose tap cannot be locked is listed as failed and stopped
// (stop, given its run dir as the state has it): its guest would otherwise
// have open egress.
func LockEgress(ctx context.Context, lane EgressLane, vms []VMRef, egressNet string,
	member func(vm string) nft.Member, stop func(ctx context.Context, vm, runDir string) error,
	log zerolog.Logger) (EgressReport, error) {
	var rep EgressReport
	var members []nft.Member
	runDirs := map[string]string{}
	for _, v := range vms {
		if v.Key.Net != egressNet {
			continue
		}
		members = append(members, member(v.ID))
		runDirs[v.ID] = v.RunDir
	}
	nr, err := lane.Reconcile(members)
	rep.Kept, rep.Repaired, rep.Removed = nr.Kept, nr.Repaired, nr.Removed
	if err != nil {
		return rep, err
	}
	for tap, serr := range nr.Stray {
		log.Warn().Err(serr).Str("tap", tap).Msg("a tap no VM of the state owns could not be deleted; its lock stays")
	}
	for vm, ferr := range nr.Failed {
		log.Error().Err(ferr).Str("vm", vm).Msg("could not lock the tap of an egress VM; stopping its VMM")
		rep.Failed = append(rep.Failed, vm)
		if err := stop(ctx, vm, runDirs[vm]); err != nil {
			log.Error().Err(err).Str("vm", vm).Msg("could not stop the VMM of an egress VM whose tap is unlocked")
		}
	}
	return rep, nil
}
