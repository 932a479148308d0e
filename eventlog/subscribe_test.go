package eventlog

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/sbxlog/sbxlog/eventlog/event"
)

// collect reads n events from sub and checks they run from seq from on
// without a gap.
func collect(t *testing.T, sub *Subscription, from uint64, n int) []event.Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out := make([]event.Event, 0, n)
	for i := range n {
		ev, err := sub.Next(ctx)
		if err != nil {
			t.Fatalf("Next after %d events: %v", i, err)
		}
		if want := from + uint64(i); ev.Seq != want {
			t.Fatalf("Next delivered seq %d, want %d", ev.Seq, want)
		}
		out = append(out, ev)
	}
	return out
}

func TestSubscribeCatchesUpAndFollows(t *testing.T) {
	tests := []struct {
		name     string
		ringSize int
		from     uint64
	}{
		{"from the start, ring holds all", 4096, 0},
		{"from the middle, tiny ring forces Pebble reads", 4, 5},
		{"from the future", 16, 150},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			l := openTest(t, t.TempDir(), Options{RingSize: tc.ringSize})
			for i := range 50 {
				mustAppend(t, l, mkEvents(testOp(uint64(i+1)), 2, "before"))
			}
			sub, err := l.Subscribe(tc.from)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(sub.Close)
			// Keep appending from several writers while the subscriber
			// catches up: it must still see every event once, in order.
			var wg sync.WaitGroup
			for w := range 4 {
				wg.Go(func() {
					for i := range 25 {
						if _, err := l.Append(context.Background(), mkEvents(testOp(uint64(1000+w*100+i)), 1, "during")); err != nil {
							t.Error(err)
						}
					}
				})
			}
			from := max(tc.from, 1)
			got := collect(t, sub, from, int(200-from+1))
			wg.Wait()
			stored, err := l.Read(from, 0)
			if err != nil {
				t.Fatal(err)
			}
			if len(stored) != len(got) {
				t.Fatalf("subscriber saw %d events, log holds %d from %d", len(got), len(stored), from)
			}
			for i := range got {
				if !sameEvent(got[i], stored[i]) {
					t.Fatalf("event %d differs:\n sub %+v\n log %+v", got[i].Seq, got[i], stored[i])
				}
			}
		})
	}
}

// A subscriber that does not read never slows appends down, and when it
// resumes it gets everything, from Pebble, even though the ring has wrapped
// many times.
func TestSlowSubscriberNeverBlocksOrLoses(t *testing.T) {
	l := openTest(t, t.TempDir(), Options{RingSize: 8})
	sub, err := l.Subscribe(1)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	collect(t, sub, 1, 0)
	const n = 500
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range n {
			if _, err := l.Append(context.Background(), mkEvents(testOp(uint64(i+1)), 1, "x")); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("appends blocked behind an idle subscriber")
	}
	collect(t, sub, 1, n)
}

func TestSubscriptionEndings(t *testing.T) {
	l := openTest(t, t.TempDir(), Options{})
	mustAppend(t, l, mkEvents(testOp(1), 1, "x"))

	sub, err := l.Subscribe(2)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := sub.Next(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Next with a cancelled context: %v", err)
	}
	res := make(chan error, 1)
	go func() { _, err := sub.Next(context.Background()); res <- err }()
	sub.Close()
	sub.Close()
	if err := <-res; !errors.Is(err, ErrClosed) {
		t.Fatalf("Next after Subscription.Close: %v", err)
	}
}

func TestSnapshotsAndTruncation(t *testing.T) {
	dir := t.TempDir()
	l := openTest(t, dir, Options{RingSize: 4})
	if _, _, err := l.LatestSnapshot(); !errors.Is(err, ErrNoSnapshot) {
		t.Fatalf("LatestSnapshot of a new log: %v", err)
	}
	for i := range 10 { // ops of 2 events: seqs 1..20
		mustAppend(t, l, mkEvents(testOp(uint64(i+1)), 2, fmt.Sprint(i)))
	}
	if err := l.TruncatePrefix(5); !errors.Is(err, ErrNoSnapshot) {
		t.Fatalf("truncate without a snapshot: %v", err)
	}
	if err := l.SaveSnapshot(21, []byte("future")); err == nil {
		t.Fatal("snapshot past LastSeq accepted")
	}
	for _, s := range []uint64{4, 8, 12} {
		if err := l.SaveSnapshot(s, []byte(fmt.Sprintf("state@%d", s))); err != nil {
			t.Fatal(err)
		}
	}
	if seq, data, err := l.LatestSnapshot(); err != nil || seq != 12 || string(data) != "state@12" {
		t.Fatalf("LatestSnapshot = %d %q %v", seq, data, err)
	}
	if err := l.TruncatePrefix(14); err == nil {
		t.Fatal("truncation past the snapshot accepted")
	}
	// Truncate in the middle of op 5 (seqs 9..10): the tail stays readable.
	if err := l.TruncatePrefix(10); err != nil {
		t.Fatal(err)
	}
	if l.FirstSeq() != 10 || l.LastSeq() != 20 {
		t.Fatalf("after truncation first %d last %d", l.FirstSeq(), l.LastSeq())
	}
	if _, err := l.Read(9, 1); !errors.Is(err, ErrCompacted) {
		t.Fatalf("Read below FirstSeq: %v", err)
	}
	if _, err := l.Subscribe(3); !errors.Is(err, ErrCompacted) {
		t.Fatalf("Subscribe below FirstSeq: %v", err)
	}
	if res, err := l.Append(context.Background(), mkEvents(testOp(2), 2, "retry")); !errors.Is(err, ErrCompacted) || !res.Duplicate {
		t.Fatalf("retry of a truncated op: %+v %v", res, err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}

	l = openTest(t, dir, Options{})
	if l.FirstSeq() != 10 || l.LastSeq() != 20 {
		t.Fatalf("after reopen first %d last %d", l.FirstSeq(), l.LastSeq())
	}
	// The snapshot at 8 needed event 9, so it went with the prefix.
	if rep := mustVerify(t, l); rep.Events != 11 || rep.Snapshots != 1 {
		t.Fatalf("verify after truncation: %+v, want 11 events and the snapshot at 12", rep)
	}
	sub, err := l.Subscribe(0)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	collect(t, sub, 10, 11)
	// A subscriber past the truncated prefix is unaffected.
	if err := l.TruncatePrefix(13); err != nil {
		t.Fatal(err)
	}
	mustAppend(t, l, mkEvents(testOp(50), 1, "after"))
	collect(t, sub, 21, 1)
}

func TestSnapshotKeepsPreviousAndSkipsCorrupt(t *testing.T) {
	dir := t.TempDir()
	l := openTest(t, dir, Options{})
	for i := range 5 {
		mustAppend(t, l, mkEvents(testOp(uint64(i+1)), 1, "x"))
	}
	for s := uint64(1); s <= 5; s++ {
		if err := l.SaveSnapshot(s, []byte(fmt.Sprint(s))); err != nil {
			t.Fatal(err)
		}
	}
	if rep := mustVerify(t, l); rep.Snapshots != 2 {
		t.Fatalf("%d snapshots kept, want the newest 2", rep.Snapshots)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	rawSet(t, dir, appendSeqKey(nil, prefixSnapshot, 5), []byte("\x00\x00\x00\x00garbage"))
	l = openTest(t, dir, Options{})
	if seq, data, err := l.LatestSnapshot(); err != nil || seq != 4 || string(data) != "4" {
		t.Fatalf("with the newest snapshot corrupt: %d %q %v, want the previous one", seq, data, err)
	}
	var ce *CorruptError
	if _, err := l.Verify(); !errors.As(err, &ce) || ce.Seq != 5 {
		t.Fatalf("Verify with a corrupt snapshot: %v", err)
	}
}
