package api

import (
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"

	"github.com/sbxlog/sbxlog/executors/guest/silkd"
	"github.com/sbxlog/sbxlog/fsm"
	"github.com/sbxlog/sbxlog/projections/relay"
)

// The relay memory budget. Each relay holds buffers whose worst case a
// guest or a client can force (a silkd stream's frame buffers, the copy
// buffers of a relay that cannot splice), so without a bound a node's
// memory would be whatever its clients make it. Every relay reserves its
// worst case from one node-wide budget (DataPlane.RelayMemory) before it
// wakes or dials anything, and gives it back when it ends, however it ends;
// when the budget is spent the request is refused with 503 and Retry-After,
// the old daemon's answer to a node-wide capacity that is full for now (its
// concurrent-heal cap), before any upgrade.

// DefaultRelayMemory is DataPlane.RelayMemory's default: about 420 port
// relays or 470 buffered execs at their worst case at once, and any number of
// agent relays on the splice path, which reserve nothing once upgraded.
const DefaultRelayMemory = 512 << 20

// relayCopyMemory is what a relay on the copying path holds: one pooled
// copy buffer per direction.
const relayCopyMemory = 2 * relay.DefaultBuffer

// relayMemory is the worst case a relay of kind reserves before it opens:
//   - agent: the copy buffers (returned at the upgrade when both
//     directions splice, as a TCP client's to a unix guest do);
//   - port: a bounded silkd stream (the PortConn) and the copy buffers (a
//     PortConn never splices);
//   - exec: a bounded silkd stream (its output is under the separate
//     ExecNodeOutputCap);
//   - any other kind: the most of these.
func relayMemory(kind string) int64 {
	switch kind {
	case fsm.RelayAgent:
		return relayCopyMemory
	case fsm.RelayExec:
		return silkd.StreamConnMemory
	}
	return silkd.StreamConnMemory + relayCopyMemory
}

// MinRelayMemory is the smallest budget that admits a relay of every kind.
const MinRelayMemory = silkd.StreamConnMemory + relayCopyMemory

// errRelayMemory starts the refusal's message.
const errRelayMemory = "relay memory budget spent"

// relayBudget is the node's budget: bytes reserved by open relays, at most
// limit.
type relayBudget struct {
	limit   int64
	used    atomic.Int64
	metrics *Metrics
}

func newRelayBudget(limit int64, m *Metrics) *relayBudget {
	if limit <= 0 {
		limit = DefaultRelayMemory
	}
	m.relayMemoryBudget(limit)
	return &relayBudget{limit: limit, metrics: m}
}

// reserve takes n bytes for one relay, or refuses with 503 when the budget
// cannot hold them.
func (b *relayBudget) reserve(n int64) (*relayLease, error) {
	if used := b.used.Add(n); used > b.limit {
		b.used.Add(-n)
		b.metrics.relayRefused("memory")
		return nil, &httpError{
			status:     http.StatusServiceUnavailable,
			msg:        fmt.Sprintf("%s: open relays hold %d of the node's %d bytes, this relay needs %d", errRelayMemory, used-n, b.limit, n),
			retryAfter: "1",
		}
	}
	b.metrics.relayMemoryReserved(n)
	return &relayLease{b: b, n: n}, nil
}

// relayLease is one relay's reservation. Its methods are safe to call more
// than once and concurrently; release returns whatever is left.
type relayLease struct {
	b  *relayBudget
	mu sync.Mutex
	n  int64
}

// shrink gives back what the relay turned out not to need, keeping keep.
func (l *relayLease) shrink(keep int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if keep < l.n {
		l.give(l.n - keep)
		l.n = keep
	}
}

// release returns the reservation.
func (l *relayLease) release() { l.shrink(0) }

func (l *relayLease) give(n int64) {
	l.b.used.Add(-n)
	l.b.metrics.relayMemoryReserved(-n)
}

// RelayMemory reports the bytes open relays reserve and the node's budget.
func (s *Server) RelayMemory() (reserved, budget int64) {
	return s.data.mem.used.Load(), s.data.mem.limit
}
