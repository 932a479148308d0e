package fsmtest

import (
	"context"
	"fmt"

	"github.com/sbxlog/sbxlog/eventlog"
	"github.com/sbxlog/sbxlog/eventlog/event"
	"github.com/sbxlog/sbxlog/fsm"
	"github.com/sbxlog/sbxlog/fsm/fsmsim"
)

// Appender is the part of *eventlog.Log Record writes through.
type Appender interface {
	Append(ctx context.Context, evs []event.Event) (eventlog.AppendResult, error)
}

var _ Appender = (*eventlog.Log)(nil)

// Record drives a generated workload into a log the way a daemon's proposer
// does: for each of steps commands from sim, Decide against s, append the
// events (one append per decision, so they share its op id) and apply what
// the log returned. Rejections are skipped. After each applied decision it
// calls observe (if not nil) with the last sequence and the state there.
// It records workloads for tests and benchmarks of replay.
func Record(ctx context.Context, l Appender, s *fsm.State, sim *fsmsim.Sim, steps int, observe func(seq uint64, s *fsm.State)) error {
	for i := 0; i < steps; i++ {
		cmd := sim.Next(s)
		evs, err := fsm.Decide(s, cmd)
		if _, rejected := fsm.AsRejection(err); rejected {
			continue
		}
		if err != nil {
			return fmt.Errorf("record: step %d: %w", i, err)
		}
		if len(evs) == 0 {
			continue
		}
		res, err := l.Append(ctx, evs)
		if err != nil {
			return fmt.Errorf("record: step %d: append: %w", i, err)
		}
		if res.Duplicate {
			return fmt.Errorf("record: step %d: op %s already in the log", i, evs[0].OpID)
		}
		for j := range res.Events {
			if err := fsm.Apply(s, &res.Events[j]); err != nil {
				return fmt.Errorf("record: step %d: %w", i, err)
			}
		}
		if observe != nil {
			observe(res.Events[len(res.Events)-1].Seq, s)
		}
	}
	return nil
}
