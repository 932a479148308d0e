package eventlog

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/sbxlog/sbxlog/eventlog/eventlogtest"
)

// WaitDurable answers at once for what is durable, waits for what is only
// queued (its WAL sync held) until the sync completes, and gives up with
// ctx or when the log closes.
func TestWaitDurable(t *testing.T) {
	gfs := eventlogtest.NewSyncGateFS(vfs.NewCrashableMem())
	l := openTest(t, "/log", Options{FS: gfs})
	mustAppend(t, l, mkEvents(testOp(1), 2, "synced"))
	if err := l.WaitDurable(context.Background(), 2); err != nil {
		t.Fatalf("durable seq: %v", err)
	}

	release := arm(t, gfs)
	appended := make(chan error, 1)
	go func() {
		_, err := l.Append(context.Background(), mkEvents(testOp(2), 1, "held"))
		appended <- err
	}()
	select {
	case <-gfs.Blocked:
	case <-time.After(10 * time.Second):
		t.Fatal("the append's sync never reached the gate")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := l.WaitDurable(ctx, 3); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("seq 3 with its sync held: %v, want the context's deadline", err)
	}
	done := make(chan error, 1)
	go func() { done <- l.WaitDurable(context.Background(), 3) }()
	select {
	case err := <-done:
		t.Fatalf("WaitDurable returned %v before the sync", err)
	case <-time.After(20 * time.Millisecond):
	}
	release()
	if err := <-done; err != nil {
		t.Fatalf("after the sync: %v", err)
	}
	if err := <-appended; err != nil {
		t.Fatal(err)
	}
	if l.LastSeq() != 3 {
		t.Fatalf("LastSeq %d", l.LastSeq())
	}

	go func() { done <- l.WaitDurable(context.Background(), 10) }()
	time.Sleep(10 * time.Millisecond) // let it block: nothing will make seq 10 durable
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, ErrClosed) {
		t.Fatalf("on close: %v, want ErrClosed", err)
	}
}
