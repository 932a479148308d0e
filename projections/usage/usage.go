// Package usage turns the op logs into usage.jsonl, the billing journal, with
// the old daemon's record shape {t, ev, id, vm, key, tenant, ...}: one record
// per usage-relevant event and one summary per sandbox (claim) when it ends.
//
// Records (ev), each keyed by the event that produced it (node, seq):
//
//	claim      a claim was created (any tier; tier says which)
//	serve      a clone or cold claim's VM became ready
//	hibernate  the VM was hibernated (its VMM stopped)
//	wake       the VM runs again
//	renew      the TTL was extended (ttl_s)
//	release    the owner released the claim
//	reap       the claim's deadline passed
//	fail       the claim failed (reason)
//	summary    the claim ended: start, end, end_ev, compute_s,
//	           hibernated_s, wall_s, hibernations
//	egress_bytes  what the sandbox's egress proxy moved over [start, end):
//	           tx (guest to destination) and rx payload bytes, allowed and
//	           denied decisions; final on its last one. One per sandbox per
//	           flush interval and one when its proxy closed, never one per
//	           request; the last may follow the summary, so a sandbox's
//	           egress is the sum of its egress_bytes records.
//
// Compute time runs from the moment the sandbox runs (claim for the warm
// tier, serve for clone and cold) to its end, minus every hibernate-to-wake
// interval (a sandbox ending while hibernated stops counting at hibernate).
// A claim that never ran has compute_s 0.
//
// Exactly once: records are keyed by event; the journal's high marks tell the
// feed which events are already written, and a summary lost to a crash
// between its event's records is written again at Open (Repair).
package usage

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/sbxlog/sbxlog/eventlog/event"
	"github.com/sbxlog/sbxlog/eventlog/replication/feed"
	"github.com/sbxlog/sbxlog/projections/journal"
)

// Record kinds.
const (
	EvClaim     = "claim"
	EvServe     = "serve"
	EvHibernate = "hibernate"
	EvWake      = "wake"
	EvRenew     = "renew"
	EvRelease   = "release"
	EvReap      = "reap"
	EvFail      = "fail"
	EvSummary   = "summary"
	EvEgress    = "egress_bytes"
)

// Record is one line of usage.jsonl.
type Record struct {
	T      string `json:"t"` // event time, RFC 3339 with nanoseconds, UTC
	Ev     string `json:"ev"`
	ID     string `json:"id"` // claim (sandbox) id
	VM     string `json:"vm,omitempty"`
	Key    string `json:"key,omitempty"` // pool key template/net/size
	Tenant string `json:"tenant,omitempty"`
	Node   string `json:"node"`
	Seq    uint64 `json:"seq"`
	Tier   string `json:"tier,omitempty"`
	Reason string `json:"reason,omitempty"`
	TTLS   int64  `json:"ttl_s,omitempty"`

	// Summary fields.
	Start        string   `json:"start,omitempty"`
	End          string   `json:"end,omitempty"`
	EndEv        string   `json:"end_ev,omitempty"`
	ComputeS     *float64 `json:"compute_s,omitempty"`
	HibernatedS  *float64 `json:"hibernated_s,omitempty"`
	WallS        *float64 `json:"wall_s,omitempty"`
	Hibernations int      `json:"hibernations,omitempty"`

	// egress_bytes fields (with start and end).
	Tx      int64 `json:"tx,omitempty"`
	Rx      int64 `json:"rx,omitempty"`
	Allowed int64 `json:"allowed,omitempty"`
	Denied  int64 `json:"denied,omitempty"`
	Final   bool  `json:"final,omitempty"`
}

// Sandbox is an open (not yet summarised) claim's accounting state.
type Sandbox struct {
	Node         string `json:"node"`
	ID           string `json:"id"`
	VM           string `json:"vm"`
	Key          string `json:"key"`
	Tenant       string `json:"tenant,omitempty"`
	Tier         string `json:"tier"`
	StartNS      int64  `json:"start_ns,omitempty"`     // 0 until it runs
	HibSinceNS   int64  `json:"hib_since_ns,omitempty"` // set while hibernated
	HibernatedNS int64  `json:"hibernated_ns,omitempty"`
	Hibernations int    `json:"hibernations,omitempty"`
	// Set once it ended; the summary is then due.
	EndNS  int64  `json:"end_ns,omitempty"`
	EndEv  string `json:"end_ev,omitempty"`
	EndSeq uint64 `json:"end_seq,omitempty"`
}

// Consumer is the usage feed handler. Not safe for concurrent use: the feed
// calls it from one goroutine.
type Consumer struct {
	j    *journal.Journal
	open map[string]*Sandbox // node + "/" + claim
	recs []journal.Record
}

var (
	_ feed.Handler = (*Consumer)(nil)
	_ feed.Lagging = (*Consumer)(nil)
)

// Options configure Open.
type Options struct {
	// CheckpointEvery is passed to the journal.
	CheckpointEvery int
}

// Open opens (creating) the journal at path, rebuilds the open sandboxes
// and writes any summary a crash lost.
func Open(path string, opts Options) (*Consumer, error) {
	c := &Consumer{open: map[string]*Sandbox{}}
	j, err := journal.Open(path, (*folder)(c), journal.Options{CheckpointEvery: opts.CheckpointEvery})
	if err != nil {
		return nil, fmt.Errorf("usage: %w", err)
	}
	c.j = j
	if err := c.repair(); err != nil {
		_ = j.Close()
		return nil, err
	}
	return c, nil
}

// repair writes the summaries of sandboxes whose end record is in the
// journal but whose summary is not (a crash between the two lines).
func (c *Consumer) repair() error {
	c.recs = c.recs[:0]
	for _, k := range slices.Sorted(maps.Keys(c.open)) {
		if sb := c.open[k]; sb.EndEv != "" {
			if err := c.summarise(k, sb); err != nil {
				return err
			}
		}
	}
	return c.j.Append(c.recs)
}

// Close checkpoints and closes the journal.
func (c *Consumer) Close() error { return c.j.Close() }

// Position implements feed.Handler.
func (c *Consumer) Position(node string) uint64 { return c.j.High(node) }

// PositionLags implements feed.Lagging: events that make no usage record
// leave Position where it was.
func (c *Consumer) PositionLags() bool { return true }

// Open returns the sandboxes not yet summarised, sorted by node and id.
func (c *Consumer) Open() []Sandbox {
	out := make([]Sandbox, 0, len(c.open))
	for _, k := range slices.Sorted(maps.Keys(c.open)) {
		out = append(out, *c.open[k])
	}
	return out
}

// Apply implements feed.Handler.
func (c *Consumer) Apply(_ context.Context, evs []event.Event) error {
	c.recs = c.recs[:0]
	for i := range evs {
		if err := c.apply(&evs[i]); err != nil {
			return err
		}
	}
	return c.j.Append(c.recs)
}

func stamp(ns int64) string { return time.Unix(0, ns).UTC().Format(time.RFC3339Nano) }

func parseStamp(s string) (int64, error) {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return 0, err
	}
	return t.UnixNano(), nil
}

// apply turns one event into records and updates the open sandboxes the way
// Fold will when it reads those records back.
func (c *Consumer) apply(ev *event.Event) error {
	switch ev.Type {
	case event.TypeClaimCreated, event.TypeClaimServed, event.TypeHibernated, event.TypeWoken,
		event.TypeClaimRenewed, event.TypeClaimReleased, event.TypeClaimExpired, event.TypeClaimFailed, event.TypeEgressUsage:
	default:
		return nil
	}
	p, err := ev.Decode()
	if err != nil {
		return fmt.Errorf("usage: node %s seq %d: %w", ev.Node, ev.Seq, err)
	}
	r := Record{T: stamp(ev.Time), Node: ev.Node, Seq: ev.Seq}
	switch p := p.(type) {
	case event.ClaimCreated:
		r.Ev, r.ID, r.VM, r.Key, r.Tenant, r.Tier, r.TTLS = EvClaim, p.Claim, p.VM, p.Key.String(), p.Tenant, p.Tier, p.TTLSeconds
	case event.ClaimServed:
		r.Ev, r.ID, r.VM = EvServe, p.Claim, p.VM
	case event.Hibernated:
		r.Ev, r.ID, r.VM = EvHibernate, p.Claim, p.VM
	case event.Woken:
		r.Ev, r.ID, r.VM = EvWake, p.Claim, p.VM
	case event.ClaimRenewed:
		r.Ev, r.ID, r.TTLS = EvRenew, p.Claim, p.TTLSeconds
	case event.ClaimReleased:
		r.Ev, r.ID, r.VM = EvRelease, p.Claim, p.VM
	case event.ClaimExpired:
		r.Ev, r.ID, r.VM = EvReap, p.Claim, p.VM
	case event.ClaimFailed:
		r.Ev, r.ID, r.VM, r.Reason = EvFail, p.Claim, p.VM, p.Reason
	case event.EgressUsage:
		r.Ev, r.ID, r.Tenant, r.Start, r.End = EvEgress, p.Claim, p.Tenant, stamp(p.FromNS), stamp(p.ToNS)
		r.Tx, r.Rx, r.Allowed, r.Denied, r.Final = p.Tx, p.Rx, p.Allowed, p.Denied, p.Final
		if p.Key != nil {
			r.Key = p.Key.String()
		}
	}
	key := ev.Node + "/" + r.ID
	sb := c.open[key]
	if sb == nil && r.Ev == EvEgress {
		// Egress is billed whether or not this journal saw the claim
		// (its final record may follow the summary).
		return c.add(r)
	}
	if sb == nil && r.Ev != EvClaim {
		// A claim this journal never saw created (it was summarised, or its
		// creation precedes the journal): nothing to account.
		return nil
	}
	if sb != nil {
		// Fill what the event does not carry, for readers of single lines.
		r.Key, r.Tenant = sb.Key, sb.Tenant
		if r.VM == "" {
			r.VM = sb.VM
		}
	}
	if err := c.add(r); err != nil {
		return err
	}
	if sb := c.open[key]; sb != nil && sb.EndEv != "" {
		return c.summarise(key, sb)
	}
	return nil
}

// add queues r for the journal and folds it into the open sandboxes.
func (c *Consumer) add(r Record) error {
	line, err := json.Marshal(r)
	if err != nil {
		return fmt.Errorf("usage: %w", err)
	}
	c.recs = append(c.recs, journal.Record{Node: r.Node, Seq: r.Seq, Line: line})
	return c.fold(&r)
}

// summarise queues the summary of an ended sandbox.
func (c *Consumer) summarise(key string, sb *Sandbox) error {
	var compute, hib int64
	if sb.StartNS != 0 {
		hib = sb.HibernatedNS
		if sb.HibSinceNS != 0 {
			hib += sb.EndNS - sb.HibSinceNS
		}
		compute = sb.EndNS - sb.StartNS - hib
	}
	secs := func(ns int64) *float64 { s := float64(ns) / 1e9; return &s }
	r := Record{T: stamp(sb.EndNS), Ev: EvSummary, ID: sb.ID, VM: sb.VM, Key: sb.Key, Tenant: sb.Tenant,
		Node: sb.Node, Seq: sb.EndSeq, Tier: sb.Tier, End: stamp(sb.EndNS), EndEv: sb.EndEv,
		ComputeS: secs(compute), HibernatedS: secs(hib), Hibernations: sb.Hibernations}
	if sb.StartNS != 0 {
		r.Start = stamp(sb.StartNS)
		r.WallS = secs(sb.EndNS - sb.StartNS)
	} else {
		r.WallS = secs(0)
	}
	return c.add(r)
}

// fold applies one record to the open sandboxes: the single definition of
// the accounting, used live (add) and when reading the journal back (Fold).
func (c *Consumer) fold(r *Record) error {
	key := r.Node + "/" + r.ID
	ns, err := parseStamp(r.T)
	if err != nil {
		return fmt.Errorf("usage: record %s/%d: bad time %q", r.Node, r.Seq, r.T)
	}
	if r.Ev == EvClaim {
		sb := &Sandbox{Node: r.Node, ID: r.ID, VM: r.VM, Key: r.Key, Tenant: r.Tenant, Tier: r.Tier}
		if r.Tier == "warm" {
			sb.StartNS = ns
		}
		c.open[key] = sb
		return nil
	}
	sb := c.open[key]
	if sb == nil {
		return nil
	}
	switch r.Ev {
	case EvServe:
		if sb.StartNS == 0 {
			sb.StartNS = ns
		}
		sb.VM = r.VM
	case EvHibernate:
		if sb.HibSinceNS == 0 {
			sb.HibSinceNS = ns
			sb.Hibernations++
		}
	case EvWake:
		if sb.HibSinceNS != 0 {
			sb.HibernatedNS += ns - sb.HibSinceNS
			sb.HibSinceNS = 0
		}
	case EvRelease, EvReap, EvFail:
		sb.EndNS, sb.EndEv, sb.EndSeq = ns, r.Ev, r.Seq
	case EvSummary:
		delete(c.open, key)
	}
	return nil
}

// folder adapts Consumer to journal.Folder.
type folder Consumer

func (f *folder) Restore(state json.RawMessage) error {
	if state == nil {
		return nil
	}
	var open []*Sandbox
	if err := json.Unmarshal(state, &open); err != nil {
		return err
	}
	for _, sb := range open {
		f.open[sb.Node+"/"+sb.ID] = sb
	}
	return nil
}

func (f *folder) Fold(line []byte) error {
	var r Record
	if err := json.Unmarshal(line, &r); err != nil {
		return err
	}
	return (*Consumer)(f).fold(&r)
}

func (f *folder) Checkpoint() (json.RawMessage, error) {
	open := make([]*Sandbox, 0, len(f.open))
	for _, k := range slices.Sorted(maps.Keys(f.open)) {
		open = append(open, f.open[k])
	}
	return json.Marshal(open)
}

// Run opens the journal at path, feeds it from the stream through fo's
// durable consumer (fo.Durable, e.g. "usage-<node>"; fo.Nodes to limit it)
// until ctx ends or the feed fails, and closes the journal.
func Run(ctx context.Context, path string, fo feed.Options) error {
	c, err := Open(path, Options{})
	if err != nil {
		return err
	}
	f, err := feed.New(fo, c)
	if err != nil {
		return errors.Join(err, c.Close())
	}
	return errors.Join(f.Run(ctx), c.Close())
}
