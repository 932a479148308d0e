package api

import (
	"context"
	"slices"

	"github.com/sbxlog/sbxlog/eventlog/event"
)

// A watch is one request's interest in the commits about one sandbox. It is
// registered before the request reads the state or proposes, so no event
// about the sandbox committed after that read can slip past it; OnCommit
// keeps the events of the types it asks for, in log order, and signals it.
// A watch lives only as long as its request, so what it keeps is the few
// events of one claim or one hibernate or wake.
type watch struct {
	id    string
	types []event.Type
	// claimWait marks the watch wait registered (unwait removes it).
	claimWait bool
	// signal gets a value after events were kept (cap 1: a signal not yet
	// received stands for any number of them).
	signal chan struct{}
	evs    []event.Event // guarded by Server.waitMu
}

// claimOutcomes are the events that settle a pending claim.
var claimOutcomes = []event.Type{event.TypeClaimServed, event.TypeClaimFailed, event.TypeClaimReleased, event.TypeClaimExpired}

// watch registers a watch of the events of the given types about sandbox id.
// End it with unwatch.
func (s *Server) watch(id string, types ...event.Type) *watch {
	return s.watchOn(id, make(chan struct{}, 1), types...)
}

// watchOn is watch signalling on signal (cap 1), which several watches
// may share.
func (s *Server) watchOn(id string, signal chan struct{}, types ...event.Type) *watch {
	w := &watch{id: id, types: types, signal: signal}
	s.waitMu.Lock()
	s.waiters[id] = append(s.waiters[id], w)
	s.waitMu.Unlock()
	return w
}

func (s *Server) unwatch(w *watch) {
	s.waitMu.Lock()
	defer s.waitMu.Unlock()
	s.dropLocked(w.id, func(x *watch) bool { return x == w })
}

func (s *Server) dropLocked(id string, drop func(*watch) bool) {
	ws := slices.DeleteFunc(s.waiters[id], drop)
	if len(ws) == 0 {
		delete(s.waiters, id)
		return
	}
	s.waiters[id] = ws
}

// wait registers interest in a pending claim's outcome: the channel gets a
// value once the claim was served, failed or ended.
func (s *Server) wait(id string) <-chan struct{} {
	w := s.watch(id, claimOutcomes...)
	w.claimWait = true
	return w.signal
}

func (s *Server) unwait(id string) {
	s.waitMu.Lock()
	defer s.waitMu.Unlock()
	s.dropLocked(id, func(x *watch) bool { return x.claimWait })
}

// next returns the first event w kept that comes after seq in the log and
// is of one of the types in want, waiting for it until ctx ends. Events
// passed over are dropped: the caller has read the state at seq, which
// accounts for the earlier ones, and wants none of the others.
func (s *Server) next(ctx context.Context, w *watch, seq uint64, want ...event.Type) (event.Event, error) {
	for {
		s.waitMu.Lock()
		for i, ev := range w.evs {
			if ev.Seq > seq && slices.Contains(want, ev.Type) {
				w.evs = w.evs[i+1:]
				s.waitMu.Unlock()
				return ev, nil
			}
		}
		w.evs = w.evs[:0]
		s.waitMu.Unlock()
		select {
		case <-w.signal:
		case <-ctx.Done():
			return event.Event{}, ctx.Err()
		}
	}
}

// OnCommit feeds the server every durable commit in log order: it hands the
// events to the watches of their sandboxes (claims waiting for their VM,
// hibernates and wakes waiting for their outcome) and updates the VM view.
func (s *Server) OnCommit(evs []event.Event) {
	s.data.onCommit(evs)
	s.waitMu.Lock()
	if len(s.waiters) > 0 {
		for i := range evs {
			for _, w := range s.waiters[evs[i].AggID] {
				if slices.Contains(w.types, evs[i].Type) {
					w.evs = append(w.evs, evs[i])
					select {
					case w.signal <- struct{}{}:
					default:
					}
				}
			}
		}
	}
	s.waitMu.Unlock()
	s.vms.apply(s.eng, evs)
}
