package fsm

import (
	"fmt"
	"slices"
	"testing"
)

// The indexed heap agrees with a brute-force reference under random sets,
// moves and removals, and due() returns exactly the due timers in order.
func TestTimerHeapMatchesReference(t *testing.T) {
	var h timerHeap
	ref := map[timerKey]int64{}
	x := uint64(7)
	rnd := func(n int) int {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		return int(x % uint64(n))
	}
	for i := range 20000 {
		k := timerKey{kind: timerKind(1 + rnd(5)), id: fmt.Sprint(rnd(300))}
		switch rnd(3) {
		case 0, 1:
			at := int64(rnd(1000))
			h.set(k, at)
			ref[k] = at
		default:
			h.remove(k)
			delete(ref, k)
		}
		if i%97 == 0 {
			now := int64(rnd(1000))
			var want []timer
			for k, at := range ref {
				if at <= now {
					want = append(want, timer{at: at, key: k})
				}
			}
			slices.SortFunc(want, compareTimers)
			got := h.due(now)
			if len(got) != len(want) {
				t.Fatalf("due(%d): %d timers, want %d", now, len(got), len(want))
			}
			for j := range got {
				if got[j].at != want[j].at || got[j].key != want[j].key {
					t.Fatalf("due(%d)[%d] = %+v, want %+v", now, j, got[j], want[j])
				}
			}
		}
		if h.len() != len(ref) {
			t.Fatalf("%d armed, reference %d", h.len(), len(ref))
		}
	}
	for k, at := range ref {
		if got, ok := h.get(k); !ok || got != at {
			t.Fatalf("get(%v) = %d %v, want %d", k, got, ok, at)
		}
	}
}

func TestTimerHeapDueVisitsOnlyDue(t *testing.T) {
	var h timerHeap
	for i := range 100000 {
		h.set(timerKey{kind: tTTL, id: fmt.Sprint(i)}, int64(1000+i))
	}
	if got := h.due(999); got != nil {
		t.Fatalf("nothing due, got %d", len(got))
	}
	if got := h.due(1002); len(got) != 3 || got[0].at != 1000 || got[2].at != 1002 {
		t.Fatalf("due = %+v", got)
	}
}
