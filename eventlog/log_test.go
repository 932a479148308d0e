package eventlog

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/cockroachdb/pebble/v2"

	"github.com/sbxlog/sbxlog/eventlog/event"
)

const testNode = "node-a"

func TestMain(m *testing.M) {
	if dir := os.Getenv(crashChildEnv); dir != "" {
		os.Exit(crashChild(dir))
	}
	os.Exit(m.Run())
}

// testOp returns an op id unique within a test.
func testOp(n uint64) event.OpID { return event.OpIDFromUint(1_700_000_000_000, n) }

// mkEvents builds n valid claim events of one op, with payloads naming tag.
func mkEvents(op event.OpID, n int, tag string) []event.Event {
	evs := make([]event.Event, n)
	for i := range evs {
		evs[i] = event.Event{
			Time:    int64(1000 + i),
			Type:    event.TypeClaimCreated,
			Version: 1,
			AggKind: event.AggClaim,
			AggID:   fmt.Sprintf("claim-%s-%d", tag, i),
			OpID:    op,
			Payload: []byte(fmt.Sprintf(`{"tag":%q,"i":%d}`, tag, i)),
		}
	}
	return evs
}

func openTest(t *testing.T, dir string, opts Options) *Log {
	t.Helper()
	if opts.NodeID == "" && !opts.ReadOnly {
		opts.NodeID = testNode
	}
	l, err := Open(dir, opts)
	if err != nil {
		t.Fatalf("Open(%s): %v", dir, err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

func mustAppend(t *testing.T, l *Log, evs []event.Event) AppendResult {
	t.Helper()
	res, err := l.Append(context.Background(), evs)
	if err != nil {
		t.Fatalf("Append: %v", err)
	}
	return res
}

func mustVerify(t *testing.T, l *Log) VerifyReport {
	t.Helper()
	rep, err := l.Verify()
	if err != nil {
		t.Fatalf("Verify: %v", err)
	}
	return rep
}

// sameEvent compares what the log promises to store.
func sameEvent(a, b event.Event) bool {
	return a.Seq == b.Seq && a.Node == b.Node && a.Time == b.Time && a.Type == b.Type &&
		a.Version == b.Version && a.AggKind == b.AggKind && a.AggID == b.AggID &&
		a.OpID == b.OpID && a.Causation == b.Causation && bytes.Equal(a.Payload, b.Payload)
}

func TestAppendAssignsSeqsAndSurvivesReopen(t *testing.T) {
	dir := t.TempDir()
	l := openTest(t, dir, Options{})
	if l.FirstSeq() != 1 || l.LastSeq() != 0 {
		t.Fatalf("fresh log: first %d last %d, want 1 0", l.FirstSeq(), l.LastSeq())
	}
	var want []event.Event
	for i, n := range []int{1, 3, 2} {
		in := mkEvents(testOp(uint64(i+1)), n, fmt.Sprint(i))
		in[0].Seq, in[0].Node = 99, "spoofed" // the log assigns both
		res := mustAppend(t, l, in)
		if res.Duplicate || len(res.Events) != n {
			t.Fatalf("append %d: %+v", i, res)
		}
		for j, ev := range res.Events {
			if wantSeq := uint64(len(want) + 1); ev.Seq != wantSeq || ev.Node != testNode {
				t.Fatalf("append %d event %d: seq %d node %q, want %d %q", i, j, ev.Seq, ev.Node, wantSeq, testNode)
			}
			want = append(want, ev)
		}
		if l.LastSeq() != uint64(len(want)) {
			t.Fatalf("LastSeq %d after append returned, want %d", l.LastSeq(), len(want))
		}
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l = openTest(t, dir, Options{})
	got, err := l.Read(0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Fatalf("read %d events after reopen, want %d", len(got), len(want))
	}
	for i := range want {
		if !sameEvent(got[i], want[i]) {
			t.Fatalf("event %d after reopen:\n got %+v\nwant %+v", i, got[i], want[i])
		}
	}
	if rep := mustVerify(t, l); rep.Events != 6 || rep.Ops != 3 || rep.Last != 6 {
		t.Fatalf("verify report %+v", rep)
	}
	if res := mustAppend(t, l, mkEvents(testOp(9), 1, "after")); res.Events[0].Seq != 7 {
		t.Fatalf("append after reopen got seq %d, want 7", res.Events[0].Seq)
	}
}

func TestAppendOwnsPayloads(t *testing.T) {
	l := openTest(t, t.TempDir(), Options{})
	sub, err := l.Subscribe(1)
	if err != nil {
		t.Fatal(err)
	}
	in := mkEvents(testOp(1), 1, "x")
	orig := string(in[0].Payload)
	mustAppend(t, l, in)
	in[0].Payload[0] = '#' // caller reuses its buffer
	ev, err := sub.Next(context.Background())
	if err != nil || string(ev.Payload) != orig {
		t.Fatalf("subscriber got %q (%v), want %q", ev.Payload, err, orig)
	}
}

func TestAppendDuplicateOpID(t *testing.T) {
	dir := t.TempDir()
	l := openTest(t, dir, Options{})
	mustAppend(t, l, mkEvents(testOp(1), 1, "first"))
	orig := mustAppend(t, l, mkEvents(testOp(2), 2, "orig"))
	check := func(l *Log) {
		t.Helper()
		// Different content, same op id: the original wins, nothing is written.
		res := mustAppend(t, l, mkEvents(testOp(2), 3, "retry"))
		if !res.Duplicate || len(res.Events) != 2 {
			t.Fatalf("retry: duplicate %v, %d events; want true, 2", res.Duplicate, len(res.Events))
		}
		for i := range res.Events {
			if !sameEvent(res.Events[i], orig.Events[i]) {
				t.Fatalf("retry event %d: got %+v, want original %+v", i, res.Events[i], orig.Events[i])
			}
		}
		if l.LastSeq() != 3 {
			t.Fatalf("LastSeq %d after duplicate, want 3", l.LastSeq())
		}
	}
	check(l) // op found in flight or in the index
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	check(openTest(t, dir, Options{})) // the index is durable
}

func TestConcurrentAppendsSameOpIDWriteOnce(t *testing.T) {
	l := openTest(t, t.TempDir(), Options{})
	const writers = 16
	results := make([]AppendResult, writers)
	var wg sync.WaitGroup
	for round := uint64(1); round <= 20; round++ {
		for w := range writers {
			wg.Go(func() {
				res, err := l.Append(context.Background(), mkEvents(testOp(round), 2, fmt.Sprint(w)))
				if err != nil {
					t.Error(err)
				}
				results[w] = res
			})
		}
		wg.Wait()
		fresh := 0
		for w, res := range results {
			if !res.Duplicate {
				fresh++
			}
			if len(res.Events) != 2 || res.Events[0].Seq != 2*round-1 || !sameEvent(res.Events[0], results[0].Events[0]) {
				t.Fatalf("round %d writer %d: %+v, want the one stored op at seq %d", round, w, res, 2*round-1)
			}
		}
		if fresh != 1 {
			t.Fatalf("round %d: %d writers stored the op, want exactly 1", round, fresh)
		}
	}
	if l.LastSeq() != 40 {
		t.Fatalf("LastSeq %d, want 40", l.LastSeq())
	}
	mustVerify(t, l)
}

func TestConcurrentAppendsAreContiguous(t *testing.T) {
	l := openTest(t, t.TempDir(), Options{RingSize: 64})
	const writers, perWriter = 32, 40
	var wg sync.WaitGroup
	var mu sync.Mutex
	seen := map[uint64]event.OpID{}
	for w := range writers {
		wg.Go(func() {
			for i := range perWriter {
				id := testOp(uint64(w*perWriter + i + 1))
				res, err := l.Append(context.Background(), mkEvents(id, 1+i%3, "c"))
				if err != nil {
					t.Error(err)
					return
				}
				if l.LastSeq() < res.Events[len(res.Events)-1].Seq {
					t.Errorf("LastSeq %d behind an acknowledged seq %d", l.LastSeq(), res.Events[len(res.Events)-1].Seq)
				}
				mu.Lock()
				for j, ev := range res.Events {
					if ev.Seq != res.Events[0].Seq+uint64(j) {
						t.Errorf("op %s not contiguous: %d at %d", id, ev.Seq, j)
					}
					if _, dup := seen[ev.Seq]; dup {
						t.Errorf("seq %d assigned twice", ev.Seq)
					}
					seen[ev.Seq] = id
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	total := uint64(len(seen))
	if l.LastSeq() != total {
		t.Fatalf("LastSeq %d, %d events acknowledged", l.LastSeq(), total)
	}
	for s := uint64(1); s <= total; s++ {
		if _, ok := seen[s]; !ok {
			t.Fatalf("seq %d never acknowledged", s)
		}
	}
	if rep := mustVerify(t, l); rep.Events != total || rep.Ops != writers*perWriter {
		t.Fatalf("verify %+v, want %d events %d ops", rep, total, writers*perWriter)
	}
}

func TestAppendRejectsBadInput(t *testing.T) {
	big := mkEvents(testOp(1), 1, "big")
	big[0].Payload = make([]byte, event.MaxPayload+1)
	mixed := append(mkEvents(testOp(1), 1, "a"), mkEvents(testOp(2), 1, "b")...)
	mutate := func(f func(*event.Event)) []event.Event {
		evs := mkEvents(testOp(1), 2, "bad")
		f(&evs[1])
		return evs
	}
	tests := []struct {
		name    string
		evs     []event.Event
		invalid error // sentinel inside *event.InvalidError
		plain   error // sentinel of this package
	}{
		{"unknown type", mutate(func(e *event.Event) { e.Type = 999 }), event.ErrUnknownType, nil},
		{"empty aggregate id", mutate(func(e *event.Event) { e.AggID = "" }), event.ErrEmptyAggregate, nil},
		{"payload over 1 MiB", big, event.ErrPayloadTooLarge, nil},
		{"zero op id", mutate(func(e *event.Event) { e.OpID = event.ZeroOpID }), event.ErrMissingOpID, nil},
		{"wrong aggregate kind", mutate(func(e *event.Event) { e.AggKind = event.AggVM }), event.ErrBadAggregate, nil},
		{"mixed op ids", mixed, nil, ErrMixedOpIDs},
		{"no events", nil, nil, ErrNoEvents},
	}
	dir := t.TempDir()
	l := openTest(t, dir, Options{})
	mustAppend(t, l, mkEvents(testOp(100), 1, "ok"))
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			res, err := l.Append(context.Background(), tc.evs)
			if err == nil || len(res.Events) != 0 {
				t.Fatalf("Append succeeded: %+v", res)
			}
			if tc.invalid != nil {
				var inv *event.InvalidError
				if !errors.As(err, &inv) || !errors.Is(err, tc.invalid) {
					t.Fatalf("error %v: want *event.InvalidError wrapping %v", err, tc.invalid)
				}
			}
			if tc.plain != nil && !errors.Is(err, tc.plain) {
				t.Fatalf("error %v: want %v", err, tc.plain)
			}
			if l.LastSeq() != 1 {
				t.Fatalf("LastSeq %d after a refused append, want 1", l.LastSeq())
			}
		})
	}
	// Nothing reached the disk: same single event and op after reopen, and
	// the refused op id is still free.
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l = openTest(t, dir, Options{})
	if rep := mustVerify(t, l); rep.Events != 1 || rep.Ops != 1 {
		t.Fatalf("after refused appends: %+v, want 1 event 1 op", rep)
	}
	if res := mustAppend(t, l, mkEvents(testOp(1), 1, "now valid")); res.Duplicate || res.Events[0].Seq != 2 {
		t.Fatalf("op id of a refused append: %+v", res)
	}
}

// rawSet writes key=value straight into the log's Pebble store, for tests
// that damage a log or fake another build's format.
func rawSet(t *testing.T, dir string, kvs ...[]byte) {
	t.Helper()
	db, err := pebble.Open(dir, &pebble.Options{Logger: pebbleLogger{}})
	if err != nil {
		t.Fatal(err)
	}
	b := db.NewBatch()
	for i := 0; i+1 < len(kvs); i += 2 {
		if kvs[i+1] == nil {
			_ = b.Delete(kvs[i], nil)
		} else {
			_ = b.Set(kvs[i], kvs[i+1], nil)
		}
	}
	if err := b.Commit(pebble.Sync); err != nil {
		t.Fatal(err)
	}
	if err := errors.Join(b.Close(), db.Close()); err != nil {
		t.Fatal(err)
	}
}

func TestOpenRefusesNewerFormat(t *testing.T) {
	dir := t.TempDir()
	l := openTest(t, dir, Options{})
	mustAppend(t, l, mkEvents(testOp(1), 1, "x"))
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	rawSet(t, dir, keyFormat, binary.BigEndian.AppendUint32(nil, FormatVersion+1))
	for _, ro := range []bool{false, true} {
		_, err := Open(dir, Options{NodeID: testNode, ReadOnly: ro})
		var fe *FormatError
		if !errors.As(err, &fe) || fe.OnDisk != FormatVersion+1 || fe.Supported != FormatVersion {
			t.Fatalf("read-only %v: error %v, want *FormatError{%d, %d}", ro, err, FormatVersion+1, FormatVersion)
		}
		for _, v := range []string{fmt.Sprintf("version %d", FormatVersion+1), fmt.Sprintf("version %d", FormatVersion)} {
			if !strings.Contains(err.Error(), v) {
				t.Fatalf("error %q does not name %q", err, v)
			}
		}
	}
}

func TestOpenRefusesOtherNode(t *testing.T) {
	dir := t.TempDir()
	l := openTest(t, dir, Options{})
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	_, err := Open(dir, Options{NodeID: "node-b"})
	var ne *NodeError
	if !errors.As(err, &ne) || ne.Stored != testNode || ne.Given != "node-b" {
		t.Fatalf("error %v, want *NodeError stored %q given node-b", err, testNode)
	}
	ro := openTest(t, dir, Options{ReadOnly: true})
	if ro.NodeID() != testNode {
		t.Fatalf("read-only open without NodeID uses %q, want the stored %q", ro.NodeID(), testNode)
	}
}

func TestOpenBadInput(t *testing.T) {
	if _, err := Open("", Options{NodeID: testNode}); err == nil {
		t.Fatal("empty dir accepted")
	}
	if _, err := Open(t.TempDir(), Options{}); err == nil || !strings.Contains(err.Error(), "NodeID") {
		t.Fatalf("missing NodeID: %v", err)
	}
	if _, err := Open(t.TempDir()+"/absent", Options{ReadOnly: true}); err == nil || !strings.Contains(err.Error(), "no log") {
		t.Fatalf("read-only open of a missing log: %v", err)
	}
	// A Pebble store that is not an op log.
	dir := t.TempDir()
	rawSet(t, dir, []byte("hello"), []byte("world"))
	if _, err := Open(dir, Options{NodeID: testNode}); err == nil || !strings.Contains(err.Error(), "not an sbxlog op log") {
		t.Fatalf("foreign store: %v", err)
	}
}

func TestReadOnlyAndClose(t *testing.T) {
	dir := t.TempDir()
	l := openTest(t, dir, Options{})
	mustAppend(t, l, mkEvents(testOp(1), 2, "x"))
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	ro := openTest(t, dir, Options{ReadOnly: true})
	if _, err := ro.Append(context.Background(), mkEvents(testOp(2), 1, "y")); !errors.Is(err, ErrReadOnly) {
		t.Fatalf("read-only append: %v", err)
	}
	if err := ro.SaveSnapshot(1, nil); !errors.Is(err, ErrReadOnly) {
		t.Fatalf("read-only snapshot: %v", err)
	}
	if evs, err := ro.Read(1, 10); err != nil || len(evs) != 2 {
		t.Fatalf("read-only read: %d events, %v", len(evs), err)
	}
	sub, err := ro.Subscribe(2)
	if err != nil {
		t.Fatal(err)
	}
	if ev, err := sub.Next(context.Background()); err != nil || ev.Seq != 2 {
		t.Fatalf("read-only subscribe: %+v %v", ev, err)
	}
	waiting := make(chan error, 1)
	go func() { _, err := sub.Next(context.Background()); waiting <- err }()
	if err := errors.Join(ro.Close(), ro.Close()); err != nil {
		t.Fatalf("Close twice: %v", err)
	}
	if err := <-waiting; !errors.Is(err, ErrClosed) {
		t.Fatalf("waiting Next after Close: %v", err)
	}
	calls := map[string]error{}
	_, calls["Append"] = ro.Append(context.Background(), mkEvents(testOp(3), 1, "z"))
	_, calls["Read"] = ro.Read(1, 1)
	calls["Iterate"] = ro.Iterate(1, 0, func(*event.Event) error { return nil })
	_, calls["Subscribe"] = ro.Subscribe(1)
	_, _, calls["LatestSnapshot"] = ro.LatestSnapshot()
	_, calls["Verify"] = ro.Verify()
	calls["TruncatePrefix"] = ro.TruncatePrefix(2)
	for name, err := range calls {
		if !errors.Is(err, ErrClosed) {
			t.Errorf("%s after Close: %v, want ErrClosed", name, err)
		}
	}
}

func TestReadAndIterateRanges(t *testing.T) {
	l := openTest(t, t.TempDir(), Options{})
	for i := range 10 {
		mustAppend(t, l, mkEvents(testOp(uint64(i+1)), 1, fmt.Sprint(i)))
	}
	seqs := func(evs []event.Event) []uint64 {
		var out []uint64
		for _, e := range evs {
			out = append(out, e.Seq)
		}
		return out
	}
	tests := []struct {
		from  uint64
		limit int
		want  string
	}{
		{0, 3, "[1 2 3]"},
		{8, 0, "[8 9 10]"},
		{8, 100, "[8 9 10]"},
		{10, 1, "[10]"},
		{11, 5, "[]"},
		{1000, 0, "[]"},
	}
	for _, tc := range tests {
		evs, err := l.Read(tc.from, tc.limit)
		if got := fmt.Sprint(seqs(evs)); err != nil || got != tc.want {
			t.Errorf("Read(%d, %d) = %s, %v; want %s", tc.from, tc.limit, got, err, tc.want)
		}
	}
	var got []uint64
	err := l.Iterate(3, 6, func(e *event.Event) error {
		got = append(got, e.Seq)
		return nil
	})
	if err != nil || fmt.Sprint(got) != "[3 4 5 6]" {
		t.Fatalf("Iterate(3, 6) = %v, %v", got, err)
	}
	stop := errors.New("stop")
	n := 0
	err = l.Iterate(0, 0, func(*event.Event) error {
		if n++; n == 2 {
			return stop
		}
		return nil
	})
	if !errors.Is(err, stop) || n != 2 {
		t.Fatalf("Iterate did not stop at the callback's error: n %d, %v", n, err)
	}
}

// Close while appends run: every append either succeeded (and survives a
// reopen) or failed with ErrClosed; nothing hangs.
func TestCloseDuringAppends(t *testing.T) {
	dir := t.TempDir()
	l, err := Open(dir, Options{NodeID: testNode})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	acked := map[event.OpID]uint64{}
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := uint64(0); ; i++ {
				id := testOp(uint64(w)<<32 | i)
				res, err := l.Append(context.Background(), mkEvents(id, 1, "x"))
				if errors.Is(err, ErrClosed) {
					return
				}
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				acked[id] = res.Events[0].Seq
				mu.Unlock()
			}
		})
	}
	waitFor(t, func() bool { return l.LastSeq() >= 200 })
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	l = openTest(t, dir, Options{})
	mustVerify(t, l)
	for id, seq := range acked {
		evs, err := l.Read(seq, 1)
		if err != nil || len(evs) != 1 || evs[0].OpID != id {
			t.Fatalf("acknowledged op %s at seq %d: %+v %v", id, seq, evs, err)
		}
	}
}

func TestAppendContextAndStats(t *testing.T) {
	l := openTest(t, t.TempDir(), Options{})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := l.Append(ctx, mkEvents(testOp(1), 1, "x")); !errors.Is(err, context.Canceled) {
		t.Fatalf("Append with a cancelled context: %v", err)
	}
	mustAppend(t, l, mkEvents(testOp(2), 3, "y"))
	st, err := l.Stats()
	if err != nil || st.FirstSeq != 1 || st.LastSeq != 3 || st.DiskBytes == 0 {
		t.Fatalf("Stats = %+v, %v", st, err)
	}
}

// An op-index probe made before an op with the same id was applied, staged
// after that op left inflight, must be repeated under commitMu rather than
// trusted: otherwise the op would be written twice.
func TestStaleProbeIsRepeated(t *testing.T) {
	l := openTest(t, t.TempDir(), Options{})
	l.commitMu.Lock()
	l.keepApplied = 0
	l.commitMu.Unlock()
	orig := mustAppend(t, l, mkEvents(testOp(1), 2, "orig"))
	mustAppend(t, l, mkEvents(testOp(2), 1, "prunes op 1"))

	// A request for op 1 whose probe ran before op 1 existed.
	req := &request{id: testOp(1), evs: l.own(mkEvents(testOp(1), 2, "retry"), 64, true), done: make(chan struct{}), seen: 0}
	if !l.gate.enter() {
		t.Fatal("closed")
	}
	p := &Pending{l: l, req: req, groups: l.enqueue(req)}
	res, err := p.Wait(context.Background())
	if err != nil || !res.Duplicate || len(res.Events) != 2 || res.Events[0].Seq != orig.Events[0].Seq {
		t.Fatalf("stale probe: %+v %v, want the original op as a duplicate", res, err)
	}
	if l.LastSeq() != 3 {
		t.Fatalf("LastSeq %d, want 3: the op was written twice", l.LastSeq())
	}
	mustVerify(t, l)
}
