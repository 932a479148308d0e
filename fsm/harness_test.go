package fsm

import (
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/sbxlog/sbxlog/eventlog/event"
)

var (
	kA = PoolKey{Template: "base", Net: "none", Size: "small"}
	kB = PoolKey{Template: "py:3.12", Net: "egress", Size: "medium"}
)

func claimID(n int) string { return fmt.Sprintf("sb_%016x", n) }

// harness drives a State through Decide and Apply the way the daemon does,
// checking the invariants after every applied batch.
type harness struct {
	t   *testing.T
	s   *State
	now int64
	n   uint64
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	return &harness{t: t, s: New(), now: 1_790_000_000 * second}
}

func (h *harness) meta() Meta {
	h.n++
	return Meta{Op: event.OpIDFromUint(uint64(h.now/1_000_000), h.n), Now: h.now}
}

// res is the Meta of an executor's result for in.
func (h *harness) res(in Intent) Meta {
	h.n++
	return Meta{Op: event.DeriveOpID(in.IntentOp(), fmt.Sprint("result", h.n)), Cause: in.IntentOp(), Now: h.now}
}

func (h *harness) advance(ns int64) { h.now += ns }

func evTypes(evs []event.Event) []event.Type {
	out := make([]event.Type, len(evs))
	for i := range evs {
		out[i] = evs[i].Type
	}
	return out
}

// do decides cmd, requires exactly the event types want, applies them and
// checks the state.
func (h *harness) do(cmd Command, want ...event.Type) []event.Event {
	h.t.Helper()
	before := Encode(h.s)
	evs, err := Decide(h.s, cmd)
	if err != nil {
		h.t.Fatalf("Decide(%T %+v): %v", cmd, cmd, err)
	}
	if string(before) != string(Encode(h.s)) {
		h.t.Fatalf("Decide(%T) changed the state", cmd)
	}
	if !slices.Equal(evTypes(evs), want) {
		h.t.Fatalf("Decide(%T %+v) = %v, want %v", cmd, cmd, evTypes(evs), want)
	}
	for i := range evs {
		if evs[i].OpID != cmd.meta().Op || evs[i].Causation != cmd.meta().Cause || evs[i].Time != cmd.meta().Now {
			h.t.Fatalf("event %s does not carry the command's op, cause and time", evs[i].Type)
		}
		if err := Apply(h.s, &evs[i]); err != nil {
			h.t.Fatalf("Apply(%s): %v", evs[i].Type, err)
		}
	}
	if err := h.s.Check(); err != nil {
		h.t.Fatalf("after %T: %v", cmd, err)
	}
	return evs
}

// rejects requires Decide to reject cmd with code.
func (h *harness) rejects(cmd Command, code Code) *Rejection {
	h.t.Helper()
	evs, err := Decide(h.s, cmd)
	r, ok := AsRejection(err)
	if !ok || r.Code != code || evs != nil {
		h.t.Fatalf("Decide(%T %+v) = %v, %v; want a %s rejection", cmd, cmd, evTypes(evs), err, code)
	}
	if !errors.Is(err, &Rejection{Code: code}) {
		h.t.Fatalf("errors.Is does not match the %s sentinel", code)
	}
	return r
}

// payload decodes the i-th event of evs.
func payload[P event.Payload](t *testing.T, evs []event.Event, i int) P {
	t.Helper()
	p, err := evs[i].Decode()
	if err != nil {
		t.Fatal(err)
	}
	v, ok := p.(P)
	if !ok {
		t.Fatalf("event %d is %T", i, p)
	}
	return v
}

func (h *harness) node() {
	h.t.Helper()
	h.do(ConfigureNode{Meta: h.meta(), Node: "n1", Instance: "i1"}, event.TypeNodeConfigured)
}

// pools configures specs; new keys get golden build requests.
func (h *harness) pools(specs ...PoolSpec) []event.Event {
	h.t.Helper()
	evs, err := Decide(h.s, ConfigurePools{Meta: h.meta(), Pools: specs})
	if err != nil {
		h.t.Fatal(err)
	}
	for i := range evs {
		if err := Apply(h.s, &evs[i]); err != nil {
			h.t.Fatal(err)
		}
	}
	return evs
}

// intentFor returns the pending intent about vm (or golden key when vm is "").
func (h *harness) intentFor(vm string, key PoolKey) Intent {
	h.t.Helper()
	want := vm
	if vm == "" {
		want = key.String()
	}
	for _, in := range Intents(h.s) {
		if in.Subject() == want {
			return in
		}
	}
	h.t.Fatalf("no intent for VM %q / golden %s in %+v", vm, key, Intents(h.s))
	return nil
}

func (h *harness) goldenReady(k PoolKey) {
	h.t.Helper()
	in := h.intentFor("", k)
	h.do(GoldenBuilt{Meta: h.res(in), Key: k, SnapshotDir: "goldens/" + k.String()}, event.TypeGoldenBuilt)
}

// setup: node, pool kA with warm w, golden ready, w warm VMs.
func (h *harness) setup(w int) {
	h.t.Helper()
	h.node()
	h.pools(PoolSpec{PoolKey: kA, Warm: w})
	h.goldenReady(kA)
	h.fill(kA)
}

// fill refills k and completes every refill clone, in request order.
func (h *harness) fill(k PoolKey) []string {
	h.t.Helper()
	evs, err := Decide(h.s, Refill{Meta: h.meta(), Key: k})
	if err != nil {
		h.t.Fatal(err)
	}
	var vms []string
	for i := range evs {
		if err := Apply(h.s, &evs[i]); err != nil {
			h.t.Fatal(err)
		}
		vms = append(vms, evs[i].AggID)
	}
	for _, vm := range vms {
		h.do(VMCloned{Meta: h.res(h.intentFor(vm, k)), VM: vm}, event.TypeVMCloned)
	}
	return vms
}

// claimWarm claims from k's warm pool.
func (h *harness) claimWarm(n int, k PoolKey) ClaimRec {
	h.t.Helper()
	h.do(Claim{Meta: h.meta(), ID: claimID(n), Key: k}, event.TypeClaimCreated)
	c, _ := h.s.Claim(claimID(n))
	return c
}

func (h *harness) claim(id string) ClaimRec {
	h.t.Helper()
	c, ok := h.s.Claim(id)
	if !ok {
		h.t.Fatalf("no claim %s", id)
	}
	return c
}

func (h *harness) vm(id string) VMRec {
	h.t.Helper()
	v, ok := h.s.VM(id)
	if !ok {
		h.t.Fatalf("no VM %s", id)
	}
	return v
}

// hibernate takes a running claim to hibernated.
func (h *harness) hibernate(id string) VMRec {
	h.t.Helper()
	h.do(Hibernate{Meta: h.meta(), Claim: id}, event.TypeHibernateRequested)
	vm := h.claim(id).VM
	h.do(HibernateDone{Meta: h.res(h.intentFor(vm, kA)), VM: vm, SnapshotDir: "snap/" + id}, event.TypeHibernated)
	return h.vm(vm)
}
