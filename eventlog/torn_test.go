package eventlog

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/sbxlog/sbxlog/eventlog/eventlogtest"
)

// TestTornTailRecoversToLastDurable holds WAL syncs while appends are in
// flight, takes crash images of the filesystem at that moment (keeping none,
// all, or a random half of the unsynced blocks), and checks each image
// recovers to a contiguous prefix that contains every acknowledged append and
// no partial op. It also checks the live log never exposes the unsynced
// appends to readers or subscribers, then lets them finish.
func TestTornTailRecoversToLastDurable(t *testing.T) {
	mem := vfs.NewCrashableMem()
	gfs := eventlogtest.NewSyncGateFS(mem)
	l := openTest(t, "/log", Options{FS: gfs})
	const durable = 5
	for i := range durable {
		mustAppend(t, l, mkEvents(testOp(uint64(i+1)), 1, "synced"))
	}
	sub, err := l.Subscribe(durable + 1)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()

	release := arm(t, gfs)
	var wg sync.WaitGroup
	pending := []int{2, 3, 1} // event counts of the unsynced ops
	for i, n := range pending {
		wg.Go(func() {
			res, err := l.Append(context.Background(), mkEvents(testOp(uint64(100+i)), n, "pending"))
			if err != nil || len(res.Events) != n {
				t.Errorf("pending append %d: %+v %v", i, res, err)
			}
		})
		if i == 0 {
			<-gfs.Blocked // the first op is in the WAL file, its sync held
		}
	}
	// The later ops are in Pebble (or its WAL buffer) but not synced.
	waitFor(t, func() bool {
		l.commitMu.Lock()
		defer l.commitMu.Unlock()
		return l.next == durable+1+6
	})

	// Readers see only durable events.
	if l.LastSeq() != durable {
		t.Fatalf("LastSeq %d while the sync is held, want %d", l.LastSeq(), durable)
	}
	if evs, err := l.Read(durable+1, 0); err != nil || len(evs) != 0 {
		t.Fatalf("Read returned %d unsynced events (%v)", len(evs), err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	if ev, err := sub.Next(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("subscriber got an unsynced event: %+v %v", ev, err)
	}
	cancel()

	rng := rand.New(rand.NewPCG(1, 2))
	images := []struct {
		name    string
		cfg     vfs.CrashCloneCfg
		minLast uint64
	}{
		{"only synced data", vfs.CrashCloneCfg{}, durable},
		{"all written data", vfs.CrashCloneCfg{UnsyncedDataPercent: 100, RNG: rng}, durable + 2},
	}
	for i := range 20 {
		images = append(images, struct {
			name    string
			cfg     vfs.CrashCloneCfg
			minLast uint64
		}{fmt.Sprintf("random half %d", i), vfs.CrashCloneCfg{UnsyncedDataPercent: 50, RNG: rng}, durable})
	}
	for _, img := range images {
		t.Run(img.name, func(t *testing.T) {
			clone := mem.CrashClone(img.cfg)
			cl := openTest(t, "/log", Options{FS: clone})
			last := cl.LastSeq()
			t.Logf("recovered to seq %d", last)
			if last < img.minLast || last > durable+6 {
				t.Fatalf("recovered LastSeq %d, want %d..%d", last, img.minLast, durable+6)
			}
			if img.cfg.UnsyncedDataPercent == 0 && last != durable {
				t.Fatalf("only synced data kept, but %d events recovered (want %d)", last, durable)
			}
			// Contiguous, checksummed, every op whole.
			rep := mustVerify(t, cl)
			evs, err := cl.Read(1, 0)
			if err != nil || uint64(len(evs)) != last || rep.Events != last {
				t.Fatalf("read %d events (%v), verify saw %d, LastSeq %d", len(evs), err, rep.Events, last)
			}
			for i, ev := range evs[:durable] {
				if string(ev.Payload) != string(mkEvents(testOp(uint64(i+1)), 1, "synced")[0].Payload) {
					t.Fatalf("acknowledged event %d lost or changed: %+v", i+1, ev)
				}
			}
			res := mustAppend(t, cl, mkEvents(testOp(999), 1, "after crash"))
			if res.Events[0].Seq != last+1 {
				t.Fatalf("append after recovery got seq %d, want %d", res.Events[0].Seq, last+1)
			}
		})
	}

	release()
	wg.Wait()
	if l.LastSeq() != durable+6 {
		t.Fatalf("LastSeq %d after the syncs completed, want %d", l.LastSeq(), durable+6)
	}
	collect(t, sub, durable+1, 6)
	mustVerify(t, l)
}

// arm arms the gate and makes sure a failing test does not leave appends
// blocked (Close waits for them).
func arm(t *testing.T, g *eventlogtest.SyncGateFS) func() {
	release := g.Arm()
	t.Cleanup(release)
	return release
}

// waitFor polls cond until it holds or a deadline passes.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached within 10s")
		}
		time.Sleep(time.Millisecond)
	}
}

// A failed WAL sync poisons the log: the append reports it, nothing after it
// is acknowledged or published, and a reopen recovers what is on disk.
func TestSyncFailurePoisonsLog(t *testing.T) {
	mem := vfs.NewCrashableMem()
	ffs := &failSyncFS{FS: mem}
	l := openTest(t, "/log", Options{FS: ffs})
	mustAppend(t, l, mkEvents(testOp(1), 1, "ok"))
	ffs.fail.Store(true)
	if _, err := l.Append(context.Background(), mkEvents(testOp(2), 1, "lost")); !errors.Is(err, ErrFailed) {
		t.Fatalf("append with a failing sync: %v, want ErrFailed", err)
	}
	ffs.fail.Store(false)
	if _, err := l.Append(context.Background(), mkEvents(testOp(3), 1, "after")); !errors.Is(err, ErrFailed) {
		t.Fatalf("append after a failed sync: %v, want ErrFailed", err)
	}
	if l.LastSeq() != 1 {
		t.Fatalf("LastSeq %d after a failed sync, want 1", l.LastSeq())
	}
	_ = l.Close()
	cl := openTest(t, "/log", Options{FS: mem.CrashClone(vfs.CrashCloneCfg{})})
	if cl.LastSeq() != 1 {
		t.Fatalf("recovered LastSeq %d, want 1", cl.LastSeq())
	}
	mustAppend(t, cl, mkEvents(testOp(4), 1, "recovered"))
}

var _ vfs.FS = (*failSyncFS)(nil)

// failSyncFS fails WAL syncs while fail is set.
type failSyncFS struct {
	vfs.FS
	fail atomic.Bool
}

func (f *failSyncFS) Create(name string, c vfs.DiskWriteCategory) (vfs.File, error) {
	file, err := f.FS.Create(name, c)
	if err != nil || !strings.HasSuffix(name, ".log") {
		return file, err
	}
	return &failSyncFile{File: file, fs: f}, nil
}

type failSyncFile struct {
	vfs.File
	fs *failSyncFS
}

var errInjected = errors.New("injected sync failure")

func (f *failSyncFile) Sync() error {
	if f.fs.fail.Load() {
		return errInjected
	}
	return f.File.Sync()
}

func (f *failSyncFile) SyncData() error { return f.Sync() }
