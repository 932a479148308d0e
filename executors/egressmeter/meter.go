// Package egressmeter is the accounting of guarded egress: the proxy
// reports each decision and the bytes it moves, the meter adds them up per
// sandbox in memory and writes one usage record per sandbox per interval,
// and a final one when the sandbox's accounting ends (Close: the proxy
// closed its VM's doors once the VM no longer serves it, on its release
// or destroy; a hibernate, a restart or a process stop is not an end) —
// never one per request (the old daemon's per-request billing line rotated its
// journal in minutes under a busy guest and evicted other sandboxes'
// records).
//
// Contract:
//   - Decision, Transfer and Close are safe for concurrent use and cheap
//     (atomic adds under a read-locked map lookup); Observer, when set, sees
//     every decision and every byte count as it happens (the metrics).
//   - Only a claim id (fsm.ValidClaimID) is counted: a decision or bytes
//     of no sandbox (a warm VM's door, "") reach the Observer only, so no
//     record the log would refuse is ever made.
//   - Flush hands the records of every sandbox with something to record
//     (plus the final records of closed ones) to Options.Record, at most
//     fsm.MaxUsageBatch at a time; a failed Record keeps them for the next
//     Flush. A batch the log rejects as invalid (fsm.ErrInvalid) is
//     written again one record at a time, and each record it still
//     rejects is dropped and logged: one bad record never holds back the
//     node's accounting. Run flushes every Options.Every and soon after a
//     Close.
//   - Bytes that arrive after a sandbox's Close go into a later record of
//     the same sandbox; a crash loses at most the interval not yet
//     flushed.
package egressmeter

import (
	"context"
	"errors"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/sbxlog/sbxlog/fsm"
	"github.com/sbxlog/sbxlog/fsm/egress"
)

// DefaultEvery is Options.Every's default.
const DefaultEvery = time.Minute

// Doors name where a decision was taken (the Observer's door label).
const (
	DoorHTTP    = "http"    // the forward proxy door
	DoorConnect = "connect" // a CONNECT tunnel
	DoorSocks   = "socks"   // the SOCKS5 door
	DoorInner   = "inner"   // a request inside an intercepted tunnel
)

// Observer sees decisions and bytes as they happen.
type Observer interface {
	EgressDecision(door string, allowed bool, reason string)
	EgressBytes(tx, rx int64)
}

// Options configure a Meter.
type Options struct {
	// Every is the flush interval (default DefaultEvery).
	Every time.Duration
	// Record writes usage records (the node proposes them as
	// fsm.RecordEgressUsage). Required for Flush to write anything.
	Record func(ctx context.Context, usage []fsm.EgressUsage) error
	// Observer, when set, sees every decision and byte count.
	Observer Observer
	// Now is the clock (default time.Now).
	Now func() time.Time
	// Log says which records were dropped (default: nowhere).
	Log zerolog.Logger
}

type counter struct {
	tx, rx, allowed, denied atomic.Int64
	from                    int64 // start of the interval, under Meter.mu
}

// Meter aggregates egress per sandbox. Create with New.
type Meter struct {
	o    Options
	mu   sync.RWMutex
	sb   map[string]*counter
	held []fsm.EgressUsage // records taken but not yet written, finals included
	kick chan struct{}
}

// New returns a meter.
func New(o Options) *Meter {
	if o.Every <= 0 {
		o.Every = DefaultEvery
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return &Meter{o: o, sb: map[string]*counter{}, kick: make(chan struct{}, 1)}
}

// add runs fn on sandbox's counter under the meter's lock (shared), so a
// Flush that forgets an idle counter never races an add into it.
func (m *Meter) add(sandbox string, fn func(*counter)) {
	m.mu.RLock()
	if c := m.sb[sandbox]; c != nil {
		fn(c)
		m.mu.RUnlock()
		return
	}
	m.mu.RUnlock()
	m.mu.Lock()
	defer m.mu.Unlock()
	c := m.sb[sandbox]
	if c == nil {
		c = &counter{from: m.o.Now().UnixNano()}
		m.sb[sandbox] = c
	}
	fn(c)
}

// Decision counts one decision of sandbox's proxy at door.
func (m *Meter) Decision(sandbox, door string, d egress.Decision) {
	if fsm.ValidClaimID(sandbox) {
		m.add(sandbox, func(c *counter) {
			if d.Allow {
				c.allowed.Add(1)
			} else {
				c.denied.Add(1)
			}
		})
	}
	if m.o.Observer != nil {
		m.o.Observer.EgressDecision(door, d.Allow, string(d.Reason))
	}
}

// Transfer adds payload bytes sandbox's proxy moved: tx from the guest
// towards the destination, rx back.
func (m *Meter) Transfer(sandbox string, tx, rx int64) {
	if tx <= 0 && rx <= 0 {
		return
	}
	if fsm.ValidClaimID(sandbox) {
		m.add(sandbox, func(c *counter) {
			c.tx.Add(max(tx, 0))
			c.rx.Add(max(rx, 0))
		})
	}
	if m.o.Observer != nil {
		m.o.Observer.EgressBytes(max(tx, 0), max(rx, 0))
	}
}

// Close ends sandbox's accounting (it was released or destroyed, and its
// proxy's doors closed): its remainder is written as its final record at
// the next flush, which Run does soon.
func (m *Meter) Close(sandbox string) {
	if !fsm.ValidClaimID(sandbox) {
		return
	}
	now := m.o.Now().UnixNano()
	m.mu.Lock()
	c := m.sb[sandbox]
	delete(m.sb, sandbox)
	u := fsm.EgressUsage{Claim: sandbox, FromNS: now, ToNS: now, Final: true}
	if c != nil {
		u = take(sandbox, c, now)
		u.Final = true
	}
	m.held = append(m.held, u)
	m.mu.Unlock()
	select {
	case m.kick <- struct{}{}:
	default:
	}
}

// take reads and resets c's counts into a record ending at now.
func take(sandbox string, c *counter, now int64) fsm.EgressUsage {
	u := fsm.EgressUsage{Claim: sandbox, FromNS: c.from, ToNS: max(now, c.from),
		Tx: c.tx.Swap(0), Rx: c.rx.Swap(0), Allowed: c.allowed.Swap(0), Denied: c.denied.Swap(0)}
	c.from = u.ToNS
	return u
}

// Flush writes every sandbox's usage since the last flush. Sandboxes with
// nothing to record are skipped, and those idle since then forgotten (a
// later decision starts them again).
func (m *Meter) Flush(ctx context.Context) error {
	now := m.o.Now().UnixNano()
	m.mu.Lock()
	out := m.held
	m.held = nil
	for _, id := range slices.Sorted(maps.Keys(m.sb)) {
		c := m.sb[id]
		u := take(id, c, now)
		if u.Tx == 0 && u.Rx == 0 && u.Allowed == 0 && u.Denied == 0 {
			delete(m.sb, id)
			continue
		}
		out = append(out, u)
	}
	m.mu.Unlock()
	if len(out) == 0 || m.o.Record == nil {
		return nil
	}
	for len(out) > 0 {
		n := min(len(out), fsm.MaxUsageBatch)
		err := m.o.Record(ctx, out[:n])
		if errors.Is(err, fsm.ErrInvalid) {
			var done int
			done, err = m.recordEach(ctx, out[:n])
			if err != nil {
				out = out[done:]
			}
		}
		if err != nil {
			m.mu.Lock()
			m.held = append(out, m.held...)
			m.mu.Unlock()
			return err
		}
		out = out[n:]
	}
	return nil
}

// recordEach writes batch one record at a time after the log rejected it
// whole as invalid, dropping (and logging) each record it rejects again.
// On another error it returns how many records are done (written or
// dropped); the rest are to be kept.
func (m *Meter) recordEach(ctx context.Context, batch []fsm.EgressUsage) (int, error) {
	for i, u := range batch {
		err := m.o.Record(ctx, []fsm.EgressUsage{u})
		switch {
		case errors.Is(err, fsm.ErrInvalid):
			m.o.Log.Error().Err(err).Str("claim", u.Claim).Int64("tx", u.Tx).Int64("rx", u.Rx).
				Int64("allowed", u.Allowed).Int64("denied", u.Denied).Bool("final", u.Final).
				Msg("egress usage record refused by the log as invalid; dropped")
		case err != nil:
			return i, err
		}
	}
	return len(batch), nil
}

// Run flushes every Options.Every, and shortly after a Close, until ctx
// ends; errors go to onErr (nil: dropped, the records kept for the next
// flush).
func (m *Meter) Run(ctx context.Context, onErr func(error)) {
	t := time.NewTicker(m.o.Every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-m.kick:
		}
		if err := m.Flush(ctx); err != nil && onErr != nil && ctx.Err() == nil {
			onErr(err)
		}
	}
}

// Open returns the sandboxes being counted, sorted (for tests and views).
func (m *Meter) Open() []string {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return slices.Sorted(maps.Keys(m.sb))
}
