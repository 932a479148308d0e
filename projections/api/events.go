package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/sbxlog/sbxlog/eventlog/event"
	"github.com/sbxlog/sbxlog/fsm"
	"github.com/sbxlog/sbxlog/projections/auth"
	"github.com/sbxlog/sbxlog/projections/sse"
)

// EventJSON is one op-log event as /v1/events sends it in `data:`.
type EventJSON struct {
	Seq       uint64          `json:"seq"`
	Node      string          `json:"node"`
	Time      string          `json:"time"`
	Type      string          `json:"type"`
	Version   uint16          `json:"version"`
	Aggregate AggregateJSON   `json:"aggregate"`
	OpID      string          `json:"op_id"`
	Causation string          `json:"causation,omitempty"`
	Payload   json.RawMessage `json:"payload"`
}

// AggregateJSON names an event's aggregate.
type AggregateJSON struct {
	Kind string `json:"kind"`
	ID   string `json:"id"`
}

// EncodeEvent renders an event for /v1/events and `sbxctl log dump --json`.
func EncodeEvent(e *event.Event) EventJSON {
	out := EventJSON{
		Seq: e.Seq, Node: e.Node, Time: time.Unix(0, e.Time).UTC().Format(time.RFC3339Nano),
		Type: e.Type.String(), Version: e.Version,
		Aggregate: AggregateJSON{Kind: e.AggKind.String(), ID: e.AggID},
		OpID:      e.OpID.String(), Payload: json.RawMessage(e.Payload),
	}
	if e.Causation != event.ZeroOpID {
		out.Causation = e.Causation.String()
	}
	if len(out.Payload) == 0 || !json.Valid(out.Payload) {
		out.Payload = json.RawMessage("null")
	}
	return out
}

// writeTimeout bounds one SSE write: a client that stops reading is
// disconnected instead of pinning a goroutine (it can resume by cursor).
const writeTimeout = 30 * time.Second

// handleEvents serves the op log as SSE, or the VM view with ?view=vms.
//
// Cursor: Last-Event-ID (resume after it) or ?from=N (start at N); with
// neither the stream starts after the current end. A cursor the node cannot
// serve (compacted away, or beyond the end) gets an `event: error` and the
// stream ends; it never skips silently. Tenants see only their claims'
// events.
func (s *Server) handleEvents(w http.ResponseWriter, r *http.Request, id auth.Identity) error {
	switch r.URL.Query().Get("view") {
	case "", "log":
	case "vms":
		return s.handleVMView(w, r, id)
	default:
		return errorf(http.StatusBadRequest, "unknown view %q: want log or vms", r.URL.Query().Get("view"))
	}
	from, ok, err := sse.Cursor(r)
	if err != nil {
		return errorf(http.StatusBadRequest, "%v", err)
	}
	last := s.log.LastSeq()
	if !ok {
		from = last + 1
	}
	sw, err := sse.Start(w)
	if err != nil {
		return err
	}
	// The state is applied before its events are durable, so a cursor
	// taken from the state (GET /v1/info's log_seq + 1) may be ahead of the
	// durable end by the fsync in flight: such events are already numbered
	// and the subscription waits for them.
	s.eng.View(func(st *fsm.State) { last = max(last, st.Applied()) })
	if first := s.log.FirstSeq(); from < max(first, 1) || from > last+1 {
		msg := fmt.Sprintf("cursor %d is beyond the head of the log (last event %d); resume from at most %d", from, last, last+1)
		if from < first {
			msg = fmt.Sprintf("cursor %d is older than the retained log (first retained %d); resync from a snapshot or start at %d", from, first, first)
		}
		s.sseError(sw, msg, from)
		return nil
	}
	sub, err := s.log.Subscribe(from)
	if err != nil {
		s.sseError(sw, "subscribe: "+err.Error(), from)
		return nil
	}
	defer sub.Close()
	s.metrics.sseClients(1)
	defer s.metrics.sseClients(-1)
	for {
		ctx, cancel := context.WithTimeout(r.Context(), s.cfg.Heartbeat)
		ev, err := sub.Next(ctx)
		cancel()
		if err != nil {
			if r.Context().Err() != nil {
				return nil
			}
			if errors.Is(err, context.DeadlineExceeded) {
				_ = sw.SetWriteDeadline(time.Now().Add(writeTimeout))
				if sw.Comment("heartbeat") != nil {
					return nil
				}
				continue
			}
			s.sseError(sw, "stream ended: "+err.Error(), from)
			return nil
		}
		if lag := s.log.LastSeq() - ev.Seq; lag > s.cfg.MaxLag {
			s.sseError(sw, fmt.Sprintf("client fell %d events behind (limit %d); reconnect with Last-Event-ID to resume", lag, s.cfg.MaxLag), ev.Seq)
			return nil
		}
		from = ev.Seq + 1
		if id.Kind == auth.Tenant && !s.tenantSees(id.Tenant, &ev) {
			continue
		}
		data, _ := json.Marshal(EncodeEvent(&ev))
		_ = sw.SetWriteDeadline(time.Now().Add(writeTimeout))
		if err := sw.Event(strconv.FormatUint(ev.Seq, 10), ev.Type.String(), data); err != nil {
			return nil // client gone; it resumes by cursor
		}
	}
}

// sseError sends the explicit error event that ends a stream.
func (s *Server) sseError(sw *sse.Writer, msg string, cursor uint64) {
	data, _ := json.Marshal(map[string]any{"error": msg, "cursor": cursor})
	_ = sw.SetWriteDeadline(time.Now().Add(writeTimeout))
	_ = sw.Event("", "error", data)
}

// tenantSees reports whether a tenant may see ev: events about its own
// claims only.
func (s *Server) tenantSees(tenant string, ev *event.Event) bool {
	if ev.AggKind != event.AggClaim {
		return false
	}
	if ev.Type == event.TypeClaimCreated {
		var p struct {
			Tenant string `json:"tenant"`
		}
		return json.Unmarshal(ev.Payload, &p) == nil && p.Tenant == tenant
	}
	c, ok := s.claim(ev.AggID)
	return ok && c.Tenant == tenant
}
