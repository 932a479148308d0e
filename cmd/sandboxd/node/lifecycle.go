package node

import (
	"sync"

	"github.com/rs/zerolog"

	"github.com/sbxlog/sbxlog/eventlog/event"
	"github.com/sbxlog/sbxlog/fsm"
)

// lifecycleLines are the events an operator watching sandboxd's terminal
// wants a line for at info, with the line's message: the steps of a
// sandbox's life and of a pool getting ready. Everything else is in the op
// log (sbxctl events); the rest of the node logs its own steps.
var lifecycleLines = map[event.Type]struct {
	msg   string
	level zerolog.Level
}{
	event.TypeGoldenBuilt:   {"golden snapshot built", zerolog.InfoLevel},
	event.TypeGoldenFailed:  {"golden build failed", zerolog.WarnLevel},
	event.TypeClaimCreated:  {"sandbox claimed", zerolog.InfoLevel},
	event.TypeClaimServed:   {"sandbox served: its VM is ready", zerolog.InfoLevel},
	event.TypeClaimFailed:   {"claim failed", zerolog.WarnLevel},
	event.TypeHibernated:    {"sandbox hibernated", zerolog.InfoLevel},
	event.TypeWoken:         {"sandbox woken", zerolog.InfoLevel},
	event.TypeClaimExpired:  {"sandbox expired (its deadline passed)", zerolog.InfoLevel},
	event.TypeClaimReleased: {"sandbox released", zerolog.InfoLevel},
}

// lifecycleLog writes the lifecycle lines of committed events, and "pool
// warm" each time a pool's warm VMs reach its target.
type lifecycleLog struct {
	zl   zerolog.Logger
	view func(func(*fsm.State))
	mu   sync.Mutex
	warm map[fsm.PoolKey]bool // pools at their target when last looked at
}

func (l *lifecycleLog) onCommit(evs []event.Event) {
	cloned := false
	for i := range evs {
		ev := &evs[i]
		cloned = cloned || ev.Type == event.TypeVMCloned
		line, ok := lifecycleLines[ev.Type]
		if !ok {
			continue
		}
		l.zl.WithLevel(line.level).Str("event", ev.Type.String()).Str("id", ev.AggID).Uint64("seq", ev.Seq).Msg(line.msg)
	}
	if cloned {
		l.poolsWarm()
	}
}

// poolsWarm logs each pool that has just reached its warm target.
func (l *lifecycleLog) poolsWarm() {
	var pools []fsm.PoolInfo
	l.view(func(st *fsm.State) { pools = st.Info().Pools })
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, p := range pools {
		full := p.Target > 0 && p.Warm >= p.Target
		if full && !l.warm[p.Key] {
			l.zl.Info().Str("pool", p.Key.String()).Int("warm", p.Warm).Msg("pool warm: its target of warm VMs is ready")
		}
		l.warm[p.Key] = full
	}
}
