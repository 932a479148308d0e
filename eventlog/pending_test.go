package eventlog

import (
	"context"
	"sync"
	"testing"
)

// Begin called under a caller's lock hands out sequences in that lock's
// order, while the waits (and fsyncs) happen outside it: the single writer
// relies on this to apply events in log order with group commit.
func TestBeginOrderFollowsCallerLock(t *testing.T) {
	l := openTest(t, t.TempDir(), Options{})
	const writers, per = 8, 40
	var mu sync.Mutex
	var order []uint64 // op counter in lock order
	seqOf := map[uint64]uint64{}
	var smu sync.Mutex
	var wg sync.WaitGroup
	var next uint64
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < per; i++ {
				mu.Lock()
				next++
				n := next
				p, err := l.Begin(mkEvents(testOp(n), 1, "b"))
				if err != nil {
					mu.Unlock()
					t.Error(err)
					return
				}
				order = append(order, n)
				mu.Unlock()
				res, err := p.Wait(context.Background())
				if err != nil {
					t.Error(err)
					return
				}
				smu.Lock()
				seqOf[n] = res.Events[0].Seq
				smu.Unlock()
			}
		}()
	}
	wg.Wait()
	if len(order) != writers*per {
		t.Fatalf("%d ops, want %d", len(order), writers*per)
	}
	for i, n := range order {
		if seqOf[n] != uint64(i+1) {
			t.Fatalf("op %d was the %dth under the lock but got seq %d", n, i+1, seqOf[n])
		}
	}
	if l.LastSeq() != writers*per {
		t.Fatalf("LastSeq %d", l.LastSeq())
	}
}

func TestBeginRejectsBadInputWithoutWriting(t *testing.T) {
	l := openTest(t, t.TempDir(), Options{})
	evs := mkEvents(testOp(1), 1, "x")
	evs[0].AggID = ""
	if _, err := l.Begin(evs); err == nil {
		t.Fatal("Begin accepted an event with no aggregate id")
	}
	if l.LastSeq() != 0 {
		t.Fatalf("LastSeq %d after a refused Begin", l.LastSeq())
	}
	_ = l.Close()
	if _, err := l.Begin(mkEvents(testOp(2), 1, "y")); err == nil {
		t.Fatal("Begin after Close succeeded")
	}
}
