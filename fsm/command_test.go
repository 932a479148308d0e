package fsm_test

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/sbxlog/sbxlog/eventlog/event"
	"github.com/sbxlog/sbxlog/fsm"
)

// wrapped embeds a command from outside the package: it satisfies the sealed
// Command interface through the promoted methods, and must still be refused.
type wrapped struct{ fsm.Claim }

// A command is decided the same whether passed as a value or a pointer; a
// type from another package wrapping one is an unknown command.
func TestCommandValuePointerAndForeign(t *testing.T) {
	const now = 1_790_000_000_000_000_000
	s := fsm.New()
	n := uint64(0)
	meta := func() fsm.Meta {
		n++
		return fsm.Meta{Op: event.OpIDFromUint(now/1_000_000, n), Now: now}
	}
	key := fsm.PoolKey{Template: "base", Net: "none", Size: "small"}
	for _, cmd := range []fsm.Command{
		fsm.ConfigureNode{Meta: meta(), Node: "n1", Instance: "i1"},
		&fsm.ConfigurePools{Meta: meta(), Pools: []fsm.PoolSpec{{PoolKey: key}}},
	} {
		evs, err := fsm.Decide(s, cmd)
		if err != nil || len(evs) == 0 {
			t.Fatalf("Decide(%T) = %d events, %v", cmd, len(evs), err)
		}
		for i := range evs {
			if err := fsm.Apply(s, &evs[i]); err != nil {
				t.Fatalf("Apply(%s): %v", evs[i].Type, err)
			}
		}
	}
	types := func(evs []event.Event) []event.Type {
		out := make([]event.Type, len(evs))
		for i := range evs {
			out[i] = evs[i].Type
		}
		return out
	}
	claim := fsm.Claim{Meta: meta(), ID: "sb_0000000000000001", Key: key}
	byValue, err := fsm.Decide(s, claim)
	if err != nil {
		t.Fatal(err)
	}
	byPointer, err := fsm.Decide(s, &claim)
	if err != nil {
		t.Fatal(err)
	}
	want := []event.Type{event.TypeClaimCreated, event.TypeVMCloneRequested}
	if !slices.Equal(types(byValue), want) || !slices.Equal(types(byPointer), want) {
		t.Fatalf("value %v, pointer %v, want %v", types(byValue), types(byPointer), want)
	}
	for _, cmd := range []fsm.Command{wrapped{claim}, &wrapped{claim}} {
		evs, err := fsm.Decide(s, cmd)
		var r *fsm.Rejection
		if !errors.As(err, &r) || r.Code != fsm.Invalid || !strings.Contains(r.Msg, "unknown command") || len(evs) != 0 {
			t.Fatalf("Decide(%T) = %d events, %v; want an unknown command rejection", cmd, len(evs), err)
		}
	}
}
