package fsm

import (
	"cmp"
	"slices"
)

// timerKind says what a timer does when it fires. The numeric order is the
// tie-break among timers due at the same instant.
type timerKind uint8

const (
	tServe  timerKind = iota + 1 // a pending claim fails (id = claim)
	tTTL                         // a live claim's lease expires (id = claim)
	tIdle                        // a running claim hibernates (id = claim)
	tGolden                      // a failed golden is retried (id = pool key)
	tPark                        // parked refills resume (id = pool key, or "*" for the node)
	tPurge                       // an ended claim is forgotten (id = claim; purge heap only)

	// A checkpoint's TTL ends (id = checkpoint).
	tCheckpoint
	// A hibernated claim archives (id = claim; pool archive_after_seconds).
	tArchive
)

// timerKey names a timer: at most one per (kind, entity). Pool timers use
// the key's string form as id (they are few; claim timers are many and keep
// the key small to hash).
type timerKey struct {
	kind timerKind
	id   string
}

func poolTimer(kind timerKind, k PoolKey) timerKey { return timerKey{kind: kind, id: k.String()} }

type timer struct {
	at  int64
	key timerKey
	idx int
}

func timerLess(a, b *timer) bool {
	if a.at != b.at {
		return a.at < b.at
	}
	if a.key.kind != b.key.kind {
		return a.key.kind < b.key.kind
	}
	return a.key.id < b.key.id
}

func compareTimers(a, b timer) int {
	switch {
	case timerLess(&a, &b):
		return -1
	case timerLess(&b, &a):
		return 1
	}
	return 0
}

// timerHeap is an indexed binary min-heap: set, remove and the due scan cost
// O(log n), O(log n) and O(due). Its array layout depends on the order of
// operations, but nothing observable does: due() sorts what it finds by the
// total order of timerLess.
type timerHeap struct {
	items []*timer
	index map[timerKey]*timer
}

func (h *timerHeap) len() int { return len(h.items) }

func (h *timerHeap) get(k timerKey) (int64, bool) {
	t, ok := h.index[k]
	if !ok {
		return 0, false
	}
	return t.at, true
}

// set arms k at time at, moving it if it is armed.
func (h *timerHeap) set(k timerKey, at int64) {
	if h.index == nil {
		h.index = map[timerKey]*timer{}
	}
	if t, ok := h.index[k]; ok {
		if t.at == at {
			return
		}
		t.at = at
		h.fix(t.idx)
		return
	}
	t := &timer{at: at, key: k, idx: len(h.items)}
	h.items = append(h.items, t)
	h.index[k] = t
	h.up(t.idx)
}

// push arms k without restoring heap order; a batch of pushes ends with
// heapify. k must not be armed. It is how Decode builds the heap in O(n).
func (h *timerHeap) push(k timerKey, at int64) {
	if h.index == nil {
		h.index = map[timerKey]*timer{}
	}
	t := &timer{at: at, key: k, idx: len(h.items)}
	h.items = append(h.items, t)
	h.index[k] = t
}

// heapify restores heap order after pushes.
func (h *timerHeap) heapify() {
	for i := len(h.items)/2 - 1; i >= 0; i-- {
		h.down(i)
	}
}

// remove disarms k if it is armed.
func (h *timerHeap) remove(k timerKey) {
	t, ok := h.index[k]
	if !ok {
		return
	}
	delete(h.index, k)
	i, last := t.idx, len(h.items)-1
	if i != last {
		h.swap(i, last)
	}
	h.items[last] = nil
	h.items = h.items[:last]
	if i != last {
		h.fix(i)
	}
}

// due returns the timers with at <= now in timerLess order, without
// changing the heap. Only due nodes and their direct children are visited.
func (h *timerHeap) due(now int64) []timer {
	if len(h.items) == 0 || h.items[0].at > now {
		return nil
	}
	var out []timer
	stack := []int{0}
	for len(stack) > 0 {
		i := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if i >= len(h.items) || h.items[i].at > now {
			continue
		}
		out = append(out, *h.items[i])
		stack = append(stack, 2*i+1, 2*i+2)
	}
	slices.SortFunc(out, compareTimers)
	return out
}

// nextAt returns the earliest armed time.
func (h *timerHeap) nextAt() (int64, bool) {
	if len(h.items) == 0 {
		return 0, false
	}
	return h.items[0].at, true
}

func (h *timerHeap) fix(i int) {
	if !h.down(i) {
		h.up(i)
	}
}

func (h *timerHeap) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if !timerLess(h.items[i], h.items[p]) {
			return
		}
		h.swap(i, p)
		i = p
	}
}

func (h *timerHeap) down(i int) bool {
	start, n := i, len(h.items)
	for {
		l := 2*i + 1
		if l >= n {
			break
		}
		m := l
		if r := l + 1; r < n && timerLess(h.items[r], h.items[l]) {
			m = r
		}
		if !timerLess(h.items[m], h.items[i]) {
			break
		}
		h.swap(i, m)
		i = m
	}
	return i > start
}

func (h *timerHeap) swap(i, j int) {
	h.items[i], h.items[j] = h.items[j], h.items[i]
	h.items[i].idx = i
	h.items[j].idx = j
}

// sortedKeys returns m's keys in order; it is how this package iterates maps
// whenever the order can reach an output.
func sortedKeys[K cmp.Ordered, V any](m map[K]V) []K {
	out := make([]K, 0, len(m))
	for k := range m { //fsm:unordered collected then sorted
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// sortedKeysWhere is sortedKeys of the entries for which keep holds: a
// pass over a large map that wants a few of its entries in order sorts
// those, not the whole map.
func sortedKeysWhere[K cmp.Ordered, V any](m map[K]V, keep func(V) bool) []K {
	var out []K
	for k, v := range m { //fsm:unordered collected then sorted
		if keep(v) {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}

func sortedPoolKeys[V any](m map[PoolKey]V) []PoolKey {
	out := make([]PoolKey, 0, len(m))
	for k := range m { //fsm:unordered collected then sorted
		out = append(out, k)
	}
	slices.SortFunc(out, PoolKey.Compare)
	return out
}
