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

// BeginNew skips the op-index probe but is otherwise an append: it is
// durable and readable, a later Begin of the same op id is answered as a
// duplicate by the index, and a concurrent BeginNew of the same id (a
// caller breaking the contract) is still caught by the in-flight table.
func TestBeginNewAppendsAndStaysDeduped(t *testing.T) {
	l := openTest(t, t.TempDir(), Options{})
	ctx := context.Background()
	p, err := l.BeginNew(mkEvents(testOp(1), 2, "new"))
	if err != nil {
		t.Fatal(err)
	}
	res, err := p.Wait(ctx)
	if err != nil || res.Duplicate || len(res.Events) != 2 || res.Events[0].Seq != 1 {
		t.Fatalf("BeginNew: %+v, %v", res, err)
	}
	again, err := l.Append(ctx, mkEvents(testOp(1), 2, "new"))
	if err != nil || !again.Duplicate || again.Events[0].Seq != 1 {
		t.Fatalf("Append of the same op id after BeginNew: duplicate=%v events=%v err=%v, want the original as a duplicate", again.Duplicate, again.Events, err)
	}
	// Two in flight at once: one write, one duplicate answer.
	a, err := l.BeginNew(mkEvents(testOp(2), 1, "twice"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := l.BeginNew(mkEvents(testOp(2), 1, "twice"))
	if err != nil {
		t.Fatal(err)
	}
	ra, errA := a.Wait(ctx)
	rb, errB := b.Wait(ctx)
	if errA != nil || errB != nil || ra.Duplicate || !rb.Duplicate || ra.Events[0].Seq != rb.Events[0].Seq {
		t.Fatalf("concurrent BeginNew of one op id: %+v %v / %+v %v, want one write and one duplicate", ra, errA, rb, errB)
	}
	if l.LastSeq() != 3 {
		t.Fatalf("LastSeq %d, want 3", l.LastSeq())
	}
}
