// Package audit turns the op logs into audit.jsonl: one record per event,
// keyed by (node, seq), so a restarted consumer never writes one twice.
//
// An API action (or a timer) is a command: its op has no cause, and its
// first record is the action itself (claim_created, hibernate_requested,
// pools_configured...), followed by what the state machine decided with it.
// An executor's side effect is reported by events whose cause is the op id
// of the intent they answer (vm_cloned, hibernated, vm_destroyed, and the
// *_failed ones); their records have source "effect". The records of one op
// share "op", so `jq 'select(.op == "...")'` gathers an action.
package audit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/sbxlog/sbxlog/eventlog/event"
	"github.com/sbxlog/sbxlog/eventlog/replication/feed"
	"github.com/sbxlog/sbxlog/projections/journal"
)

// Sources.
const (
	SourceCommand = "command" // an API call or a timer
	SourceEffect  = "effect"  // an executor reporting a side effect
)

// Record is one line of audit.jsonl.
type Record struct {
	T      string          `json:"t"` // event time, RFC 3339 with nanoseconds, UTC
	Node   string          `json:"node"`
	Seq    uint64          `json:"seq"`
	Ev     string          `json:"ev"` // event type name
	Source string          `json:"source"`
	Agg    string          `json:"agg"` // aggregate kind
	ID     string          `json:"id"`  // aggregate id
	Op     string          `json:"op"`
	Cause  string          `json:"cause,omitempty"`
	Data   json.RawMessage `json:"data,omitempty"` // the payload
	// DecodeError is set (and Data left empty) when this build cannot
	// decode the payload: the record still says that the event happened.
	DecodeError string `json:"decode_error,omitempty"`
}

// Consumer is the audit feed handler.
type Consumer struct {
	j    *journal.Journal
	recs []journal.Record
}

var _ feed.Handler = (*Consumer)(nil)

// Open opens (creating) the journal at path.
func Open(path string) (*Consumer, error) {
	j, err := journal.Open(path, stateless{}, journal.Options{})
	if err != nil {
		return nil, fmt.Errorf("audit: %w", err)
	}
	return &Consumer{j: j}, nil
}

// Close checkpoints and closes the journal.
func (c *Consumer) Close() error { return c.j.Close() }

// Position implements feed.Handler.
func (c *Consumer) Position(node string) uint64 { return c.j.High(node) }

// Apply implements feed.Handler.
func (c *Consumer) Apply(_ context.Context, evs []event.Event) error {
	c.recs = c.recs[:0]
	for i := range evs {
		line, err := json.Marshal(Build(&evs[i]))
		if err != nil {
			return fmt.Errorf("audit: %w", err)
		}
		c.recs = append(c.recs, journal.Record{Node: evs[i].Node, Seq: evs[i].Seq, Line: line})
	}
	return c.j.Append(c.recs)
}

// Build returns ev's audit record.
func Build(ev *event.Event) Record {
	r := Record{
		T:      time.Unix(0, ev.Time).UTC().Format(time.RFC3339Nano),
		Node:   ev.Node,
		Seq:    ev.Seq,
		Ev:     ev.Type.String(),
		Source: SourceCommand,
		Agg:    ev.AggKind.String(),
		ID:     ev.AggID,
		Op:     ev.OpID.String(),
	}
	if ev.Causation != event.ZeroOpID {
		r.Source, r.Cause = SourceEffect, ev.Causation.String()
	}
	// Decode and re-encode rather than copy the bytes: the record shows the
	// payload as this build understands it, whatever its stored version.
	p, err := ev.Decode()
	if err == nil {
		r.Data, err = json.Marshal(p)
	}
	if err != nil {
		r.Data, r.DecodeError = nil, err.Error()
	}
	return r
}

// Run opens the journal at path, feeds it from the stream through fo's
// durable consumer (fo.Durable, e.g. "audit-<node>") until ctx ends or the
// feed fails, and closes the journal.
func Run(ctx context.Context, path string, fo feed.Options) error {
	c, err := Open(path)
	if err != nil {
		return err
	}
	f, err := feed.New(fo, c)
	if err != nil {
		return errors.Join(err, c.Close())
	}
	return errors.Join(f.Run(ctx), c.Close())
}

// stateless is the journal.Folder of a consumer whose only state is the
// journal's own high marks.
type stateless struct{}

func (stateless) Restore(json.RawMessage) error        { return nil }
func (stateless) Fold([]byte) error                    { return nil }
func (stateless) Checkpoint() (json.RawMessage, error) { return nil, nil }
