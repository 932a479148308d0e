package api

import (
	"encoding/json"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/sbxlog/sbxlog/eventlog/event"
	"github.com/sbxlog/sbxlog/fsm"
	"github.com/sbxlog/sbxlog/projections/auth"
	"github.com/sbxlog/sbxlog/projections/sse"
)

// VM is one VM in the ?view=vms stream: the old VM manager daemon's shape,
// with a generation that increases on every change of the VM.
type VM struct {
	Name       string `json:"name"`
	Live       bool   `json:"live"`
	State      string `json:"state"`
	Pool       string `json:"pool"`
	Claim      string `json:"claim,omitempty"`
	RunDir     string `json:"run_dir"`
	Generation uint64 `json:"generation"`
}

// VMChange is an `event: change` body.
type VMChange struct {
	Type string `json:"type"` // ADDED, MODIFIED, DELETED
	VM   VM     `json:"vm"`
}

const vmSubBuffer = 4096

type vmSub struct {
	ch      chan VMChange
	dropped bool // buffer overflowed: the client is disconnected
}

// vmView keeps the VM read model and its subscribers.
type vmView struct {
	mu     sync.Mutex
	loaded bool
	vms    map[string]VM
	subs   map[*vmSub]struct{}
}

func newVMView() *vmView { return &vmView{vms: map[string]VM{}, subs: map[*vmSub]struct{}{}} }

// vmWithoutVMM are the VM statuses in which no VMM runs: the view's
// live is false (hibernated, also while its snapshot goes to the archive,
// stays there or comes back).
var vmWithoutVMM = []fsm.VMStatus{fsm.VMGone, fsm.VMFailed, fsm.VMHibernated, fsm.VMArchiving, fsm.VMArchived, fsm.VMUnarchiving}

func vmOf(v *fsm.VMRec) VM {
	return VM{
		Name: v.ID, Live: !slices.Contains(vmWithoutVMM, v.Status),
		State: v.Status.String(), Pool: v.Key.String(), Claim: v.Claim, RunDir: v.RunDir,
	}
}

// load fills the view from the state (at SetReady).
func (v *vmView) load(eng Engine) {
	v.mu.Lock()
	defer v.mu.Unlock()
	eng.View(func(st *fsm.State) {
		for _, id := range st.VMIDs() {
			rec, _ := st.VM(id)
			if rec.Status == fsm.VMGone {
				continue
			}
			vm := vmOf(&rec)
			vm.Generation = v.vms[id].Generation + 1
			v.vms[id] = vm
		}
	})
	v.loaded = true
}

// apply updates the view for the VMs evs touch, reading their current
// records; an unchanged VM produces no change event.
func (v *vmView) apply(eng Engine, evs []event.Event) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if !v.loaded {
		return
	}
	touched := map[string]bool{}
	var order []string
	for i := range evs {
		var id string
		switch evs[i].AggKind {
		case event.AggVM:
			id = evs[i].AggID
		case event.AggClaim:
			eng.View(func(st *fsm.State) {
				if c, ok := st.Claim(evs[i].AggID); ok {
					id = c.VM
				}
			})
		case event.AggCheckpoint:
			// A capture's events are its checkpoint's; they move its
			// VM into checkpointing and back. A failed capture drops its
			// record: every VM the view shows checkpointing is read again.
			var found bool
			eng.View(func(st *fsm.State) {
				var ck fsm.CheckpointRec
				if ck, found = st.Checkpoint(evs[i].AggID); found {
					id = ck.VM
				}
			})
			if !found {
				for vid, vm := range v.vms {
					if vm.State == fsm.VMCheckpointing.String() && !touched[vid] {
						touched[vid] = true
						order = append(order, vid)
					}
				}
			}
		}
		if id != "" && !touched[id] {
			touched[id] = true
			order = append(order, id)
		}
	}
	for _, id := range order {
		var rec fsm.VMRec
		var ok bool
		eng.View(func(st *fsm.State) { rec, ok = st.VM(id) })
		old, had := v.vms[id]
		switch {
		case (!ok || rec.Status == fsm.VMGone) && had:
			delete(v.vms, id)
			old.Generation++
			old.Live, old.State = false, fsm.VMGone.String()
			v.publish(VMChange{Type: "DELETED", VM: old})
		case ok && rec.Status != fsm.VMGone:
			vm := vmOf(&rec)
			vm.Generation = old.Generation
			if had && vm == old {
				continue
			}
			vm.Generation++
			v.vms[id] = vm
			typ := "MODIFIED"
			if !had {
				typ = "ADDED"
			}
			v.publish(VMChange{Type: typ, VM: vm})
		}
	}
}

func (v *vmView) publish(c VMChange) {
	for s := range v.subs {
		if s.dropped {
			continue
		}
		select {
		case s.ch <- c:
		default:
			s.dropped = true
			close(s.ch)
		}
	}
}

// subscribe returns the current VMs and a subscriber registered atomically
// with that snapshot, so no change falls between them.
func (v *vmView) subscribe() ([]VM, *vmSub) {
	v.mu.Lock()
	defer v.mu.Unlock()
	out := make([]VM, 0, len(v.vms))
	for _, vm := range v.vms {
		out = append(out, vm)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	s := &vmSub{ch: make(chan VMChange, vmSubBuffer)}
	v.subs[s] = struct{}{}
	return out, s
}

func (v *vmView) unsubscribe(s *vmSub) {
	v.mu.Lock()
	delete(v.subs, s)
	v.mu.Unlock()
}

// handleVMView streams `event: sync` {vms:[...]} then `event: change`
// {type, vm}. It never sends a sync before the first reconcile after a start
// has finished: until then a client would see an empty or stale world.
func (s *Server) handleVMView(w http.ResponseWriter, r *http.Request, id auth.Identity) error {
	if id.Kind != auth.Root {
		return errorf(http.StatusForbidden, "the VM view is for the root token")
	}
	sw, err := sse.Start(w)
	if err != nil {
		return err
	}
	for waiting := true; waiting; {
		select {
		case <-s.ready:
			waiting = false
		case <-r.Context().Done():
			return nil
		case <-time.After(s.cfg.Heartbeat):
			if sw.Comment("waiting for reconcile") != nil {
				return nil
			}
		}
	}
	vms, sub := s.vms.subscribe()
	defer s.vms.unsubscribe(sub)
	data, _ := json.Marshal(map[string]any{"vms": vms})
	_ = sw.SetWriteDeadline(time.Now().Add(writeTimeout))
	if sw.Event("", "sync", data) != nil {
		return nil
	}
	var n uint64
	heartbeat := time.NewTicker(s.cfg.Heartbeat)
	defer heartbeat.Stop()
	for {
		select {
		case <-r.Context().Done():
			return nil
		case <-heartbeat.C:
			_ = sw.SetWriteDeadline(time.Now().Add(writeTimeout))
			if sw.Comment("heartbeat") != nil {
				return nil
			}
		case c, ok := <-sub.ch:
			if !ok {
				s.sseError(sw, "client fell too far behind the VM view; reconnect for a fresh sync", 0)
				return nil
			}
			n++
			data, _ := json.Marshal(c)
			_ = sw.SetWriteDeadline(time.Now().Add(writeTimeout))
			if sw.Event(strconv.FormatUint(n, 10), "change", data) != nil {
				return nil
			}
		}
	}
}
