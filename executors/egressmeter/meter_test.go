package egressmeter

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/sbxlog/sbxlog/eventlog/event"
	"github.com/sbxlog/sbxlog/fsm"
	"github.com/sbxlog/sbxlog/fsm/egress"
)

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

type sink struct {
	mu      sync.Mutex
	batches [][]fsm.EgressUsage
	fail    error
}

func (s *sink) record(_ context.Context, u []fsm.EgressUsage) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail != nil {
		return s.fail
	}
	s.batches = append(s.batches, append([]fsm.EgressUsage(nil), u...))
	return nil
}

func (s *sink) all() []fsm.EgressUsage {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []fsm.EgressUsage
	for _, b := range s.batches {
		out = append(out, b...)
	}
	return out
}

type obs struct {
	mu        sync.Mutex
	decisions map[string]int
	tx, rx    int64
}

func (o *obs) EgressDecision(door string, allowed bool, reason string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.decisions[fmt.Sprintln(door, allowed, reason)]++
}

func (o *obs) EgressBytes(tx, rx int64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.tx += tx
	o.rx += rx
}

var (
	allow = egress.Decision{Allow: true}
	deny  = egress.Decision{Reason: egress.ReasonNoRule}
)

// One record per sandbox per interval, however many requests; a final one
// at Close.
func TestAggregatesPerSandbox(t *testing.T) {
	clk := &clock{t: time.Unix(1_790_000_000, 0)}
	s := &sink{}
	o := &obs{decisions: map[string]int{}}
	m := New(Options{Record: s.record, Observer: o, Now: clk.now})
	a, b := "sb_000000000000000a", "sb_000000000000000b"
	for range 1000 {
		m.Decision(a, DoorHTTP, allow)
		m.Transfer(a, 10, 100)
	}
	m.Decision(a, DoorConnect, deny)
	m.Decision(b, DoorSocks, allow)
	m.Transfer(b, 5, 0)
	m.Transfer(b, 0, 0)
	clk.add(time.Minute)
	if err := m.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	got := s.all()
	start := clk.t.Add(-time.Minute).UnixNano()
	want := []fsm.EgressUsage{
		{Claim: a, FromNS: start, ToNS: clk.t.UnixNano(), Tx: 10_000, Rx: 100_000, Allowed: 1000, Denied: 1},
		{Claim: b, FromNS: start, ToNS: clk.t.UnixNano(), Tx: 5, Allowed: 1},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("records\n%+v\nwant\n%+v", got, want)
	}
	if o.decisions["http true \n"] != 1000 || o.decisions["connect false no_rule\n"] != 1 || o.tx != 10_005 || o.rx != 100_000 {
		t.Fatalf("observer %+v %d %d", o.decisions, o.tx, o.rx)
	}
	// Next interval: b idle (forgotten), a moves; then a closes.
	m.Transfer(a, 1, 2)
	clk.add(30 * time.Second)
	m.Close(a)
	if err := m.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	got = s.all()[2:]
	end := clk.t.UnixNano()
	if len(got) != 1 || got[0] != (fsm.EgressUsage{Claim: a, FromNS: want[0].ToNS, ToNS: end, Tx: 1, Rx: 2, Final: true}) {
		t.Fatalf("after close: %+v", got)
	}
	if len(m.Open()) != 0 {
		t.Fatalf("still open: %v", m.Open())
	}
	// A sandbox closed with nothing counted still gets its final record.
	m.Close(b)
	_ = m.Flush(context.Background())
	if got := s.all(); len(got) != 4 || got[3].Claim != b || !got[3].Final {
		t.Fatalf("final of an idle sandbox: %+v", got)
	}
}

// A failed write keeps the records for the next flush; big flushes are
// written in batches the fsm accepts.
func TestFlushRetriesAndBatches(t *testing.T) {
	s := &sink{fail: errors.New("engine stopped")}
	m := New(Options{Record: s.record})
	m.Transfer("sb_0000000000000001", 1, 1)
	m.Close("sb_0000000000000002")
	if err := m.Flush(context.Background()); err == nil {
		t.Fatal("flush did not fail")
	}
	m.Transfer("sb_0000000000000001", 1, 1)
	s.fail = nil
	if err := m.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	var tx int64
	finals := 0
	for _, u := range s.all() {
		tx += u.Tx
		if u.Final {
			finals++
		}
	}
	if tx != 2 || finals != 1 {
		t.Fatalf("after retry: %+v", s.all())
	}
	n := fsm.MaxUsageBatch + 10
	for i := range n {
		m.Transfer(fmt.Sprintf("sb_%016x", i+100), 1, 0)
	}
	s.batches = nil
	if err := m.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if len(s.batches) != 2 || len(s.batches[0]) != fsm.MaxUsageBatch || len(s.all()) != n {
		t.Fatalf("%d batches, %d records", len(s.batches), len(s.all()))
	}
}

// Run flushes soon after a Close, without waiting for the interval.
func TestRunFlushesOnClose(t *testing.T) {
	s := &sink{}
	m := New(Options{Record: s.record, Every: time.Hour})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	done := make(chan struct{})
	go func() { m.Run(ctx, nil); close(done) }()
	m.Transfer("sb_0000000000000001", 3, 4)
	m.Close("sb_0000000000000001")
	deadline := time.Now().Add(5 * time.Second)
	for len(s.all()) == 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if got := s.all(); len(got) != 1 || !got[0].Final || got[0].Tx != 3 {
		t.Fatalf("records %+v", got)
	}
	cancel()
	<-done
}

// Counting from many goroutines loses nothing.
func TestConcurrent(t *testing.T) {
	s := &sink{}
	m := New(Options{Record: s.record})
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 2000 {
				id := fmt.Sprintf("sb_%016x", (g+i)%5)
				m.Transfer(id, 1, 2)
				m.Decision(id, DoorHTTP, allow)
				if i%500 == 0 {
					_ = m.Flush(context.Background())
				}
			}
		}()
	}
	wg.Wait()
	_ = m.Flush(context.Background())
	var tx, rx, n int64
	for _, u := range s.all() {
		tx, rx, n = tx+u.Tx, rx+u.Rx, n+u.Allowed
	}
	if tx != 16000 || rx != 32000 || n != 16000 {
		t.Fatalf("tx %d rx %d allowed %d", tx, rx, n)
	}
}

// logSink records as the node's log does: each batch decided by the fsm
// (RecordEgressUsage's checks, the whole batch refused when one record is
// invalid), plus the claims a test makes it refuse as invalid too.
type logSink struct {
	sink
	refuse map[string]bool
	calls  int
}

func (s *logSink) record(ctx context.Context, u []fsm.EgressUsage) error {
	s.mu.Lock()
	s.calls++
	for _, r := range u {
		if s.refuse[r.Claim] {
			s.mu.Unlock()
			return &fsm.Rejection{Code: fsm.Invalid, Msg: "usage of " + r.Claim + ": refused"}
		}
	}
	s.mu.Unlock()
	if _, err := fsm.Decide(fsm.New(), fsm.RecordEgressUsage{Meta: fsm.Meta{Op: event.OpIDFromUint(1, 1), Now: 1}, Usage: u}); err != nil {
		return err
	}
	return s.sink.record(ctx, u)
}

// A decision or bytes of no sandbox (a warm VM's door) make no record, so
// nothing the log refuses as invalid; the Observer still sees them.
func TestNoRecordWithoutASandbox(t *testing.T) {
	s := &logSink{}
	o := &obs{decisions: map[string]int{}}
	m := New(Options{Record: s.record, Observer: o})
	for _, id := range []string{"", "vm-0000000000000001", "sb_nothex"} {
		m.Decision(id, DoorHTTP, deny)
		m.Transfer(id, 3, 4)
		m.Close(id)
	}
	m.Decision("sb_0000000000000001", DoorHTTP, allow)
	if got := m.Open(); len(got) != 1 || got[0] != "sb_0000000000000001" {
		t.Fatalf("open %v", got)
	}
	if err := m.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := s.all(); len(got) != 1 || got[0].Claim != "sb_0000000000000001" || got[0].Allowed != 1 {
		t.Fatalf("records %+v", got)
	}
	if o.decisions["http false no_rule\n"] != 3 || o.tx != 9 || o.rx != 12 {
		t.Fatalf("observer %+v %d %d", o.decisions, o.tx, o.rx)
	}
}

// A record the log refuses as invalid is dropped (and logged), the rest of
// its batch written; the next flush does not try it again. Any other
// failure keeps everything.
func TestFlushDropsInvalid(t *testing.T) {
	const bad = "sb_00000000000000ff"
	var logged bytes.Buffer
	s := &logSink{refuse: map[string]bool{bad: true}}
	m := New(Options{Record: s.record, Log: zerolog.New(&logged)})
	for _, id := range []string{"sb_0000000000000001", bad, "sb_0000000000000002"} {
		m.Transfer(id, 1, 1)
	}
	m.Close("sb_0000000000000003")
	if err := m.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	var claims []string
	for _, u := range s.all() {
		claims = append(claims, u.Claim)
	}
	if fmt.Sprint(claims) != "[sb_0000000000000003 sb_0000000000000001 sb_0000000000000002]" {
		t.Fatalf("recorded %v", claims)
	}
	if !strings.Contains(logged.String(), bad) || !strings.Contains(logged.String(), "dropped") {
		t.Fatalf("log %q", logged.String())
	}
	s.calls = 0
	if err := m.Flush(context.Background()); err != nil || s.calls != 0 {
		t.Fatalf("second flush: %v, %d calls (the dropped record held)", err, s.calls)
	}
	// A failure that is not a rejection while writing one by one keeps
	// the records not yet written.
	m.Transfer(bad, 1, 1)
	m.Transfer("sb_0000000000000004", 5, 5)
	s.mu.Lock()
	s.fail = errors.New("engine stopped")
	s.mu.Unlock()
	if err := m.Flush(context.Background()); err == nil {
		t.Fatal("flush did not fail")
	}
	s.mu.Lock()
	s.fail = nil
	s.mu.Unlock()
	if err := m.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := s.all(); len(got) != 4 || got[3].Claim != "sb_0000000000000004" || got[3].Tx != 5 {
		t.Fatalf("after the failure: %+v", got)
	}
}
