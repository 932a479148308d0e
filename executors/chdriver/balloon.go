package chdriver

import (
	"context"
	"time"

	"github.com/rs/zerolog"

	"github.com/sbxlog/sbxlog/executors/ch"
)

// settleBalloon waits until memory_actual_size equals memory minus the
// balloon's size, polling vm.info every Balloon.Poll, so the snapshot does
// not capture pages the balloon is about to take back. It gives up (and logs
// it) after Balloon.Stall without progress or Balloon.Max in all; giving up
// is not an error, the snapshot is still correct, only larger. A paused VM's
// balloon cannot move, so it is not waited for.
func (d *Driver) settleBalloon(ctx context.Context, api API, info *ch.VmInfo, log zerolog.Logger) error {
	if info == nil || info.Config == nil {
		return nil
	}
	size, ok := info.Config.BalloonSize()
	if !ok || size <= 0 {
		return nil
	}
	target := info.Config.MemorySize() - size
	cur := info.MemoryActualSize
	if info.State != ch.StateRunning {
		if cur != target {
			log.Info().Str("state", string(info.State)).Int64("actual", cur).Int64("target", target).Msg("balloon not settled, but the VM is not running; not waiting")
		}
		return nil
	}
	start := d.now()
	moved := start
	t := time.NewTimer(d.balloon.Poll)
	defer t.Stop()
	for cur != target {
		now := d.now()
		if now.Sub(moved) >= d.balloon.Stall {
			log.Warn().Int64("actual", cur).Int64("target", target).Dur("stalled", now.Sub(moved)).
				Msg("balloon made no progress; snapshotting unsettled")
			return nil
		}
		if now.Sub(start) >= d.balloon.Max {
			log.Warn().Int64("actual", cur).Int64("target", target).Dur("waited", now.Sub(start)).
				Msg("balloon did not settle in time; snapshotting unsettled")
			return nil
		}
		t.Reset(d.balloon.Poll)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
		in, err := api.Info(ctx)
		if err != nil {
			return err
		}
		if in.MemoryActualSize != cur {
			cur = in.MemoryActualSize
			moved = d.now()
		}
	}
	log.Debug().Int64("actual", cur).Dur("waited", d.now().Sub(start)).Msg("balloon settled")
	return nil
}
